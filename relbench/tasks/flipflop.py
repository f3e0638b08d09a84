"""Flip-flop language modelling (Liu, Ash, Goel, Krishnamurthy and Zhang 2023, "Exposing Attention
Glitches with Flip-Flop Language Modeling", arXiv 2306.00946): a one-bit register driven by
instructions, each followed by a bit.

    w 1 i 0 i 1 r 1 i 0 w 0 i 1 i 1 r 0 ...
    write 1 --------'        write 0 ----'     a read's bit is the bit of the last write

`w` writes its bit to the register, `i` ignores its bit (a distractor), `r` reads: its bit is the
register's. FFL(p_i): the first instruction is `w`, the last `r`, every other one `i` with probability
p_i and `w` or `r` with (1 - p_i) / 2 each; every `w` and `i` bit a fair coin. The paper's defaults
(its Section 3; the official data, huggingface.co/datasets/synthseq/flipflop, has the splits train and
val at p_i = 0.8, val_sparse at 0.98 and val_dense at 0.1; its generator code was not read here):
train on FFL(0.8) with sequences of 512 tokens; test in distribution (0.8), on the sparse tail (0.98:
long stretches of ignores, reads far from their write) and the dense tail (0.1: a read every few
tokens). relbench keeps p_i = 0.8 for training (`task_options = {p_ignore = ...}` changes it) and
evaluates the three as the task's condition (`p_ignore`), at every length: a trial at length L has
L // 2 instruction-bit pairs, after one leading space (two for an odd L) so that its L + 1 tokens end
in the last read's bit.

The answers are the reads' bits: the prediction at each `r` must be the last write's bit (a greedy
argmax over the whole vocabulary, one forward pass per batch; the other bits are coin flips, nothing
to predict). Every read is an answer, binned by its distance: tokens from the last `w` before it to
the `r` (2 or more). The paper's finding: Transformers make rare errors on the sparse tail, *attention
glitches*, that grow with the distance, where a 1-layer LSTM makes none.

Tokens: the five symbols `w`, `r`, `i`, `0`, `1` and the space, each one token (bytes, or a byte-level
BPE: the characters are the tokenizer's own). The task draws no text: `stream` is not read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from relbench.errors import RelbenchError, UsageError
from relbench.tasks.base import Answer, RetrievalTask, register_task, teacher_forced

SYMBOLS = "wri01 "
TRAIN_P_IGNORE = 0.8           # the paper's training distribution, FFL(0.8)
CONDITIONS = (0.1, 0.8, 0.98)  # dense, in distribution, sparse: the paper's three test distributions


@dataclass(frozen=True)
class Trial:
    p_ignore: float      # FFL(p_i)
    seed: int            # the trial's own generator: instructions and bits are a function of it alone


def symbols(tokenizer) -> dict[str, int]:
    """The token of each symbol; one line when the tokenizer does not keep one of them whole."""
    out = {}
    for char in SYMBOLS:
        token = np.asarray(tokenizer.encode(char))
        if token.size != 1:
            raise UsageError(f"tokenizer {tokenizer.name} does not encode {char!r} as one token, which the flip-flop "
                             f"task needs; use bytes or a byte-level BPE")
        out[char] = int(token[0])
    return out


def program(trial: Trial, pairs: int) -> tuple[np.ndarray, np.ndarray]:
    """(pairs,) instructions (0 write, 1 read, 2 ignore) and (pairs,) bits of FFL(p_ignore): the first
    a write, the last a read, each read's bit the last write's."""
    if pairs < 2:
        raise UsageError(f"a flip-flop trial needs at least 2 instruction pairs (a write and a read), got {pairs}")
    rng = np.random.default_rng(trial.seed)
    ops = rng.choice(3, pairs, p=[(1 - trial.p_ignore) / 2, (1 - trial.p_ignore) / 2, trial.p_ignore])
    ops[0], ops[-1] = 0, 1
    bits = rng.integers(0, 2, pairs)
    writes = np.where(ops == 0, np.arange(pairs), 0)
    last_write = np.maximum.accumulate(writes)                 # the index of the last write at or before each pair
    bits = np.where(ops == 1, bits[last_write], bits)
    return ops, bits


def sequence(trial: Trial, length: int, tokenizer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(length + 1,) tokens: inputs are the first `length`, targets the last `length`; the target
    positions of the reads' bits (the input index of each `r`); and each read's distance from the last
    write, in tokens."""
    table = symbols(tokenizer)
    pairs = length // 2
    pad = length + 1 - 2 * pairs
    ops, bits = program(trial, pairs)
    letters = np.asarray([table["w"], table["r"], table["i"]])[ops]
    values = np.asarray([table["0"], table["1"]])[bits]
    tokens = np.concatenate([np.full(pad, table[" "]), np.stack([letters, values], 1).reshape(-1)]).astype(np.int64)
    reads = np.flatnonzero(ops == 1)
    last_write = np.maximum.accumulate(np.where(ops == 0, np.arange(pairs), 0))
    return tokens, pad + 2 * reads, 2 * (reads - last_write[reads])


def min_length() -> int:
    """A write and a read, after the leading space."""
    return 4


def trials(values: list[float], per_value: int, seed: int = 0) -> list[Trial]:
    """A fixed, seeded set of trials: `per_value` for each p_ignore in `values`, the same for every
    variant (a trial is its own seed: its program at each length is drawn from it)."""
    generator = np.random.default_rng(seed)
    return [Trial(float(p), int(generator.integers(0, 2**63))) for p in values for _ in range(per_value)]


def accuracy(model, trial_list: list[Trial], length: int, tokenizer, device, max_batch_tokens: int = 16384) -> list[Answer]:
    """One Answer per read of every trial, trial by trial, with its distance from the last write."""
    return teacher_forced(model, trial_list, lambda t: sequence(t, length, tokenizer), length, device,
                          max_batch_tokens)


@dataclass(frozen=True)
class FlipFlop(RetrievalTask):
    """Every read is an answer, binned by its distance from the last write."""

    def check(self, options):
        value = options["p_ignore"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise UsageError(f"task_options.p_ignore must be in [0, 1), got {options['p_ignore']}")

    def min_length(self, tokenizer, options):
        return min_length()

    def trials(self, stream_size, length, values, per_value, tokenizer, options, seed=0):
        return trials(values, per_value, seed)

    def answers(self, model, stream, plan, length, tokenizer, device, max_batch_tokens, options):
        return accuracy(model, plan, length, tokenizer, device, max_batch_tokens)

    def batch(self, stream, rng, count, length, tokenizer, options, answer_weight, text_weight, lowest):
        """Trials of FFL(p_ignore) (the curriculum `lowest` does not apply: a flip-flop has no depth)."""
        if length < min_length():
            raise RelbenchError(f"flip-flop training needs sequences of at least {min_length()} tokens")
        drawn = [sequence(Trial(float(options["p_ignore"]), int(rng.integers(0, 2**63))), length, tokenizer)
                 for _ in range(count)]
        tokens = torch.from_numpy(np.stack([tokens for tokens, _, _ in drawn]))
        weights = torch.full((count, length), float(text_weight))
        for row, (_, reads, _) in enumerate(drawn):
            weights[row, torch.from_numpy(reads)] = float(answer_weight)
        return tokens[:, :-1], tokens[:, 1:], weights


TASK = register_task(FlipFlop("flipflop", "flipflop.csv", ("variant", "seed", "length", "p_ignore", "trials"), "flipflop",
                              "flip-flop accuracy on the reads at a length and p_ignore, per distance bin from the last "
                              "write, with its Wilson interval", label="Flip-flop", short="flip-flop", axis="p_ignore",
                              axis_values=CONDITIONS, binned=True, place_label="distance write -> read (bin from)",
                              weigh_conditions=True,
                              defaults={"p_ignore": TRAIN_P_IGNORE}))
