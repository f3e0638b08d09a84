"""Passkey retrieval (Mohtashami and Jaggi 2023, "Landmark Attention"): a random 5-digit key stated
once inside filler text, asked for at the end. The model answers by greedy decoding; a trial counts
when all five digits are right.

    ... filler ... The pass key is 71432. Remember it. 71432 is the pass key. ... filler ...
    What is the pass key? The pass key is 71432

The statement sits at a chosen depth of the window (0: at its start, 1: right before the
question). Filler is real text from the split being used (the test split for evaluation, the train
split for the retrieval preset's training), so the model reads the kind of text it was trained on.
Greedy decoding of the digits is exact match of the teacher-forced argmax at the five answer
positions (a wrong digit is where greedy decoding would first leave the key), so one forward pass
scores a trial.

Any tokenizer: the fixed phrases are encoded by the tokenizer, and the key one token per digit (a
byte-level tokenizer has every single byte as a token), so whatever the key, a trial has the same
layout and the answer is DIGITS tokens. With byte tokens this is exactly the text's bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from relbench.errors import RelbenchError, UsageError
from relbench.tasks.base import Answer, RetrievalTask, register_task, spread

STATEMENT = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = " What is the pass key? The pass key is "
DIGITS = 5


@dataclass(frozen=True)
class Trial:
    key: str            # DIGITS digits
    depth: float        # where the statement starts, as a fraction of the filler (0 .. 1)
    filler_start: int   # offset of the filler in the token stream


def encode(text: str, tokenizer) -> np.ndarray:
    return np.asarray(tokenizer.encode(text), dtype=np.int64)


def digits(key: str, tokenizer) -> np.ndarray:
    """(len(key),) tokens of `key`, one per digit."""
    tokens = [encode(digit, tokenizer) for digit in key]
    if any(t.size != 1 for t in tokens):
        raise UsageError(f"tokenizer {tokenizer.name} does not encode each digit as one token, which the passkey "
                         f"task needs; use bytes or a byte-level BPE")
    return np.concatenate(tokens)


def with_key(template: str, key: str, tokenizer) -> np.ndarray:
    """`template` with `key` for each {key}: the text around it encoded, the key by digits()."""
    pieces = template.split("{key}")
    parts = [encode(pieces[0], tokenizer)]
    for piece in pieces[1:]:
        parts += [digits(key, tokenizer), encode(piece, tokenizer)]
    return np.concatenate(parts)


def sequence(stream: np.ndarray, trial: Trial, length: int, tokenizer) -> tuple[np.ndarray, slice]:
    """(length + 1,) tokens: inputs are the first `length`, targets the last `length`; and the slice
    of target positions that hold the answer's digits (the same for every key)."""
    statement = with_key(STATEMENT, trial.key, tokenizer)
    question = encode(QUESTION, tokenizer)
    answer = digits(trial.key, tokenizer)
    room = length + 1 - len(statement) - len(question) - len(answer)
    if room < 0:
        raise UsageError(f"passkey needs windows of at least {length - room} tokens, got {length}")
    filler = stream[trial.filler_start: trial.filler_start + room].astype(np.int64)
    at = int(round(trial.depth * room))  # noqa: RUF046  (numpy floats round to floats)
    tokens = np.concatenate([filler[:at], statement, filler[at:], question, answer])
    return tokens, slice(length - len(answer), length)


def min_length(tokenizer) -> int:
    """Tokens of a trial without filler (the same for every key)."""
    key = "0" * DIGITS
    return len(with_key(STATEMENT, key, tokenizer)) + len(encode(QUESTION, tokenizer)) + len(digits(key, tokenizer))


def trials(stream_size: int, length: int, depths: list[float], per_depth: int, seed: int = 0) -> list[Trial]:
    """A fixed, seeded set of trials: for each depth, `per_depth` keys and filler offsets spread over
    the stream (the same for every variant, as they depend on nothing else)."""
    generator = np.random.default_rng(seed)
    out = []
    for depth in depths:
        for start in spread(stream_size, length, per_depth):
            key = "".join(str(d) for d in generator.integers(0, 10, DIGITS))
            out.append(Trial(key, float(depth), start))
    return out


@torch.no_grad()
def accuracy(model, stream: np.ndarray, trial_list: list[Trial], length: int, tokenizer, device,
             max_batch_tokens: int = 16384) -> list[bool]:
    """Whether the model's greedy answer equals the key, per trial."""
    model.eval()
    out = []
    per_batch = max(1, max_batch_tokens // length)
    for b in range(0, len(trial_list), per_batch):
        batch = [sequence(stream, t, length, tokenizer) for t in trial_list[b: b + per_batch]]
        tokens = torch.from_numpy(np.stack([tokens for tokens, _ in batch])).to(device)       # (B, length + 1)
        answer = batch[0][1]
        logits = model(tokens[:, :-1])[:, answer]                                         # (B, DIGITS, V)
        out += (logits.argmax(-1) == tokens[:, 1:][:, answer]).all(-1).tolist()
    return out


def training_sequences(tokens: np.ndarray, rng: np.random.Generator, count: int, length: int, tokenizer,
                       lowest_depth: float = 0.0) -> tuple[np.ndarray, slice]:
    """(count, length + 1) passkey trials with random keys, depths in [lowest_depth, 1] and filler
    offsets, and the slice of target positions that hold the answer."""
    room = length + 1 - min_length(tokenizer)
    if room < 0:
        raise RelbenchError(f"passkey training needs sequences of at least {min_length(tokenizer)} tokens; "
                         f"use a longer --train-length")
    rows, answer = [], slice(0, 0)
    for _ in range(count):
        key = "".join(str(d) for d in rng.integers(0, 10, DIGITS))
        depth = float(lowest_depth + (1 - lowest_depth) * rng.random())
        trial = Trial(key, depth, int(rng.integers(0, max(1, tokens.size - room))))
        tokens_of_trial, answer = sequence(tokens, trial, length, tokenizer)
        rows.append(tokens_of_trial)
    return np.stack(rows), answer


@dataclass(frozen=True)
class Passkey(RetrievalTask):
    """One trial is one answer (all five digits right); a row per length x depth pools its trials."""

    def min_length(self, tokenizer, options):
        return min_length(tokenizer)

    def trials(self, stream_size, length, values, per_value, tokenizer, options, seed=0):
        return trials(stream_size, length, values, per_value, seed)

    def answers(self, model, stream, plan, length, tokenizer, device, max_batch_tokens, options):
        return [Answer(i, None, ok) for i, ok in enumerate(accuracy(model, stream, plan, length, tokenizer, device,
                                                                    max_batch_tokens))]

    def batch(self, stream, rng, count, length, tokenizer, options, answer_weight, text_weight, lowest):
        sequences, answer = training_sequences(stream, rng, count, length, tokenizer, lowest)
        window = torch.from_numpy(sequences)
        weights = torch.full((count, length), float(text_weight))
        weights[:, answer] = float(answer_weight)
        return window[:, :-1], window[:, 1:], weights


TASK = register_task(Passkey("passkey", "passkey.csv", ("variant", "seed", "length", "depth", "trials"), "passkey",
                             "passkey accuracy at a length and depth, with its Wilson interval", label="Passkey",
                             short="passkey"))
