"""What a training step reads: the batch of step s is a function of (seed, step) alone, so every
variant sees exactly the same sequences in the same order and a resumed run continues bit-exactly.

Two training tasks (`TrainConfig.task`):
- `lm`: random windows of the training text (language modelling), every prediction weighted 1.
- `passkey`: every sequence is a passkey trial built from training text (relbench/tasks/passkey.py):
  a random key stated once at a random depth and asked for at the end. The five answer digits are
  weighted `answer_weight` and every other prediction `text_weight` (0: train on the answers alone).
  With `depth_curriculum` = N, the key is drawn from depths [1 - s/N, 1] at step s < N (near the
  question first), then from [0, 1].
"""

from __future__ import annotations

import numpy as np
import torch

from relbench.config import TrainConfig
from relbench.errors import RelbenchError
from relbench.tasks import passkey

TASKS = ("lm", "passkey")


def _seeded(seed: int, step: int) -> int:
    return seed * 1_000_003 + step


def lm_batch(tokens: torch.Tensor, step: int, seed: int, batch_size: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets (B, L) of training step `step`: random windows of length L + 1, drawn
    from a generator seeded by (seed, step) so any step's batch can be recomputed."""
    generator = torch.Generator().manual_seed(_seeded(seed, step))
    starts = torch.randint(0, tokens.numel() - length, (batch_size,), generator=generator)  # (B,), last: numel-L-1
    window = tokens[starts[:, None] + torch.arange(length + 1)].long()                         # (B, L + 1)
    return window[:, :-1], window[:, 1:]


def passkey_sequences(tokens: np.ndarray, rng: np.random.Generator, count: int, length: int, tokenizer,
                      lowest_depth: float = 0.0) -> tuple[np.ndarray, slice]:
    """(count, length + 1) passkey trials with random keys, depths in [lowest_depth, 1] and filler
    offsets, and the slice of target positions that hold the answer."""
    room = length + 1 - passkey.min_length(tokenizer)
    if room < 0:
        raise RelbenchError(f"passkey training needs sequences of at least {passkey.min_length(tokenizer)} tokens; "
                            f"use a longer --train-length")
    rows, answer = [], slice(0, 0)
    for _ in range(count):
        key = "".join(str(d) for d in rng.integers(0, 10, passkey.DIGITS))
        depth = float(lowest_depth + (1 - lowest_depth) * rng.random())
        trial = passkey.Trial(key, depth, int(rng.integers(0, max(1, tokens.size - room))))
        sequence, answer = passkey.sequence(tokens, trial, length, tokenizer)
        rows.append(sequence)
    return np.stack(rows), answer


def weights(length: int, answer: slice, config: TrainConfig, count: int) -> torch.Tensor:
    """(count, L) loss weights: the answer's predictions and the rest, as the config says."""
    w = torch.full((count, length), float(config.text_weight))
    w[:, answer] = float(config.answer_weight)
    return w


def training_batch(tokens: torch.Tensor, step: int, config: TrainConfig, length: int,
                   tokenizer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(inputs, targets, weights or None) of step `step` for the configured task."""
    if config.task == "lm":
        x, y = lm_batch(tokens, step, config.seed, config.batch_size, length)
        return x, y, None
    rng = np.random.default_rng(_seeded(config.seed, step))
    lowest = max(0.0, 1.0 - step / config.depth_curriculum) if config.depth_curriculum else 0.0
    sequences, answer = passkey_sequences(tokens.numpy(), rng, config.batch_size, length, tokenizer, lowest)
    window = torch.from_numpy(sequences)
    return window[:, :-1], window[:, 1:], weights(length, answer, config, config.batch_size)


def validation_batches(tokens: torch.Tensor, config: TrainConfig, length: int,
                       tokenizer) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Fixed (B, L + 1) validation windows (and their loss weights) for the configured task: windows
    spread evenly over the validation split, or passkey trials on validation text (a fixed seed)."""
    count = config.eval_batches * config.batch_size
    if config.task == "lm":
        last = tokens.numel() - length - 1
        if last < 0:
            raise RelbenchError(f"the validation split ({tokens.numel()} tokens) is shorter than one training "
                                f"window ({length + 1}); use a shorter --train-length or a larger dataset")
        starts = torch.linspace(0, last, count).long()
        windows = tokens[starts[:, None] + torch.arange(length + 1)].long()
        return [(w, None) for w in windows.split(config.batch_size)]
    sequences, answer = passkey_sequences(tokens.numpy(), np.random.default_rng(12345), count, length, tokenizer)
    windows, w = torch.from_numpy(sequences), weights(length, answer, config, count)
    return list(zip(windows.split(config.batch_size), w.split(config.batch_size)))
