"""Variable tracking (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context
Language Models?", arXiv 2404.06654, its task VT): a chain of assignments hidden in filler text,
the first giving a variable a value and each next one assigning the previous variable to a new one;
the question asks for every variable that holds the value.

    ... filler A=1234; filler C=5678; filler D=C; filler B=A; filler E=D; filler F=B; filler ?1234:A B F
        '-- the chain: A=1234, B=A, F=B (2 hops) --'    '-- the distractor: C=5678, D=C, E=D --'

Source. The paper describes the task as statements "VAR X1 = 12345", "VAR X2 = X1", ... inserted
into a noise haystack, with the instruction to find all variables assigned the value; its generator
has a number of hops and a number of chains (`num_chains`: further chains of the same form with
other values, of which only one is asked about, so the rest are distractors). As this module's
author recalls the paper, its main configuration is 1 chain of 4 hops with 5-digit values. Its
official code, github.com/NVIDIA/RULER, was not read here: the format below is this module's own.

Choices (and why):
- Statements are compact, `X=1234;` and `Y=X;` (no `VAR`, no spaces), variables single capital
  letters A-Z, values DIGITS = 4 digits by default (`task_options = {digits = N}`, 1 to MAX_DIGITS, a
  column of the rows; every chain's value distinct), the question `?1234:` and the answer the
  chain's variables in assignment order separated by spaces, `A B F`. RULER's spelled-out form ("VAR X1 = 12345", "Find
  all variables ...") takes ~15 tokens a statement with byte tokens; this one fits 4 hops plus a
  distractor chain in a window of 64 (the mqar preset's training length) with 4 tokens of filler.
- One distractor chain by default (`task_options = {distractors = N}`, 0 to 4; it is a column of the
  rows), with the same number of hops, its statements interleaved with the chain's in a random
  order: the statement nearest the question is as likely the distractor's as the chain's, so only
  following the chain from the asked value answers. Every variable of a trial is distinct, and the
  distractors' values differ from the asked one, so no distractor variable holds it.
- `hops` is the task's condition (1, 2, 3, 4): a chain of hops + 1 variables.
- Filler is real text of the split being used (like passkey and mqar), from
  `stream[filler_start: ...]`, with every token that contains a digit or `=` replaced by the
  tokenizer's space: the only digits are the values and the question's, the only `=` the statements',
  so the asked value and its statements cannot be confused with the text. Capital letters stay in the
  filler: a variable is the letter right before a `=`, which the filler never has.
  Option `text_digits` (default false) keeps the text's digits in the filler (only `=` goes): a
  value's digit then recurs in the text, and the digits' embeddings (tied to the output layer) learn
  from the text as the capitals do; without it they are seen only as values, and in models that never
  learned the task they had turned nearly parallel (results/tasks/README.md, attempts T9-T18).
- Statements go at random places of the filler (each place a fraction of it, sorted, so statements
  keep their order and may stand next to each other); the question and answer end the window.

Tokens: every character of the task (the letters, digits, `=;?:` and the space) is one token (bytes,
or a byte-level BPE that keeps them; encoded one by one), so a trial's layout is the same for every
tokenizer: the fixed part is chains * (digits + 3 + 4 * hops) statement tokens, the question
digits + 2, the answer 2 * hops + 1. A window (inputs) must hold all of them but the last answer
token: min_length = chains * (digits + 3 + 4 * hops) + digits + 2 * hops + 2, with 4 digits and one distractor
(2 chains) 20 + 10 * hops: 30, 40, 50, 60 tokens at 1, 2, 3, 4 hops (37 at 4 hops without a
distractor). `min_length` of the task is that of the most hops in axis_values, so a length that is
too short for it is skipped as a whole ("unsupported"); `answers` and `batch` refuse a window too
short for their trials in one line that names the length needed. `trials` does not (its trials do
not depend on the length but for their filler offsets): the evaluator draws the whole fixed set at
every length, a length it then skips as too short included.

Answers: teacher-forced, one per variable of the chain (`hops + 1` per trial, rows per distance bin):
the variable is right when the argmax at the token before it (the `:` for the first, the space before
it for the others) is its letter. The earlier variables are inputs, as when a model writes its own
answer. Its distance: the tokens from the start of the statement that assigns it to the start of the
question (`?`), at least the statement's own length; reports bin it by powers of two (distance_bin).

Training (`batch`): random trials, hops drawn uniformly from axis_values for each trial (no option),
the distractors of the run's options, the answer letters weighted `answer_weight`, every other
target `text_weight`. Under `depth_curriculum` (the batch's `lowest` l > 0) the chains grow instead:
only hop counts up to 1 + 3 (1 - l), one hop at the first step, every count from the curriculum's end.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from relbench.errors import RelbenchError, UsageError
from relbench.tasks.base import Answer, RetrievalTask, register_task, spread, teacher_forced

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"   # the variables' names, one token each
DIGITS = 4                                # digits of a value by default, one token each
MAX_DIGITS = 9
CHARACTERS = LETTERS + "0123456789=;?: "  # every character a trial puts in besides filler
CLEANED = "0123456789="                   # filler tokens holding one of these become the space
CLEANED_TEXT_DIGITS = "="                 # ... under text_digits (the filler keeps the text's digits)
HOPS = (1, 2, 3, 4)                       # the conditions evaluated (and drawn for training)
DISTRACTORS = 1                           # distractor chains by default
DRAWN_WEIGHT = 1.0                        # the drawn tokens' targets weigh this times text_weight


@dataclass(frozen=True)
class Trial:
    values: tuple[str, ...]                # (chains,) each chain's value, all of one number of digits; chain 0 asked
    names: tuple[tuple[str, ...], ...]     # (chains, hops + 1) each chain's variables, in assignment order
    order: tuple[int, ...]                 # (chains * (hops + 1),) the chain of each statement, in text order
    places: tuple[float, ...]              # (chains * (hops + 1),) sorted: where each statement goes, in [0, 1]
    filler_start: int                      # offset of the filler in the token stream
    text_digits: bool = False              # the filler keeps the text's digits (only its `=` become spaces)

    @property
    def hops(self) -> int:
        return len(self.names[0]) - 1


_SYMBOLS: dict[str, dict[str, int]] = {}
_CLEAN: dict[tuple[str, str], np.ndarray] = {}


def symbols(tokenizer) -> dict[str, int]:
    """The token of each character of CHARACTERS; one line when the tokenizer does not keep one whole."""
    if tokenizer.fingerprint not in _SYMBOLS:
        out = {}
        for char in CHARACTERS:
            token = np.asarray(tokenizer.encode(char))
            if token.size != 1:
                raise UsageError(f"tokenizer {tokenizer.name} does not encode {char!r} as one token, which the "
                                 f"tracking task needs; use bytes or a byte-level BPE")
            out[char] = int(token[0])
        _SYMBOLS[tokenizer.fingerprint] = out
    return _SYMBOLS[tokenizer.fingerprint]


def cleaned(tokenizer, chars: str = CLEANED) -> np.ndarray:
    """(vocab_size,) bool: the tokens whose text holds one of `chars` (replaced by the space in filler)."""
    if (tokenizer.fingerprint, chars) not in _CLEAN:
        if tokenizer.vocab_size == 256 and tokenizer.name == "bytes":
            mask = np.isin(np.arange(256), [ord(c) for c in chars])
        else:
            mask = np.asarray([any(c in tokenizer.decode([t]) for c in chars) for t in range(tokenizer.vocab_size)])
        _CLEAN[tokenizer.fingerprint, chars] = mask
    return _CLEAN[tokenizer.fingerprint, chars]


def min_length(hops: int, chains: int, digits: int = DIGITS) -> int:
    """The shortest window (inputs) holding a trial of `hops` and `chains` chains of `digits`-digit
    values without filler: its statements, question and answer, less the last answer token (a target only)."""
    return chains * (digits + 3 + 4 * hops) + digits + 2 * hops + 2


def statement(name: str, value: str) -> str:
    """`X=1234;` or `Y=X;`."""
    return f"{name}={value};"


def encode(text: str, table: dict[str, int]) -> list[int]:
    return [table[c] for c in text]


def sequence(stream: np.ndarray, trial: Trial, length: int, tokenizer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(length + 1,) tokens: inputs are the first `length`, targets the last `length`; the (hops + 1,)
    target positions of the answer's variables (the input index of the token before each); and the
    (hops + 1,) distance of each from the start of the statement that assigns it to the question."""
    return layout(stream, trial, length, tokenizer)[:3]


def layout(stream: np.ndarray, trial: Trial, length: int, tokenizer):
    """sequence's three arrays and the target positions of the tokens drawn at random: each statement's
    variable and each chain's value (the input index of the token before each)."""
    chains, hops = len(trial.names), trial.hops
    shortest = min_length(hops, chains, len(trial.values[0]))
    if length < shortest:
        raise UsageError(f"tracking with {hops} hops and {chains - 1} distractor chains needs windows of at least "
                         f"{shortest} tokens, got {length}")
    table = symbols(tokenizer)
    room = length - shortest                                  # filler tokens
    filler = np.asarray(stream[trial.filler_start: trial.filler_start + room], dtype=np.int64)
    if filler.size < room:
        raise UsageError(f"the text has too few tokens after offset {trial.filler_start} for {room} tokens of "
                         f"tracking filler")
    filler = np.where(cleaned(tokenizer, CLEANED_TEXT_DIGITS if trial.text_digits else CLEANED)[filler], table[" "], filler)
    texts, starts, seen = [], {}, [0] * chains
    for c in trial.order:                                      # the statements in text order
        j = seen[c]
        texts.append((c, j, statement(trial.names[c][j], trial.values[c] if j == 0 else trial.names[c][j - 1])))
        seen[c] += 1
    parts, at, size, drawn = [], 0, 0, []
    for (c, j, text), place in zip(texts, trial.places):
        cut = min(room, int(place * (room + 1)))
        parts.append(filler[at: cut])
        size += cut - at
        starts[c, j] = size
        drawn += [size - 1] + ([size + 1 + k for k in range(len(trial.values[c]))] if j == 0 else [])
        parts.append(np.asarray(encode(text, table), dtype=np.int64))
        size += len(text)
        at = cut
    question = f"?{trial.values[0]}:"
    parts += [filler[at:], np.asarray(encode(question + " ".join(trial.names[0]), table), dtype=np.int64)]
    tokens = np.concatenate(parts)
    asked = size + room - at                                   # where the question starts
    targets = asked + len(question) - 1 + 2 * np.arange(hops + 1)
    distances = np.asarray([asked - starts[0, j] for j in range(hops + 1)])
    drawn = np.asarray([p for p in drawn if p >= 0], dtype=np.int64)   # a statement at 0 is no target
    return tokens, targets, distances, drawn


def draw(rng: np.random.Generator, hops: int, chains: int, filler_start: int, digits: int = DIGITS,
         text_digits: bool = False) -> Trial:
    """A random trial: distinct variables across all chains, distinct values of `digits` digits, the
    chains' statements interleaved in a random order at random places (its filler with the text's
    digits under `text_digits`)."""
    if not 1 <= hops or chains * (hops + 1) > len(LETTERS) or chains > 10 ** digits:
        raise UsageError(f"tracking needs hops >= 1, (hops + 1) * chains <= {len(LETTERS)} variables and chains <= "
                         f"10 ** digits values, got {hops} hops, {chains} chains and {digits} digits")
    letters = rng.choice(len(LETTERS), chains * (hops + 1), replace=False)
    names = tuple(tuple(LETTERS[int(k)] for k in letters[c * (hops + 1): (c + 1) * (hops + 1)]) for c in range(chains))
    values = tuple(f"{int(v):0{digits}d}" for v in rng.choice(10 ** digits, chains, replace=False))
    order = tuple(int(c) for c in rng.permutation(np.repeat(np.arange(chains), hops + 1)))
    places = tuple(float(p) for p in np.sort(rng.random(chains * (hops + 1))))
    return Trial(values, names, order, places, int(filler_start), text_digits)


def trials(stream_size: int, length: int, hops: list[float], per_value: int, chains: int, seed: int = 0,
           digits: int = DIGITS, text_digits: bool = False) -> list[Trial]:
    """A fixed, seeded set of trials: for each hop count, `per_value` trials with filler offsets spread
    over the stream (the same for every variant, as they depend on nothing else)."""
    generator = np.random.default_rng(seed)
    out = []
    for value in hops:
        out += [draw(generator, int(value), chains, start, digits, text_digits)
                for start in spread(stream_size, length, per_value)]
    return out


def accuracy(model, stream: np.ndarray, trial_list: list[Trial], length: int, tokenizer, device,
             max_batch_tokens: int = 16384) -> list[Answer]:
    """One Answer per variable of each trial's chain (trial by trial, in assignment order): its
    distance from its statement to the question, correct whether the argmax before it is its letter."""
    return teacher_forced(model, trial_list, lambda t: sequence(stream, t, length, tokenizer), length, device,
                          max_batch_tokens)


def training_sequences(stream: np.ndarray, rng: np.random.Generator, count: int, length: int, tokenizer,
                       hops: tuple[int, ...], chains: int, digits: int = DIGITS,
                       text_digits: bool = False) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """(count, length + 1) random trials, each of hops drawn uniformly from `hops`, and the answer's
    target positions and the drawn tokens' (layout) of each."""
    shortest = min_length(max(hops), chains, digits)
    if length < shortest:
        raise RelbenchError(f"tracking training with {max(hops)} hops and {chains - 1} distractor chains needs "
                            f"sequences of at least {shortest} tokens; use a longer --train-length")
    rows, answers, drawn = [], [], []
    for _ in range(count):
        h = int(hops[int(rng.integers(0, len(hops)))])
        room = length - min_length(h, chains, digits)
        trial = draw(rng, h, chains, int(rng.integers(0, max(1, stream.size - room))), digits, text_digits)
        tokens, targets, _, random = layout(stream, trial, length, tokenizer)
        rows.append(tokens)
        answers.append(targets)
        drawn.append(random)
    return np.stack(rows), answers, drawn


@dataclass(frozen=True)
class Tracking(RetrievalTask):
    """Every variable of the chain is an answer, binned by its distance; the options `distractors`
    (distractor chains) and `digits` (of every value) are columns of the rows."""

    def check(self, options):
        value, most = options["distractors"], len(LETTERS) // (max(self.axis_values) + 1) - 1
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
            raise UsageError(f"task_options.distractors must be an integer from 0 to {most} (every variable of "
                             f"{max(self.axis_values)} hops distinct among {len(LETTERS)} letters), got {value}")
        n = options["digits"]
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_DIGITS:
            raise UsageError(f"task_options.digits must be an integer from 1 to {MAX_DIGITS}, got {n!r}")
        w = options["drawn_weight"]
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w <= 1:
            raise UsageError(f"task_options.drawn_weight must be a number from 0 to 1, got {w!r}")
        if not isinstance(options["text_digits"], bool):
            raise UsageError(f"task_options.text_digits must be true or false, got {options['text_digits']!r}")

    def columns(self, options):
        return {"distractors": options["distractors"], "digits": options["digits"], "text_digits": options["text_digits"]}

    def min_length(self, tokenizer, options):
        symbols(tokenizer)
        return min_length(int(max(self.axis_values)), options["distractors"] + 1, options["digits"])

    def trials(self, stream_size, length, values, per_value, tokenizer, options, seed=0):
        return trials(stream_size, length, values, per_value, options["distractors"] + 1, seed, options["digits"],
                      options["text_digits"])

    def answers(self, model, stream, plan, length, tokenizer, device, max_batch_tokens, options):
        return accuracy(model, stream, plan, length, tokenizer, device, max_batch_tokens)

    def batch(self, stream, rng, count, length, tokenizer, options, answer_weight, text_weight, lowest):
        """Trials of every hop count, or under a curriculum (`lowest` l > 0: depth_curriculum's early
        steps) of the hop counts up to 1 + (most - 1)(1 - l): one hop first, the longest chains last."""
        every = tuple(int(h) for h in self.axis_values)
        allowed = tuple(h for h in every if h <= every[0] + (every[-1] - every[0]) * (1 - lowest)) or every[:1]
        sequences, answers, drawn = training_sequences(stream, rng, count, length, tokenizer, allowed,
                                                       options["distractors"] + 1, options["digits"],
                                                       options["text_digits"])
        window = torch.from_numpy(sequences)
        weights = torch.full((count, length), float(text_weight))
        for row, (targets, random) in enumerate(zip(answers, drawn)):
            weights[row, torch.from_numpy(random)] = float(options["drawn_weight"]) * float(text_weight)
            weights[row, torch.from_numpy(targets)] = float(answer_weight)
        return window[:, :-1], window[:, 1:], weights


# a hop count's rows (every distance bin) go together
KEY = ("variant", "seed", "length", "hops", "trials", "distractors", "digits", "text_digits")
ABOUT = ("variable-tracking accuracy at a length and number of hops, per distance bin from a variable's assignment to "
         "the question, with its Wilson interval")
TASK = register_task(Tracking("tracking", "tracking.csv", KEY, "tracking", ABOUT, label="Variable tracking",
                              short="tracking", axis="hops", axis_values=HOPS, binned=True,
                              place_label="distance assignment -> question (bin from)", weigh_conditions=True,
                              defaults={"distractors": DISTRACTORS, "digits": DIGITS,
                                        "drawn_weight": DRAWN_WEIGHT, "text_digits": False}))
