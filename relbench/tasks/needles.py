"""Multi-key needle in a haystack (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your
Long-Context Language Models?", arXiv 2404.06654, its multi-key NIAH, "niah_multikey"): 1 + k
needles of one form, each with its own key and a random value, inside filler text, and a question at
the end that asks for one key's value. The k other needles are hard distractors: they read exactly
like the one asked for, only their keys differ, so a model that finds "a needle" without matching its
key fails. k, the number of distractors, is the task's axis.

    ... filler ... QX=417. ... filler ... BM=902. ... filler ... LT=038. ... filler ... QX? QX=417
                   '-----'               '-----'               '-----'                 '----'---'
                   needle asked for      distractor            distractor              question answer

A needle is " {name}={value}." and the question " {name}? {name}=", followed by the answer: the asked
needle's value, teacher-forced. The paper's needles are English sentences (roughly "One of the special
magic numbers for {key} is: {value}.") with word keys and multi-digit values, made for windows of
thousands of tokens; relbench trains at 64-128 byte tokens (the mqar preset's 64, the needles preset's
128), so the form here is as short as keeps it a statement and a question. Its official code (github.com/NVIDIA/RULER)
was not read here; the parameters below are this module's choices:

- keys: 2-letter codes of upper-case consonants (NAMES, 400 of them; distinct within a trial, so no
  distractor shares the key asked for), which real text hardly spells followed by "=";
- values: `digits` digits (option, default 3), one token per digit (as passkey's key), distinct within
  a trial, so a model that answers with a distractor's value is wrong whatever the draw; option
  `distinct` (default false): every digit of a value but its last is one no other value of the trial
  has but as its last, so the digit before each answer digit stands in the asked needle alone (a
  model that reads a digit by the one token before it, as results/tasks' attempts N6-N7 found, is
  not misled by another needle), 2 or more digits and at most 10 // (digits - 1) needles;
- distractors: 0, 1, 3 or 5 (AXIS): 3 is the paper's four-key setting as we recall it, and 5 the most
  whose trial still fits 64 byte tokens. Shortest windows with bytes and 3 digits (8 tokens a
  needle, 8 the question, 3 the answer, minus the last target): 18, 26, 42 and 58 tokens.
  `min_length` is the window of the MOST distractors of AXIS: a length either runs every condition
  or none (a row of each says "unsupported").

Every needle goes at its own seeded random depth of the filler (a fraction: 0 its start, 1 right
before the question; needles at the same point follow each other in the order drawn). Filler is real
text of the split being used, as passkey's. A trial counts when every digit of the answer is the
argmax of the prediction made before it (greedy decoding's first departure would be a wrong digit), so
one forward pass scores a batch of trials.

Distances: a trial is one answer (one query) whose distance is the tokens from the first token of the
asked needle (its leading space) to the first token of the question: question start - needle start,
at least one needle's length. Rows bin by it in powers of two (base.distance_bin). In the example,
if " QX=417." starts at token 5 and " QX? QX=" at token 50, the distance is 45, bin [32, 64).

The trials (`trials`) are fixed by the seed and depend on no model, so every variant sees the same;
they hold depths, not token positions, so the same trials lay out at any length and `trials` never
refuses a length (the evaluator draws them before it skips a length too short: evaluators.py,
value_rows). Laying one out (`sequence`, hence `answers`) at a length too short raises a one-line
UsageError naming the length needed; `batch` a RelbenchError.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from relbench.errors import RelbenchError, UsageError
from relbench.tasks.base import Answer, RetrievalTask, register_task, spread, teacher_forced

NEEDLE = " {name}={value}."
QUESTION = " {name}? {name}="
CONSONANTS = "BCDFGHJKLMNPQRSTVWXZ"
NAMES = tuple(a + b for a in CONSONANTS for b in CONSONANTS)   # the keys: "BB", "BC", ..., "ZZ"
AXIS = (0, 1, 3, 5)                                           # distractors: needles beside the one asked for
DIGITS = 3                                                    # default digits of a value
MAX_DIGITS = 9


@dataclass(frozen=True)
class Trial:
    names: tuple[str, ...]     # (1 + k,) distinct keys, in window order
    values: tuple[str, ...]    # (1 + k,) distinct values of `digits` digits; values[j] is stated with names[j]
    depths: tuple[float, ...]  # (1 + k,) nondecreasing: where needle j goes, as a fraction of the filler (0 .. 1)
    asked: int                 # the needle the question asks for (an index of names)
    filler_start: int          # offset of the filler in the token stream

    @property
    def distractors(self) -> int:
        return len(self.names) - 1


def encode(text: str, tokenizer) -> np.ndarray:
    return np.asarray(tokenizer.encode(text), dtype=np.int64)


def digits(value: str, tokenizer) -> np.ndarray:
    """(len(value),) tokens of `value`, one per digit."""
    tokens = [encode(digit, tokenizer) for digit in value]
    if any(t.size != 1 for t in tokens):
        raise UsageError(f"tokenizer {tokenizer.name} does not encode each digit as one token, which the needles "
                         f"task needs; use bytes or a byte-level BPE")
    return np.concatenate(tokens)


def needle(name: str, value: str, tokenizer) -> np.ndarray:
    """The tokens of one needle: the text around the value encoded, the value by digits()."""
    head, tail = NEEDLE.split("{value}")
    return np.concatenate([encode(head.format(name=name), tokenizer), digits(value, tokenizer),
                           encode(tail, tokenizer)])


def question(name: str, tokenizer) -> np.ndarray:
    return encode(QUESTION.format(name=name), tokenizer)


def shortest(distractors: int, n_digits: int, tokenizer) -> int:
    """The shortest window (inputs) that holds a trial with `distractors` and no filler, whatever its
    keys: 1 + distractors of the longest needle, the longest question and the answer, less the last
    answer token (a target, not an input)."""
    value = "0" * n_digits
    longest_needle = max(len(needle(name, value, tokenizer)) for name in NAMES)
    longest_question = max(len(question(name, tokenizer)) for name in NAMES)
    return (1 + distractors) * longest_needle + longest_question + n_digits - 1


def parts_of(trial: Trial, tokenizer) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """The tokens of a trial's needles (in window order), its question and its answer."""
    pieces = [needle(n, v, tokenizer) for n, v in zip(trial.names, trial.values)]
    return pieces, question(trial.names[trial.asked], tokenizer), digits(trial.values[trial.asked], tokenizer)


def filler_size(trial: Trial, length: int, tokenizer) -> int:
    """The tokens of filler a window of `length` leaves the trial (negative: it does not fit)."""
    pieces, asked, answer = parts_of(trial, tokenizer)
    return length + 1 - sum(len(p) for p in pieces) - len(asked) - len(answer)


def sequence(stream: np.ndarray, trial: Trial, length: int, tokenizer) -> tuple[np.ndarray, slice, int]:
    """(length + 1,) tokens: inputs are the first `length`, targets the last `length`; the slice of
    target positions that hold the answer's digits (the last ones); and the distance from the asked
    needle's first token to the question's first token."""
    pieces, asked, answer = parts_of(trial, tokenizer)
    room = length + 1 - sum(len(p) for p in pieces) - len(asked) - len(answer)
    if room < 0:
        raise UsageError(f"needles with {trial.distractors} distractors needs windows of at least {length - room} "
                         f"tokens, got {length}")
    filler = stream[trial.filler_start: trial.filler_start + room].astype(np.int64)
    if filler.size < room:
        raise UsageError(f"the text has too few tokens after offset {trial.filler_start} for {room} tokens of "
                         f"needles filler")
    at = [int(round(d * room)) for d in trial.depths]  # noqa: RUF046  (numpy floats round to floats)
    parts, starts, last, placed = [], [], 0, 0
    for point, piece in zip(at, pieces):
        parts += [filler[last:point], piece]
        starts.append(point + placed)                     # filler before it, and the needles before it
        last, placed = point, placed + len(piece)
    parts += [filler[last:], asked, answer]
    tokens = np.concatenate(parts)
    question_start = room + placed
    return tokens, slice(length - len(answer), length), question_start - starts[trial.asked]


def check_distinct(n_digits: int, count: int) -> None:
    """values_of's distinct leading digits fit: 2 or more digits, and (n_digits - 1) * count <= 10."""
    if n_digits < 2 or (n_digits - 1) * count > 10:
        raise UsageError(f"needles with distinct digits needs 2 or more digits and (digits - 1) x needles <= 10, got "
                         f"{n_digits} digits and {count} needles")


def values_of(rng: np.random.Generator, count: int, n_digits: int, distinct: bool) -> list[str]:
    """`count` distinct values of `n_digits` digits; `distinct`: every digit of a value but its last
    one that no other value has but as its last (so the digit before each digit of the answer stands
    in the asked needle alone), which needs (n_digits - 1) * count <= 10."""
    if not distinct:
        return [f"{int(v):0{n_digits}d}" for v in rng.choice(10 ** n_digits, count, replace=False)]
    check_distinct(n_digits, count)
    leads = rng.choice(10, (n_digits - 1) * count, replace=False).reshape(count, n_digits - 1)
    lasts = rng.integers(10, size=count)
    return ["".join(str(int(d)) for d in lead) + str(int(last)) for lead, last in zip(leads, lasts)]


def draw(rng: np.random.Generator, distractors: int, n_digits: int, filler_start: int, lowest: float = 0.0,
         distinct: bool = False) -> Trial:
    """A random trial: 1 + distractors distinct keys and distinct values (values_of), each needle at a
    uniform depth but the asked one, at a depth in [lowest, 1]."""
    count = 1 + int(distractors)
    names = rng.choice(len(NAMES), count, replace=False)
    values = values_of(rng, count, n_digits, distinct)
    asked = int(rng.integers(count))
    depths = rng.random(count)
    depths[asked] = lowest + (1 - lowest) * depths[asked]
    order = np.argsort(depths, kind="stable")
    return Trial(tuple(NAMES[int(names[j])] for j in order), tuple(values[j] for j in order),
                 tuple(float(depths[j]) for j in order), int(np.flatnonzero(order == asked)[0]), int(filler_start))


def check_distractors(value: float) -> int:
    k = int(value)
    if k != value or not 0 <= k < len(NAMES):
        raise UsageError(f"needles takes 0 to {len(NAMES) - 1} distractors (a whole number), got {value}")
    return k


def trials(stream_size: int, length: int, values: list[float], per_value: int, n_digits: int = DIGITS,
           seed: int = 0, distinct: bool = False) -> list[Trial]:
    """A fixed, seeded set of trials: for each distractor count in `values`, `per_value` trials with
    filler offsets spread over the stream (the same for every variant: they depend on nothing else)."""
    generator = np.random.default_rng(seed)
    out = []
    for value in values:
        k = check_distractors(value)
        out += [draw(generator, k, n_digits, start, 0.0, distinct) for start in spread(stream_size, length, per_value)]
    return out


def accuracy(model, stream: np.ndarray, trial_list: list[Trial], length: int, tokenizer, device,
             max_batch_tokens: int = 16384) -> list[Answer]:
    """One Answer per trial: its distance, and whether the argmax at every answer position is its digit."""
    def positions(trial: Trial):
        tokens, answer, distance = sequence(stream, trial, length, tokenizer)
        return tokens, np.arange(length)[answer], distance
    return teacher_forced(model, trial_list, positions, length, device, max_batch_tokens, whole=True)


@dataclass(frozen=True)
class Needles(RetrievalTask):
    """One trial is one answer, binned by the distance from the asked needle to the question. Option
    `digits`: the digits of every value; `distinct` (default false): values_of's (both a row's
    column too). Training draws each sequence's distractor
    count uniformly from `axis_values` and, with a curriculum (`lowest` l > 0), from the counts up to
    the most times 1 - l (none at the first step), and the asked needle's depth from [l, 1] (the
    distractors' from [0, 1])."""

    def check(self, options):
        n = options.get("digits")
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_DIGITS:
            raise UsageError(f"needles takes 1 to {MAX_DIGITS} digits a value, got {n!r}; set task_options digits")
        if not isinstance(options["distinct"], bool):
            raise UsageError(f"needles takes distinct = true or false, got {options['distinct']!r}")
        most = 1 + max(check_distractors(v) for v in self.axis_values)
        if options["distinct"]:
            check_distinct(n, most)

    def columns(self, options):
        return {"digits": options["digits"], "distinct": options["distinct"]}

    def min_length(self, tokenizer, options):
        return shortest(max(check_distractors(v) for v in self.axis_values), options["digits"], tokenizer)

    def trials(self, stream_size, length, values, per_value, tokenizer, options, seed=0):
        return trials(stream_size, length, values, per_value, options["digits"], seed, options["distinct"])

    def answers(self, model, stream, plan, length, tokenizer, device, max_batch_tokens, options):
        return accuracy(model, stream, plan, length, tokenizer, device, max_batch_tokens)

    def batch(self, stream, rng, count, length, tokenizer, options, answer_weight, text_weight, lowest):
        n_digits = options["digits"]
        need = self.min_length(tokenizer, options)
        if length < need:
            raise RelbenchError(f"needles training with {max(self.axis_values)} distractors needs sequences of at "
                                f"least {need} tokens, got {length}; use a longer --train-length")
        # under depth_curriculum (l = lowest > 0) the distractors grow too: up to the most times 1 - l
        allowed = [v for v in self.axis_values if v <= max(self.axis_values) * (1 - lowest)] or [self.axis_values[0]]
        rows = []
        for _ in range(count):
            k = check_distractors(allowed[int(rng.integers(len(allowed)))])
            trial = draw(rng, k, n_digits, 0, float(lowest), options["distinct"])
            room = filler_size(trial, length, tokenizer)
            trial = replace(trial, filler_start=int(rng.integers(0, max(1, stream.size - room))))
            rows.append(sequence(stream, trial, length, tokenizer)[0])
        window = torch.from_numpy(np.stack(rows))
        weights = torch.full((count, length), float(text_weight))
        weights[:, length - n_digits: length] = float(answer_weight)
        return window[:, :-1], window[:, 1:], weights


ABOUT = "needles accuracy at a length and number of distractor needles, per distance bin, with its Wilson interval"
KEY = ("variant", "seed", "length", "distractors", "trials", "digits", "distinct")
# a distractor count's rows (every distance bin) go together
TASK = register_task(Needles("needles", "needles.csv", KEY, "needles", ABOUT, label="Needles", short="needles",
                             axis="distractors", axis_values=AXIS, binned=True,
                             place_label="distance needle -> question (bin from)",
                             defaults={"digits": DIGITS, "distinct": False}))
