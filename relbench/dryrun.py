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
