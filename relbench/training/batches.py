"""What a training step reads: the batch of step s is a function of (seed, step) alone, so every
variant sees exactly the same sequences in the same order and a resumed run continues bit-exactly.

Three training tasks (`TrainConfig.task`):
- `lm`: random windows of the training text (language modelling), every prediction weighted 1.
- `passkey`: every sequence is a passkey trial built from training text (relbench/tasks/passkey.py):
  a random key stated once at a random depth and asked for at the end. The five answer digits are
  weighted `answer_weight` and every other prediction `text_weight` (0: train on the answers alone).
  With `depth_curriculum` = N, the key is drawn from depths [1 - s/N, 1] at step s < N (near the
  question first), then from [0, 1].
- `mqar`: every sequence is a multi-query associative recall trial built from training text
  (relbench/tasks/mqar.py): `mqar_pairs` key-value pairs at a random depth (the same curriculum),
  each key asked for at the end. The value after each query key is weighted `answer_weight`, the
  filler's predictions `text_weight`, and the predictions of the random tokens (the pair block and
  the query keys) 0.

`retrieval_accuracy` is the accuracy of either retrieval task on a fixed set of validation trials,
for training to a criterion.
"""

from __future__ import annotations

import numpy as np
import torch

from relbench.config import TrainConfig
from relbench.errors import RelbenchError, unknown
from relbench.positions.base import sorted_draw
from relbench.tasks import mqar, passkey

RETRIEVAL_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)   # of the fixed trials retrieval_accuracy scores
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


def mqar_sequences(tokens: np.ndarray, rng: np.random.Generator, count: int, length: int, tokenizer,
                   n_pairs: int, lowest_depth: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, list[mqar.Trial]]:
    """Inputs and targets (count, length) of mqar trials with random pairs, depths in
    [lowest_depth, 1] and filler offsets (the queried values are targets, never inputs:
    mqar.model_inputs), and the trials."""
    if length < mqar.min_length(n_pairs):
        raise RelbenchError(f"mqar training with {n_pairs} pairs needs sequences of at least "
                            f"{mqar.min_length(n_pairs)} tokens; use a longer --train-length or fewer mqar_pairs")
    room = length + 1 - 4 * n_pairs
    rows, asked, drawn = [], [], []
    for _ in range(count):
        depth = float(lowest_depth + (1 - lowest_depth) * rng.random())
        trial = mqar.draw(rng, n_pairs, tokenizer.vocab_size, depth, int(rng.integers(0, max(1, tokens.size - room))))
        sequence, queries, _ = mqar.sequence(tokens, trial, length, tokenizer)
        rows.append(sequence)
        asked.append(queries)
        drawn.append(trial)
    sequences = np.stack(rows)
    inputs = mqar.model_inputs(sequences, np.stack(asked), mqar.filler_token(tokenizer))
    return torch.from_numpy(inputs), torch.from_numpy(sequences[:, 1:].copy()), drawn


def mqar_weights(trial_list: list[mqar.Trial], length: int, config: TrainConfig) -> torch.Tensor:
    """(count, L) loss weights of mqar trials: `answer_weight` at the values after query keys,
    `text_weight` at filler, 0 where the target is a pair-block token or a query key (random)."""
    w = torch.full((len(trial_list), length), float(config.text_weight))
    for row, trial in enumerate(trial_list):
        n = len(trial.keys)
        start, query = mqar.layout(length, n, trial.depth)
        w[row, max(0, start - 1): start - 1 + 2 * n] = 0.0     # targets: the pair block's tokens
        w[row, query - 1::2] = 0.0                               # targets: the query keys
        w[row, query::2] = float(config.answer_weight)           # targets: the queried values
    return w


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
    rng = np.random.default_rng(_seeded(config.seed, step))
    lowest = _lowest_depth(step, config)
    if config.task == "mqar":
        x, y, drawn = mqar_sequences(tokens.numpy(), rng, config.batch_size, length, tokenizer, config.mqar_pairs, lowest)
        return x, y, mqar_weights(drawn, length, config)
    sequences, answer = passkey_sequences(tokens.numpy(), rng, config.batch_size, length, tokenizer, lowest)
    window = torch.from_numpy(sequences)
    return window[:, :-1], window[:, 1:], weights(length, answer, config, config.batch_size)


def validation_batches(tokens: torch.Tensor, config: TrainConfig, length: int,
                       tokenizer) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """Fixed validation batches for the configured task, each (inputs, targets, loss weights or
    None), (B, L) each: windows spread evenly over the validation split, or passkey or mqar trials
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
    rng = np.random.default_rng(VALIDATION_SEED)
    if config.task == "mqar":
        x, y, drawn = mqar_sequences(tokens.numpy(), rng, count, length, tokenizer, config.mqar_pairs)
        w = mqar_weights(drawn, length, config)
    else:
        sequences, answer = passkey_sequences(tokens.numpy(), rng, count, length, tokenizer)
        windows = torch.from_numpy(sequences)
        x, y, w = windows[:, :-1], windows[:, 1:], weights(length, answer, config, count)
    return list(zip(x.split(config.batch_size), y.split(config.batch_size), w.split(config.batch_size)))


def retrieval_accuracy(model, task: str, tokens, length: int, tokenizer, device, trials: int = 50,
                       n_pairs: int = 4) -> float:
    """Accuracy of `task` ("passkey" or "mqar") at `length` on a fixed, seeded set of trials from
    `tokens` (the validation split): trials // 5 at each of RETRIEVAL_DEPTHS. Passkey: the fraction
    of trials answered exactly; mqar (`n_pairs` pairs): the fraction of queries. The model is left
    in the mode (train or eval) it was in."""
    stream = tokens.numpy() if isinstance(tokens, torch.Tensor) else np.asarray(tokens)
    per_depth = max(1, trials // len(RETRIEVAL_DEPTHS))
    was_training = model.training
    try:
        if task == "passkey":
            plan = passkey.trials(stream.size, length, list(RETRIEVAL_DEPTHS), per_depth)
            return float(np.mean(passkey.accuracy(model, stream, plan, length, tokenizer, device)))
        if task == "mqar":
            plan = mqar.trials(stream.size, length, list(RETRIEVAL_DEPTHS), per_depth, n_pairs,
                               vocab_size=tokenizer.vocab_size)
            return float(np.mean([a.correct for a in mqar.accuracy(model, stream, plan, length, tokenizer, device)]))
        raise unknown("retrieval task", task, ["passkey", "mqar"])
    finally:
        model.train(was_training)
