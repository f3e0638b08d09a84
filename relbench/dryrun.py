"""`relbench train --dry-run`: what a training run would cost, from a few measured steps, without
training, loading the corpus or writing anything.

Per variant: parameters, the training memory estimate (relbench.memory.training_bytes, the figure
the memory check uses) and the seconds per step measured over DRY_STEPS real optimiser steps (after
one warm-up step) on random tokens of the run's shape: the cost of a step does not depend on the
tokens. The projected wall time is the sum over variants of seconds per step x steps x seeds.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from relbench import memory
from relbench.config import Experiment
from relbench.errors import RelbenchError, UsageError
from relbench.model import GPT
from relbench.train import forward_backward, make_optimizer, optimizer_step, position_lr

DRY_STEPS = 3


def measure(spec: str, exp: Experiment, device: torch.device, steps: int = DRY_STEPS) -> dict[str, Any]:
    """One variant's parameters, memory estimate and measured seconds per training step."""
    model_config = dataclasses.replace(exp.model, position=spec, attention=exp.train.attention)
    config = dataclasses.replace(exp.train, position_lr_scale=position_lr(spec, exp.train)[0])
    model = GPT(model_config, seed=config.seed).to(device)
    model.train()
    optimizer = make_optimizer(model, config)
    generator = torch.Generator().manual_seed(config.seed)
    window = torch.randint(0, model_config.vocab_size, (config.batch_size, model_config.train_length + 1),
                           generator=generator).to(device)
    times = []
    for _ in range(steps + 1):                  # the first step (allocation, kernel choice) is not timed
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        forward_backward(model, optimizer, window[:, :-1], window[:, 1:], None, device, config, 0)
        optimizer_step(model, optimizer)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
    seconds = sorted(times[1:])[len(times[1:]) // 2]   # the median step
    return {"variant": spec, "params": model.n_params(), "position_params": model.n_params(positions_only=True),
            "memory_bytes": memory.training_bytes(model_config, config.batch_size, config.precision),
            "seconds_per_step": seconds}


def human_time(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def plan_vocabulary(exp: Experiment, console) -> None:
    """Set the model's vocabulary to the tokenizer's without a corpus (relbench.data.tokenizer.
    planned_vocab_size); a hub tokenizer out of reach leaves the configured one, with a note."""
    from relbench.data.tokenizer import planned_vocab_size

    try:
        exp.model.vocab_size = planned_vocab_size(exp.data.tokenizer)
    except UsageError:
        raise
    except RelbenchError as error:
        console.print(f"note: {error}; assuming the configured vocabulary of {exp.model.vocab_size:,}", markup=False)


def report(exp: Experiment, specs: list[str], seeds: list[int], device: torch.device, console) -> None:
    """Measure every variant and print the table and the projected wall time."""
    from relbench.report import rich_table

    m, t = exp.model, exp.train
    tokens = t.steps * t.batch_size * m.train_length
    console.print(f"dry run of preset {exp.preset}: {m.n_layers} layers, d {m.d_model}, {m.n_heads} heads, vocabulary "
                  f"{m.vocab_size:,}, length {m.train_length}; {t.steps:,} steps x {t.batch_size} sequences = "
                  f"{tokens:,} tokens per run, {len(specs)} variant(s) x {len(seeds)} seed(s), {t.precision} on "
                  f"{device}; measuring {DRY_STEPS} steps per variant after a warm-up step")
    rows, total = [], 0.0
    for spec in specs:
        row = measure(spec, exp, device)
        projected = row["seconds_per_step"] * t.steps * len(seeds)
        total += projected
        rows.append([spec, f"{row['params']:,}", f"{row['position_params']:,}", memory.human(row["memory_bytes"]),
                     f"{row['seconds_per_step']:.3f}", f"{tokens / t.steps / row['seconds_per_step']:,.0f}",
                     human_time(projected)])
    console.print(rich_table("Dry run (nothing trained or written)", ["variant", "params", "position", "memory",
                                                                       "s/step", "tok/s", "projected"], rows))
    console.print(f"projected: {human_time(total)} of training for {len(specs) * len(seeds)} run(s) on {device}, "
                  f"from steps measured on this machine now", markup=False)
