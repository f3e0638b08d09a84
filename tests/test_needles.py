"""Multi-key needle in a haystack (relbench/tasks/needles.py): a trial laid out as documented (checked
against positions computed by hand), the generator's invariants (distinct keys, the asked key in one
needle only, 1 + k needles, the answer its value), fixed trials, scoring against oracle models,
training batches and their weights, and the rows of the shared evaluation path."""

import re
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from relbench.config import ModelConfig, TrainConfig
from relbench.data.tokenizer import ByteTokenizer
from relbench.errors import RelbenchError, UsageError
from relbench.evaluation.evaluators import RetrievalEvaluator
from relbench.evaluation.extrapolate import Job
from relbench.stats import wilson
from relbench.tasks import needles
from relbench.tasks.base import distance_bin, spread
from relbench.training.batches import training_batch

TASK = needles.TASK
TOKENIZER = ByteTokenizer()
OPTIONS = {"digits": 3, "distinct": False}
# no digits and no "=" in the filler, so a needle's text occurs only where a needle stands
STREAM = np.frombuffer(("Filler text of the haystack, nothing to find in here. " * 300).encode(), dtype=np.uint8)
SPACE = ord(" ")


def text(tokens) -> str:
    return bytes(np.asarray(tokens, dtype=np.uint8)).decode()


class Oracle(torch.nn.Module):
    """A stand-in for a model in the evaluation path (its `unfit` reads these attributes)."""
    max_length = None
    positions = ()
    config = ModelConfig()


class Recall(Oracle):
    """Perfect recall: predicts the token that followed the most recent earlier occurrence of the last
    `context` tokens (context 4, " QX=", reads the asked needle's value back; the question's " QX?"
    differs from it)."""

    def __init__(self, context):
        super().__init__()
        self.context = context

    def forward(self, tokens):
        B, L = tokens.shape
        logits = torch.zeros(B, L, 256)
        c = self.context
        for b in range(B):
            row = tokens[b].tolist()
            seen = {}
            for i in range(c - 1, L):
                gram = tuple(row[i - c + 1: i + 1])
                if gram in seen and seen[gram] + 1 < L:
                    logits[b, i, row[seen[gram] + 1]] = 10.0
                seen[gram] = i
        return logits


class NextToken(Oracle):
    """All mass on the next token of a sequence it was told (`answers`: inputs -> the full tokens), or
    always on `fixed`."""

    def __init__(self, answers=None, fixed=None):
        super().__init__()
        self.answers, self.fixed = answers or {}, fixed

    def forward(self, tokens):
        B, L = tokens.shape
        logits = torch.zeros(B, L, 256)
        for b in range(B):
            if self.fixed is not None:
                logits[b, :, self.fixed] = 10.0
                continue
            full = self.answers[tuple(tokens[b].tolist())]
            logits[b, torch.arange(L), torch.tensor(full[1: L + 1])] = 10.0
        return logits


def test_layout_by_hand():
    # two needles of 8 tokens, a question of 8 and an answer of 3: 27 tokens; at length 40, 14 of filler
    filler = text(STREAM[3: 3 + 14])
    trial = needles.Trial(names=("QX", "BM"), values=("417", "902"), depths=(0.0, 1.0), asked=0, filler_start=3)
    tokens, answer, distance = needles.sequence(STREAM, trial, 40, TOKENIZER)
    assert len(tokens) == 41 and answer == slice(37, 40)
    assert text(tokens) == " QX=417." + filler + " BM=902." + " QX? QX=417"
    assert text(tokens[1:][answer]) == "417"                        # the answer: the last three targets
    assert distance == 30                                           # needle at 0, question at 8 + 14 + 8
    tokens, _, distance = needles.sequence(STREAM, replace(trial, asked=1), 40, TOKENIZER)
    assert text(tokens).endswith(" BM=902. BM? BM=902") and distance == 8   # right before the question
    # both at depth 0.5: 7 filler tokens, then the needles one after the other
    trial = needles.Trial(("QX", "BM"), ("417", "902"), (0.5, 0.5), 1, 3)
    tokens, _, distance = needles.sequence(STREAM, trial, 40, TOKENIZER)
    assert text(tokens) == filler[:7] + " QX=417. BM=902." + filler[7:] + " BM? BM=902"
    assert distance == 30 - 15
    trial = needles.Trial(("QX", "BM"), ("417", "902"), (0.5, 0.5), 0, 3)
    assert needles.sequence(STREAM, trial, 40, TOKENIZER)[2] == 30 - 7


def test_min_length_at_each_distractor_count_and_too_short():
    assert [needles.shortest(k, 3, TOKENIZER) for k in (0, 1, 3, 5)] == [18, 26, 42, 58]
    assert TASK.axis_values == (0, 1, 3, 5) and TASK.min_length(TOKENIZER, OPTIONS) == 58 <= 64
    assert TASK.min_length(TOKENIZER, {"digits": 5, "distinct": False}) == 6 * 10 + 8 + 4
    trial = needles.Trial(("QX", "BM"), ("417", "902"), (0.3, 0.6), 0, 0)
    tokens, answer, distance = needles.sequence(STREAM, trial, 26, TOKENIZER)      # no filler at all
    assert text(tokens) == " QX=417. BM=902. QX? QX=417" and distance == 16 and answer == slice(23, 26)
    with pytest.raises(UsageError, match=r"^needles with 1 distractors needs windows of at least 26 tokens, got 25$"):
        needles.sequence(STREAM, trial, 25, TOKENIZER)
    with pytest.raises(UsageError, match="too few tokens"):
        needles.sequence(STREAM, needles.Trial(("QX",), ("417",), (0.5,), 0, STREAM.size - 10), 64, TOKENIZER)
    with pytest.raises(RelbenchError, match="at least 58 tokens, got 57"):
        TASK.batch(STREAM, np.random.default_rng(0), 2, 57, TOKENIZER, OPTIONS, 1.0, 1.0, 0.0)
    TASK.batch(STREAM, np.random.default_rng(0), 2, 58, TOKENIZER, OPTIONS, 1.0, 1.0, 0.0)   # the shortest fits


def test_trials_hold_distinct_keys_and_the_asked_key_once():
    plan = TASK.trials(STREAM.size, 100, list(TASK.axis_values), 6, TOKENIZER, OPTIONS)
    assert [t.distractors for t in plan] == [k for k in (0, 1, 3, 5) for _ in range(6)]
    assert [t.filler_start for t in plan] == spread(STREAM.size, 100, 6) * 4
    for t in plan:
        assert len(t.names) == len(t.values) == len(t.depths) == 1 + t.distractors
        assert len(set(t.names)) == len(t.names) and set(t.names) <= set(needles.NAMES)
        assert len(set(t.values)) == len(t.values) and all(len(v) == 3 and v.isdigit() for v in t.values)
        assert list(t.depths) == sorted(t.depths) and all(0 <= d <= 1 for d in t.depths)
        tokens, answer, distance = needles.sequence(STREAM, t, 100, TOKENIZER)
        assert len(tokens) == 101
        whole = text(tokens)
        body, asked = whole[: -11], whole[-11:]                                 # the question and the answer
        name, value = t.names[t.asked], t.values[t.asked]
        assert asked == f" {name}? {name}={value}" and text(tokens[1:][answer]) == value
        for n, v in zip(t.names, t.values):
            assert body.count(f" {n}=") == 1 and f" {n}={v}." in body               # each key in one needle
        assert body.count("=") == 1 + t.distractors                              # no other needle
        # the distance back from the question's start is the asked needle's start
        assert whole[101 - 11 - distance:].startswith(f" {name}={value}.")
    again = TASK.trials(STREAM.size, 100, list(TASK.axis_values), 6, TOKENIZER, OPTIONS)
    assert again == plan != TASK.trials(STREAM.size, 100, list(TASK.axis_values), 6, TOKENIZER, OPTIONS, seed=1)
    assert {t.asked for t in plan if t.distractors == 5} != {0}                  # any needle may be asked for
    assert len({t.values[t.asked] for t in plan}) > 20                           # values drawn at random
    for t in TASK.trials(STREAM.size, 100, [5], 20, TOKENIZER, {"digits": 1, "distinct": False}):   # 6 of 10 values: distinct
        assert len(set(t.values)) == 6 and all(len(v) == 1 for v in t.values)
    assert TASK.trials(STREAM.size, 30, [5], 2, TOKENIZER, OPTIONS)             # a length too short: trials still
    with pytest.raises(UsageError, match="distractors"):
        TASK.trials(STREAM.size, 100, [1.5], 2, TOKENIZER, OPTIONS)


@pytest.mark.parametrize("n_digits", [2, 3])
def test_distinct_digits(n_digits):
    """distinct: the digits of a value but its last stand in no other value but as its last, so the
    token before every answer digit is the asked needle's alone; keys, depths and the rest as before."""
    options = {"digits": n_digits, "distinct": True}
    most = 5 if n_digits == 2 else 4                                             # 5 x 2 = 10 leading digits at most
    plan = needles.trials(STREAM.size, 100, [0, 1, 3, most], 25, n_digits, seed=3, distinct=True)
    for t in plan:
        assert len(set(t.values)) == len(t.values) and all(len(v) == n_digits and v.isdigit() for v in t.values)
        for j, value in enumerate(t.values):
            others = "".join(v[:-1] for i, v in enumerate(t.values) if i != j)
            assert not set(value[:-1]) & set(others) and len(set(value[:-1])) == n_digits - 1
        whole = text(needles.sequence(STREAM, t, 100, TOKENIZER)[0])
        want = t.values[t.asked]
        for p in range(1, n_digits):                                             # the digit before, in the needles
            assert sum(whole[: -8 - n_digits].count(want[p - 1] + d) for d in "0123456789") == 1
    assert len({t.values[t.asked][-1] for t in plan}) == 10                      # the last digit: any
    plain = needles.trials(STREAM.size, 100, [5], 40, n_digits, seed=3)
    assert any(len({v[0] for v in t.values}) < 6 for t in plain)                 # without it, leads recur
    if n_digits == 2:
        assert TASK.trials(STREAM.size, 100, [5], 3, TOKENIZER, options) == needles.trials(
            STREAM.size, 100, [5], 3, 2, 0, True)
        TrainConfig(task="needles", task_options=options)
        x, y, w = TASK.batch(STREAM, np.random.default_rng(1), 20, 64, TOKENIZER, options, 3.0, 1.0, 0.0)
        for r in range(20):
            row = text(torch.cat([x[r, :1], y[r]]))
            values = [row[m.end(): m.end() + 2] for m in re.finditer(r" [A-Z]{2}=", row[: -9])]
            assert len({v[0] for v in values}) == len(values) and text(y[r][w[r] == 3.0]) in values
    else:
        with pytest.raises(UsageError, match="got 3 digits and 6 needles"):
            TrainConfig(task="needles", task_options=options)
        with pytest.raises(UsageError, match="got 3 digits and 6 needles"):
            needles.trials(STREAM.size, 100, [5], 1, 3, distinct=True)
    with pytest.raises(UsageError, match="distinct = true or false"):
        TrainConfig(task="needles", task_options={"distinct": 1})
    with pytest.raises(UsageError, match="needs 2 or more digits"):            # one digit has no digit before it
        TrainConfig(task="needles", task_options={"digits": 1, "distinct": True})
    with pytest.raises(UsageError, match="got 1 digits and 2 needles"):
        needles.trials(STREAM.size, 100, [1], 1, 1, distinct=True)


def test_answers_of_oracles():
    plan = TASK.trials(STREAM.size, 80, list(TASK.axis_values), 3, TOKENIZER, OPTIONS)
    answers = TASK.answers(Recall(4), STREAM, plan, 80, TOKENIZER, "cpu", 240, OPTIONS)   # 3 per forward pass
    assert [a.correct for a in answers] == [True] * 12 and [a.trial for a in answers] == list(range(12))
    assert [a.distance for a in answers] == [needles.sequence(STREAM, t, 80, TOKENIZER)[2] for t in plan]
    assert all(a.distance >= 8 for a in answers)
    fixed = TASK.answers(NextToken(fixed=SPACE), STREAM, plan, 80, TOKENIZER, "cpu", 16384, OPTIONS)
    assert not any(a.correct for a in fixed)
    zeros = TASK.answers(NextToken(fixed=ord("0")), STREAM, plan, 80, TOKENIZER, "cpu", 16384, OPTIONS)
    assert [a.correct for a in zeros] == [t.values[t.asked] == "000" for t in plan]
    # the value of a distractor (the next needle's) in place of the asked one: wrong, every trial
    full = {}
    for t in plan:
        tokens = needles.sequence(STREAM, t, 80, TOKENIZER)[0].tolist()
        other = t.values[(t.asked + 1) % len(t.values)]
        full[t] = tokens, tokens[:-3] + [ord(d) for d in other]
    told = NextToken({tuple(right[:-1]): right for right, _ in full.values()})
    assert all(a.correct for a in TASK.answers(told, STREAM, plan, 80, TOKENIZER, "cpu", 16384, OPTIONS))
    distractor = NextToken({tuple(right[:-1]): wrong for right, wrong in full.values()})
    assert [a.correct for a in TASK.answers(distractor, STREAM, plan, 80, TOKENIZER, "cpu", 16384, OPTIONS)] == \
        [t.distractors == 0 for t in plan]                                         # no distractor: its own value
    # every digit must be right: the last one off fails the trial
    last = NextToken({tuple(right[:-1]): right[:-1] + [ord("9") if right[-1] != ord("9") else ord("8")]
                      for right, _ in full.values()})
    assert not any(a.correct for a in TASK.answers(last, STREAM, plan, 80, TOKENIZER, "cpu", 16384, OPTIONS))


def test_training_batches_and_their_weights():
    rng = np.random.default_rng(7)
    x, y, w = TASK.batch(STREAM, rng, 40, 64, TOKENIZER, OPTIONS, 5.0, 0.5, 0.0)
    assert x.shape == y.shape == w.shape == (40, 64) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])                                        # the shifted sequence
    assert (w[:, 61:] == 5.0).all() and (w[:, :61] == 0.5).all()                   # the answer's three digits
    again = TASK.batch(STREAM, np.random.default_rng(7), 40, 64, TOKENIZER, OPTIONS, 5.0, 0.5, 0.0)
    assert torch.equal(again[0], x) and torch.equal(again[1], y)
    counts = []
    for row in range(40):
        whole = text(torch.cat([x[row, :1], y[row]]))
        body, asked = whole[:-11], whole[-11:]
        name, value = asked[1:3], asked[-3:]
        assert asked == f" {name}? {name}={value}" and body.count(f" {name}={value}.") == 1
        counts.append(body.count("="))
        assert len({body[i - 2: i] for i in range(len(body)) if body[i] == "="}) == counts[-1]   # distinct keys
    assert set(counts) == {1, 2, 4, 6}                                             # 1 + each of 0, 1, 3, 5
    # the curriculum at its start (lowest 1): the asked needle right before the question
    x, y, _ = TASK.batch(STREAM, np.random.default_rng(8), 20, 64, TOKENIZER, OPTIONS, 1.0, 1.0, 1.0)
    for row in range(20):
        whole = text(torch.cat([x[row, :1], y[row]]))
        name, value = whole[-10:-8], whole[-3:]
        assert whole[-19:-11] == f" {name}={value}."
        assert whole[:-11].count("=") == 1                                        # and no distractor yet
    # halfway (lowest 0.5): up to 5 x 0.5 distractors, so 0 or 1
    x, y, _ = TASK.batch(STREAM, np.random.default_rng(9), 40, 64, TOKENIZER, OPTIONS, 1.0, 1.0, 0.5)
    assert {text(torch.cat([x[r, :1], y[r]]))[:-11].count("=") for r in range(40)} == {1, 2}


def test_training_batch_through_the_config():
    config = TrainConfig(task="needles", batch_size=4, answer_weight=4.0, text_weight=0.25)
    x, y, w = training_batch(torch.from_numpy(STREAM.copy()), 3, config, 64, TOKENIZER)
    assert x.shape == y.shape == (4, 64) and (w[:, 61:] == 4.0).all() and (w[:, :61] == 0.25).all()
    assert torch.equal(x, training_batch(torch.from_numpy(STREAM.copy()), 3, config, 64, TOKENIZER)[0])
    five = TrainConfig(task="needles", batch_size=2, task_options={"digits": 5})
    assert (training_batch(torch.from_numpy(STREAM.copy()), 3, five, 80, TOKENIZER)[2][:, 75:] == 1.0).all()


def test_options_are_checked():
    assert TASK.options({}) == OPTIONS
    assert TASK.options({"task": "needles", "task_options": {"digits": 5}}) == {"digits": 5, "distinct": False}
    assert TASK.options({"task": "passkey", "task_options": {"digits": 5}}) == OPTIONS
    for bad in (0, 10, 2.5):
        with pytest.raises(UsageError, match="1 to 9 digits"):
            TASK.options({"task": "needles", "task_options": {"digits": bad}})
    with pytest.raises(UsageError, match="not an option"):
        TASK.options({"task": "needles", "task_options": {"keys": 4}})
    assert TASK.key == ("variant", "seed", "length", "distractors", "trials", *TASK.columns(OPTIONS))
    assert TASK.count == "queries" and TASK.axis == "distractors"


def job(length, trials):
    return Job(SimpleNamespace(tokens=torch.from_numpy(STREAM.copy())), (length,), (), None, ("needles",), trials,
               400, "auto", torch.device("cpu"), TOKENIZER)


def test_rows_through_the_evaluator():
    evaluator = RetrievalEvaluator(TASK)
    base = {"variant": "alibi", "seed": 0}
    rows = evaluator.value_rows([Recall(4)], base, 100, TASK.axis_values, job(100, 8))
    plan = TASK.trials(STREAM.size, 100, list(TASK.axis_values), 8, TOKENIZER, OPTIONS)
    assert len(rows) == 4
    for k, mine in zip(TASK.axis_values, rows):
        distances = [needles.sequence(STREAM, t, 100, TOKENIZER)[2] for t in plan if t.distractors == k]
        bins = sorted({distance_bin(d) for d in distances})
        assert [(r["distance_low"], r["distance_high"]) for r in mine] == bins
        assert [r["queries"] for r in mine] == [sum(distance_bin(d) == b for d in distances) for b in bins]
        for r in mine:
            assert r["distractors"] == k and r["trials"] == 8 and r["digits"] == 3 and r["length"] == 100
            assert r["status"] == "ok" and r["correct"] == r["queries"] and r["accuracy"] == 1.0
            assert (r["acc_low"], r["acc_high"]) == pytest.approx(wilson(r["queries"], r["queries"]))
    # another variant, another model: the same trials, so the same bins and queries, here all wrong
    other = evaluator.value_rows([NextToken(fixed=SPACE)], {"variant": "rope", "seed": 0}, 100, TASK.axis_values,
                                 job(100, 8))
    assert [[(r["distance_low"], r["queries"]) for r in m] for m in other] == \
        [[(r["distance_low"], r["queries"]) for r in m] for m in rows]
    assert all(r["correct"] == 0 and r["acc_low"] == 0.0 for m in other for r in m)
    # some conditions only (a partial re-run): the same trials of each
    part = evaluator.value_rows([Recall(4)], base, 100, (3,), job(100, 8))
    assert part == [rows[2]]
    # a length too short for five distractors: every condition's row says so
    short = evaluator.value_rows([Recall(4)], base, 50, TASK.axis_values, job(50, 8))
    assert [len(m) for m in short] == [1] * 4
    assert all(m[0]["status"] == "unsupported" and "58" in m[0]["message"] and m[0]["queries"] == 0 for m in short)


def test_a_runs_moments_share_each_conditions_trials():
    """[train] moments: each condition's trials are dealt among the run's moments, trial i of a
    condition to moment i mod K, so with a right model first and two wrong ones, trials 0, 3 and 6 of
    every condition (of 8) are right, and a partial re-run deals them the same way."""
    evaluator = RetrievalEvaluator(TASK)
    base = {"variant": "alibi", "seed": 0}
    moments = [Recall(4), NextToken(fixed=SPACE), NextToken(fixed=SPACE)]
    rows = evaluator.value_rows(moments, base, 100, TASK.axis_values, job(100, 8))
    alone = evaluator.value_rows([Recall(4)], base, 100, TASK.axis_values, job(100, 8))
    assert [sum(r["queries"] for r in m) for m in rows] == [sum(r["queries"] for r in m) for m in alone] == [8] * 4
    assert [sum(r["correct"] for r in m) for m in rows] == [3] * 4
    reversed_ = evaluator.value_rows(moments[::-1], base, 100, TASK.axis_values, job(100, 8))
    assert [sum(r["correct"] for r in m) for m in reversed_] == [2] * 4      # trials 2 and 5 of each
    assert evaluator.value_rows(moments, base, 100, (3,), job(100, 8)) == [rows[2]]
