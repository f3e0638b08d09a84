"""What a training step reads: the batch of step s is a function of (seed, step) alone, so every
variant sees exactly the same sequences in the same order and a resumed run continues bit-exactly.

Training tasks (`TrainConfig.task`):
- `lm`: random windows of the training text (language modelling), every prediction weighted 1.
- a retrieval task (relbench/tasks: `passkey`, `mqar`, ...): every sequence is one of its trials
  drawn from training text by the task's `batch` (a generator seeded by seed and step), its answers
  weighted `answer_weight` and the rest of the text `text_weight` (0: answers only; the random tokens
  of a task, such as MQAR's pair block, 0). With `depth_curriculum` = N, step s < N draws from the
  easiest conditions [1 - s/N, 1] (passkey and MQAR: the key near the question first), then from all.

`retrieval_accuracy` is a retrieval task's accuracy on a fixed set of validation trials, for training
to a criterion.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from relbench.config import TrainConfig
from relbench.errors import RelbenchError
from relbench.positions.base import sorted_draw
from relbench.tasks import retrieval_task

VALIDATION_SEED = 12345                          # of the fixed validation trials of the retrieval tasks


def _seeded(seed: int, step: int) -> int:
    return seed * 1_000_003 + step


def lm_batch(tokens: torch.Tensor, step: int, seed: int, batch_size: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets (B, L) of training step `step`: random windows of length L + 1, drawn
    from a generator seeded by (seed, step) so any step's batch can be recomputed."""
    generator = torch.Generator().manual_seed(_seeded(seed, step))
    starts = torch.randint(0, tokens.numel() - length, (batch_size,), generator=generator)  # (B,), last: numel-L-1
    window = tokens[starts[:, None] + torch.arange(length + 1)].long()                         # (B, L + 1)
    return window[:, :-1], window[:, 1:]


def _lowest_depth(step: int, config: TrainConfig) -> float:
    """The depth curriculum: at step s < N the statement is drawn from depths [1 - s/N, 1]."""
    return max(0.0, 1.0 - step / config.depth_curriculum) if config.depth_curriculum else 0.0


def random_positions(seed: int, step: int, count: int, length: int, limit: int) -> torch.Tensor:
    """(count, length) int64 positions of step `step`'s sequences under randomized positions (Ruoss et
    al. 2023): each row a sorted random subset of [0, limit) drawn without replacement, from a
    generator seeded by (seed, step) like the batch itself (another stream than the batch's), so a
    resumed training draws the same."""
    generator = torch.Generator().manual_seed(_seeded(seed, step) ^ POSITIONS_STREAM)
    rows = [sorted_draw(generator, length, limit) for _ in range(count)]
    return torch.stack(rows)


POSITIONS_STREAM = 0x5EED_0F_905   # separates the positions' generator from the batch's of the same step


def training_batch(tokens: torch.Tensor, step: int, config: TrainConfig, length: int,
                   tokenizer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(inputs, targets, weights or None) of step `step` for the configured task."""
    if config.task == "lm":
        x, y = lm_batch(tokens, step, config.seed, config.batch_size, length)
        return x, y, None
    task = retrieval_task(config.task)
    rng = np.random.default_rng(_seeded(config.seed, step))
    return task.batch(tokens.numpy(), rng, config.batch_size, length, tokenizer, task.options(asdict(config)),
                      config.answer_weight, config.text_weight, _lowest_depth(step, config))


def validation_batches(tokens: torch.Tensor, config: TrainConfig, length: int,
                       tokenizer) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """Fixed validation batches for the configured task, each (inputs, targets, loss weights or
    None), (B, L) each: windows spread evenly over the validation split, or a retrieval task's trials
    on validation text (a fixed seed)."""
    count = config.eval_batches * config.batch_size
    if config.task == "lm":
        last = tokens.numel() - length - 1
        if last < 0:
            raise RelbenchError(f"the validation split ({tokens.numel()} tokens) is shorter than one training "
                                f"window ({length + 1}); use a shorter --train-length or a larger dataset")
        starts = torch.linspace(0, last, count).long()
        windows = tokens[starts[:, None] + torch.arange(length + 1)].long()
        return [(w[:, :-1], w[:, 1:], None) for w in windows.split(config.batch_size)]
    task = retrieval_task(config.task)
    x, y, w = task.batch(tokens.numpy(), np.random.default_rng(VALIDATION_SEED), count, length, tokenizer,
                         task.options(asdict(config)), config.answer_weight, config.text_weight, 0.0)
    return list(zip(x.split(config.batch_size), y.split(config.batch_size), w.split(config.batch_size)))


def retrieval_accuracy(model, task: str, tokens, length: int, tokenizer, device, trials: int = 50,
                       options: Mapping[str, Any] | None = None) -> float:
    """Accuracy of the retrieval task `task` at `length` on a fixed, seeded set of trials from
    `tokens` (the validation split): trials // (its conditions) at each of its conditions (passkey:
    five depths), the fraction of its answers that are right (passkey: trials answered exactly; mqar:
    queries; a task that weighs its conditions: the mean of each condition's fraction). `options`: the
    task's generator options (its defaults when None). The model is left in the mode (train or eval) it
    was in."""
    chosen = retrieval_task(task)
    options = chosen.options({}) if options is None else options
    stream = tokens.numpy() if isinstance(tokens, torch.Tensor) else np.asarray(tokens)
    per_value = max(1, trials // len(chosen.axis_values))
    was_training = model.training
    try:
        plan = chosen.trials(stream.size, length, list(chosen.axis_values), per_value, tokenizer, options)
        return chosen.score(chosen.answers(model, stream, plan, length, tokenizer, device, 16384, options), per_value)
    finally:
        model.train(was_training)
