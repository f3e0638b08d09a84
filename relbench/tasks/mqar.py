"""Multi-query associative recall (Arora et al. 2023, "Zoology: Measuring and Improving Recall in
Efficient Language Models"): `n_pairs` key-value pairs stated once as a block inside filler text,
then every key asked for once, in a random order, at the end of the window.

    ... filler ... k1 v1 k2 v2 k3 v3 k4 v4 ... filler ... k3 v3 k1 v1 k4 v4 k2 v2
                   '----- pair block -----'                '---- query block ----'

The pair block sits at a chosen depth of the filler (0: at the window's start, 1: right before the
query block); the query block always ends the window. Each query's value is the target of the
prediction made at its key, and never an input: the model reads the space in its place
(`model_inputs`), as in Zoology's generator, where the query keys stand alone. With the value as the
next input (teacher forcing, this module's first layout) a later query could see which values had
been asked already, and models settled on answering with a value of the pair block not yet asked,
without binding any key to its value: 1/(n - i) at the i-th of n queries, 34% over 8 pairs
(results/retrieval/README.md, "MQAR"). A query is correct when the argmax at its key is its value,
so one forward pass scores every query of a trial. Only those predictions are answers: the pair
block and the query keys are random, unpredictable tokens.

Alphabet: for a vocabulary of V tokens the task owns the upper half [V/2, V): keys are
[V/2, V/2 + V/4) and values [V/2 + V/4, V), two disjoint sets (keys distinct within a trial, values
drawn with replacement). Filler is real text of the split being used (like passkey), with every
token of the upper half replaced by the tokenizer's space, so key and value tokens occur only in the
pair block and the queries. With bytes the alphabet is the non-ASCII bytes 128..255 (64 keys, 64
values), which English text hardly uses; with a BPE the upper half are the later merges.

Distances: a query's distance is its key's position minus the position of the same key in the pair
block. Reports bin them by powers of two, [1, 2), [2, 4), [4, 8), ... (distance_bin).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from relbench.errors import RelbenchError, UsageError
from relbench.tasks.base import Answer, RetrievalTask, distance_bin, register_task, spread  # noqa: F401


@dataclass(frozen=True)
class Trial:
    keys: tuple[int, ...]     # (n_pairs,) distinct key tokens, in pair-block order
    values: tuple[int, ...]   # (n_pairs,) value tokens, values[j] belongs to keys[j]
    order: tuple[int, ...]    # (n_pairs,) the pairs in the order they are asked for (a permutation)
    depth: float              # where the pair block starts, as a fraction of the filler (0 .. 1)
    filler_start: int         # offset of the filler in the token stream


def alphabet(vocab_size: int) -> tuple[range, range]:
    """The key tokens [V/2, V/2 + V/4) and the value tokens [V/2 + V/4, V) of a vocabulary of V."""
    half, quarter = vocab_size // 2, vocab_size // 4
    return range(half, half + quarter), range(half + quarter, vocab_size)


def check_pairs(n_pairs: int, vocab_size: int) -> None:
    keys, _ = alphabet(vocab_size)
    if not 1 <= n_pairs <= len(keys):
        raise UsageError(f"mqar needs 1 to {len(keys)} pairs (distinct keys from a quarter of the vocabulary of "
                         f"{vocab_size}), got {n_pairs}; set mqar_pairs in that range")


def min_length(n_pairs: int) -> int:
    """The shortest window (inputs) that holds a trial without filler: the pair block and the query
    block are 2 * n_pairs tokens each, and the last value is a target, not an input."""
    return 4 * n_pairs - 1


def layout(length: int, n_pairs: int, depth: float) -> tuple[int, int]:
    """(start of the pair block, start of the query block) as indices of the length + 1 tokens."""
    room = length + 1 - 4 * n_pairs           # filler tokens
    if room < 0:
        raise UsageError(f"mqar with {n_pairs} pairs needs windows of at least {min_length(n_pairs)} tokens, got "
                         f"{length}; use longer windows or fewer pairs")
    return int(round(depth * room)), room + 2 * n_pairs  # noqa: RUF046  (numpy floats round to floats)


def filler_token(tokenizer) -> int:
    """The token that stands in for filler tokens of the task's alphabet: the tokenizer's space."""
    space = np.asarray(tokenizer.encode(" "))
    if space.size != 1 or int(space[0]) >= tokenizer.vocab_size // 2:
        raise UsageError(f"tokenizer {tokenizer.name} does not encode a space as one token below half its vocabulary, "
                         f"which mqar's filler needs; use bytes or a byte-level BPE")
    return int(space[0])


def clean(filler: np.ndarray, vocab_size: int, space: int) -> np.ndarray:
    """`filler` with every token of the task's alphabet (the upper half) replaced by `space`."""
    return np.where(filler >= vocab_size // 2, space, filler).astype(np.int64)


def sequence(stream: np.ndarray, trial: Trial, length: int, tokenizer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(length + 1,) tokens: inputs are the first `length`, targets the last `length`; the (n_pairs,)
    target positions that hold the queried values, in query order; and the (n_pairs,) distance of
    each query key from its key in the pair block."""
    n = len(trial.keys)
    keys, values = alphabet(tokenizer.vocab_size)
    if not all(k in keys for k in trial.keys) or not all(v in values for v in trial.values):
        raise UsageError(f"the trial's keys and values are not in the alphabet of a vocabulary of "
                         f"{tokenizer.vocab_size} (trials drawn for another vocabulary size?)")
    start, query = layout(length, n, trial.depth)
    room = length + 1 - 4 * n
    filler = stream[trial.filler_start: trial.filler_start + room]
    if filler.size < room:
        raise UsageError(f"the text has too few tokens after offset {trial.filler_start} for {room} tokens of mqar filler")
    filler = clean(filler, tokenizer.vocab_size, filler_token(tokenizer))
    pairs = np.stack([trial.keys, trial.values], 1).reshape(-1)                         # (2n,) k1 v1 k2 v2 ...
    order = np.asarray(trial.order)
    queries = np.stack([pairs[2 * order], pairs[2 * order + 1]], 1).reshape(-1)       # (2n,) in query order
    tokens = np.concatenate([filler[:start], pairs, filler[start:], queries]).astype(np.int64)
    asked = query + 2 * np.arange(n)                       # token index of each query key
    # the value after query key t is token t + 1, i.e. target position t
    return tokens, asked, asked - (start + 2 * order)


def draw(rng: np.random.Generator, n_pairs: int, vocab_size: int, depth: float, filler_start: int) -> Trial:
    """A random trial: distinct keys, values with replacement, the pairs asked for in a random order."""
    check_pairs(n_pairs, vocab_size)
    keys, values = alphabet(vocab_size)
    chosen = rng.choice(len(keys), n_pairs, replace=False)
    picked = rng.integers(0, len(values), n_pairs)
    return Trial(tuple(keys.start + int(k) for k in chosen), tuple(values.start + int(v) for v in picked),
                 tuple(int(i) for i in rng.permutation(n_pairs)), float(depth), int(filler_start))


def model_inputs(tokens: np.ndarray, asked: np.ndarray, space: int) -> np.ndarray:
    """The (..., length) inputs of trials' (..., length + 1) tokens, each queried value (the token
    after a query key in `asked`) replaced by `space`: a value is a target, never an input. The
    targets are the tokens themselves, shifted: `tokens[..., 1:]`."""
    out = np.array(tokens[..., :-1], dtype=np.int64)
    after = np.asarray(asked) + 1
    inside = after < out.shape[-1]                       # the last value is a target only
    if out.ndim == 1:
        out[after[inside]] = space
    else:
        rows = np.broadcast_to(np.arange(out.shape[0])[:, None], after.shape)
        out[rows[inside], after[inside]] = space
    return out


def trials(stream_size: int, length: int, depths: list[float], per_depth: int, n_pairs: int, seed: int = 0,
           vocab_size: int = 256) -> list[Trial]:
    """A fixed, seeded set of trials: for each depth, `per_depth` trials with filler offsets spread
    over the stream (the same for every variant, as they depend on nothing else). `vocab_size` is
    the tokenizer's (the alphabet's); sequence() refuses trials drawn for another one."""
    generator = np.random.default_rng(seed)
    out = []
    for depth in depths:
        out += [draw(generator, n_pairs, vocab_size, depth, start) for start in spread(stream_size, length, per_depth)]
    return out


@torch.no_grad()
def accuracy(model, stream: np.ndarray, trial_list: list[Trial], length: int, tokenizer, device,
             max_batch_tokens: int = 16384) -> list[Answer]:
    """One Answer per query of every trial (trial by trial, in query order): its distance is the
    tokens from the key in the pair block to the query key, correct whether the argmax at the query
    key is its value."""
    model.eval()
    out = []
    per_batch = max(1, max_batch_tokens // length)
    for b in range(0, len(trial_list), per_batch):
        batch = [sequence(stream, t, length, tokenizer) for t in trial_list[b: b + per_batch]]
        tokens = np.stack([tokens for tokens, _, _ in batch])                                # (B, length + 1)
        asked = np.stack([a for _, a, _ in batch])                                           # (B, n)
        inputs = torch.from_numpy(model_inputs(tokens, asked, filler_token(tokenizer))).to(device)
        asked_t = torch.from_numpy(asked).to(device)
        predicted = model(inputs).argmax(-1).gather(1, asked_t)                            # (B, n)
        correct = (predicted == torch.from_numpy(tokens[:, 1:]).to(device).gather(1, asked_t)).tolist()
        for i, (_, _, distances) in enumerate(batch):
            out += [Answer(b + i, int(d), bool(c)) for d, c in zip(distances, correct[i])]
    return out


def training_sequences(tokens: np.ndarray, rng: np.random.Generator, count: int, length: int, tokenizer,
                       n_pairs: int, lowest_depth: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, list[Trial]]:
    """Inputs and targets (count, length) of mqar trials with random pairs, depths in
    [lowest_depth, 1] and filler offsets (the queried values are targets, never inputs:
    model_inputs), and the trials."""
    if length < min_length(n_pairs):
        raise RelbenchError(f"mqar training with {n_pairs} pairs needs sequences of at least "
                            f"{min_length(n_pairs)} tokens; use a longer --train-length or fewer mqar_pairs")
    room = length + 1 - 4 * n_pairs
    rows, asked, drawn = [], [], []
    for _ in range(count):
        depth = float(lowest_depth + (1 - lowest_depth) * rng.random())
        trial = draw(rng, n_pairs, tokenizer.vocab_size, depth, int(rng.integers(0, max(1, tokens.size - room))))
        tokens_of_trial, queries, _ = sequence(tokens, trial, length, tokenizer)
        rows.append(tokens_of_trial)
        asked.append(queries)
        drawn.append(trial)
    sequences = np.stack(rows)
    inputs = model_inputs(sequences, np.stack(asked), filler_token(tokenizer))
    return torch.from_numpy(inputs), torch.from_numpy(sequences[:, 1:].copy()), drawn


def loss_weights(trial_list: list[Trial], length: int, answer_weight: float, text_weight: float) -> torch.Tensor:
    """(count, L) loss weights of mqar trials: `answer_weight` at the values after query keys,
    `text_weight` at filler, 0 where the target is a pair-block token or a query key (random)."""
    w = torch.full((len(trial_list), length), float(text_weight))
    for row, trial in enumerate(trial_list):
        n = len(trial.keys)
        start, query = layout(length, n, trial.depth)
        w[row, max(0, start - 1): start - 1 + 2 * n] = 0.0     # targets: the pair block's tokens
        w[row, query - 1::2] = 0.0                               # targets: the query keys
        w[row, query::2] = float(answer_weight)                  # targets: the queried values
    return w


@dataclass(frozen=True)
class Mqar(RetrievalTask):
    """Every query is an answer, binned by its distance; the option `pairs` is [train]'s mqar_pairs."""

    def options(self, train):
        return {**super().options(train),
                "pairs": int(train.get("mqar_pairs", 4)) if train.get("task") == self.name else 4}

    def columns(self, options):
        return {"n_pairs": options["pairs"]}

    def min_length(self, tokenizer, options):
        return min_length(options["pairs"])

    def trials(self, stream_size, length, values, per_value, tokenizer, options, seed=0):
        return trials(stream_size, length, values, per_value, options["pairs"], seed, vocab_size=tokenizer.vocab_size)

    def answers(self, model, stream, plan, length, tokenizer, device, max_batch_tokens, options):
        return accuracy(model, stream, plan, length, tokenizer, device, max_batch_tokens)

    def batch(self, stream, rng, count, length, tokenizer, options, answer_weight, text_weight, lowest):
        x, y, drawn = training_sequences(stream, rng, count, length, tokenizer, options["pairs"], lowest)
        return x, y, loss_weights(drawn, length, answer_weight, text_weight)


# a depth's rows (every distance bin) go together
TASK = register_task(Mqar("mqar", "mqar.csv", ("variant", "seed", "length", "depth", "trials", "n_pairs"), "mqar",
                          "mqar accuracy at a length and depth, per distance bin, with its Wilson interval",
                          label="MQAR", short="MQAR", binned=True, place_label="distance pair -> query (bin from)"))
