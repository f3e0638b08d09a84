"""`relbench train --dry-run`: what a training run would cost, from a few measured steps, without
training, loading the corpus or writing anything.

Per variant: parameters, the training memory estimate (relbench.cost.memory.training_bytes, the
figure the memory check uses), whether it fits the device (and if not, the largest --batch-size that
does), and the seconds per step, measured over DRY_STEPS real optimiser steps (after one warm-up
step) on random tokens of the run's shape: the cost of a step does not depend on the tokens.

Steps are timed at a micro-batch, not necessarily the configured batch: the largest batch that fits
in half the memory budget (so that the dry run never needs what the run would), made smaller again
when a warm-up step of one sequence says that a step of it would take over MICRO_STEP_SECONDS (and
when even one sequence takes longer, one step is timed instead of DRY_STEPS). A step
costs in proportion to its sequences (every matrix product and every attention row scales with the
batch), so the time of the configured batch is the micro-batch's time x batch / micro-batch; the
table says which micro-batch was timed. The projected wall time is the sum over variants of seconds
per step x steps x seeds.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from relbench.config import Experiment
from relbench.cost import memory
from relbench.errors import RelbenchError, UsageError
from relbench.model import GPT
from relbench.training.step import forward_backward, make_optimizer, optimizer_step, position_lr

DRY_STEPS = 3
MICRO_STEP_SECONDS = 4.0    # a timed step of the micro-batch takes at most about this long


def micro_batch(model_config, config, device: torch.device, one_step_seconds: float) -> int:
    """The batch the dry run times (see the module doc)."""
    have = memory.budget(device)
    fits = config.batch_size if have is None else memory.largest_batch(model_config, config.precision, have // 2,
                                                                         config.batch_size)
    quick = max(1, int(MICRO_STEP_SECONDS / max(one_step_seconds, 1e-9)))
    return max(1, min(config.batch_size, fits, quick))


def _step(model, optimizer, window, device, config) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    forward_backward(model, optimizer, window[:, :-1], window[:, 1:], None, device, config, 0)
    optimizer_step(model, optimizer)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def measure(spec: str, exp: Experiment, device: torch.device, steps: int = DRY_STEPS) -> dict[str, Any]:
    """One variant's parameters, memory estimate, the largest batch that fits, and the seconds per
    training step at the configured batch, timed at a micro-batch (see the module doc)."""
    model_config = dataclasses.replace(exp.model, position=spec, attention=exp.train.attention)
    config = dataclasses.replace(exp.train, position_lr_scale=position_lr(spec, exp.train)[0])
    model = GPT(model_config, seed=config.seed).to(device)
    model.train()
    optimizer = make_optimizer(model, config)
    generator = torch.Generator().manual_seed(config.seed)

    def window(batch: int) -> torch.Tensor:
        return torch.randint(0, model_config.vocab_size, (batch, model_config.train_length + 1),
                             generator=generator).to(device)

    first = _step(model, optimizer, window(1), device, config)   # warm-up (allocation, kernel choice), not timed
    micro = micro_batch(model_config, config, device, first)
    rows = window(micro)
    if micro > 1:
        _step(model, optimizer, rows, device, config)            # warm-up at the timed shape
    steps = 1 if first > MICRO_STEP_SECONDS else steps    # one sequence is already slow: one timed step is enough
    times = sorted(_step(model, optimizer, rows, device, config) for _ in range(steps))
    have = memory.budget(device)
    need = memory.training_bytes(model_config, config.batch_size, config.precision)
    fits = None if have is None or need <= have else memory.largest_batch(model_config, config.precision, have,
                                                                          config.batch_size)
    return {"variant": spec, "params": model.n_params(), "position_params": model.n_params(positions_only=True),
            "memory_bytes": need, "fits_batch": fits, "micro_batch": micro,
            "seconds_per_step": times[len(times) // 2] * config.batch_size / micro}


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
    from relbench.reporting.report import rich_table

    m, t = exp.model, exp.train
    tokens = t.steps * t.batch_size * m.train_length
    console.print(f"dry run of preset {exp.preset}: {m.n_layers} layers, d {m.d_model}, {m.n_heads} heads, vocabulary "
                  f"{m.vocab_size:,}, length {m.train_length}; {t.steps:,} steps x {t.batch_size} sequences = "
                  f"{tokens:,} tokens per run, {len(specs)} variant(s) x {len(seeds)} seed(s), {t.precision} on "
                  f"{device}; timing {DRY_STEPS} steps per variant at a micro-batch after a warm-up step, scaled to "
                  f"the batch of {t.batch_size} (x batch / micro-batch)")
    rows, total = [], 0.0
    for spec in specs:
        row = measure(spec, exp, device)
        projected = row["seconds_per_step"] * t.steps * len(seeds)
        total += projected
        fits = ("yes" if row["fits_batch"] is None else f"no ({row['fits_batch']})" if row["fits_batch"] else "no (0)")
        rows.append([spec, f"{row['params']:,}", f"{row['position_params']:,}", memory.human(row["memory_bytes"]),
                     fits, str(row["micro_batch"]), f"{row['seconds_per_step']:.3f}",
                     f"{tokens / t.steps / row['seconds_per_step']:,.0f}", human_time(projected)])
    console.print(rich_table("Dry run (nothing trained or written)", ["variant", "params", "position", "memory",
                                                                       "fits", "timed", "s/step", "tok/s",
                                                                       "projected"], rows))
    console.print("memory: the estimated peak of a step; fits: whether it fits this device (in brackets, the largest "
                  "--batch-size that does); timed: the micro-batch the steps were timed at, scaled to the batch",
                  markup=False)
    console.print(f"projected: {human_time(total)} of training for {len(specs) * len(seeds)} run(s) on {device}, "
                  f"from steps measured on this machine now", markup=False)
