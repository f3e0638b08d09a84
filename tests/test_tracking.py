"""Variable tracking: a trial laid out as documented (checked against positions computed by hand),
the generator's invariants read back from the tokens themselves (chains, hops, distinct variables,
the distractor never holding the asked value, the answer, clean filler), the task's answers against
oracle models that follow a chain through the inputs, training batches and their weights, and the
rows of the shared binned path."""

import numpy as np
import pytest
import torch

from relbench.config import TrainConfig
from relbench.data.tokenizer import ByteTokenizer
from relbench.errors import RelbenchError, UsageError
from relbench.stats import wilson
from relbench.tasks import tracking
from relbench.tasks.base import Answer, spread
from relbench.training.batches import retrieval_accuracy, training_batch, validation_batches

TOKENIZER = ByteTokenizer()
TASK = tracking.TASK
# filler with digits, "=", ";", "?", ":" and capitals in it: the digits and "=" must not survive
STREAM = np.frombuffer(("Filler Text: x=1, Y = 22; and 3 = three? The End. " * 300).encode(), dtype=np.uint8)
COLUMNS = {"distractors": 1, "digits": 4, "text_digits": False}      # the options a row records
ONE = {**COLUMNS, "drawn_weight": 1.0}


def text(tokens) -> str:
    return bytes(np.asarray(tokens, dtype=np.uint8).tolist()).decode("latin-1")


def parse(tokens) -> tuple[list[tuple[int, str, str]], int, str, str]:
    """The statements (start, variable, right-hand side) of a trial's tokens in text order, where
    its question starts, the value it asks for, and the answer after it."""
    row = text(tokens)
    asked = row.rindex("?")
    colon = row.index(":", asked)
    statements = [(p - 1, row[p - 1], row[p + 1: row.index(";", p)]) for p, ch in enumerate(row) if ch == "="]
    return statements, asked, row[asked + 1: colon], row[colon + 1:]


class Chain(torch.nn.Module):
    """Reads the question's value from the inputs and follows its assignments: at the question's `:`
    and at each space of the answer it predicts the next variable of the chain (`follow=1`: the chain
    of another value in the text, a distractor's), or always `fixed`."""

    def __init__(self, follow=0, fixed=None):
        super().__init__()
        self.follow, self.fixed = follow, fixed

    def forward(self, tokens):
        B, L = tokens.shape
        logits = torch.zeros(B, L, 256)
        for b in range(B):
            if self.fixed is not None:
                logits[b, :, self.fixed] = 10.0
                continue
            row = text(tokens[b].tolist())
            asked = row.rindex("?")
            colon = row.index(":", asked)
            assigned = {}                                           # right-hand side -> the variable it is assigned to
            for p in (i for i, ch in enumerate(row[:asked]) if ch == "="):
                assigned[row[p + 1: row.index(";", p)]] = row[p - 1]
            value = row[asked + 1: colon]
            if self.follow:
                value = next(v for v in assigned if v.isdigit() and v != value)
            chain = []
            while value in assigned and len(chain) < len(assigned):                # a cycle stops
                value = assigned[value]
                chain.append(value)
            for i, name in enumerate(chain):
                if colon + 2 * i < L:
                    logits[b, colon + 2 * i, ord(name)] = 10.0
        return logits


def test_layout_by_hand():
    # 1 hop, 2 chains: min length 30, so at length 40 the 41 tokens hold 10 of filler. Places 0, 0.3, 0.5,
    # 1.0 of 11 cuts: 0, 3, 5, 10 (the last clipped to the filler's end)
    stream = np.frombuffer(b"ab=c9defghijklmnop" * 4, dtype=np.uint8)
    trial = tracking.Trial(values=("1234", "5678"), names=(("A", "B"), ("C", "D")), order=(0, 1, 1, 0),
                           places=(0.0, 0.3, 0.5, 1.0), filler_start=0)
    tokens, targets, distances = tracking.sequence(stream, trial, 40, TOKENIZER)
    assert text(tokens) == "A=1234;ab C=5678;c D=C;defghB=A;?1234:A B"          # "=" and "9" of the filler: spaces
    assert len(tokens) == 41 and tracking.min_length(1, 2) == 30
    # the question at 32; A is assigned at 0, B at 28; the answer's letters at 38 and 40 = targets 37 and 39
    assert targets.tolist() == [37, 39] and text(tokens[1:][targets]) == "AB"
    assert distances.tolist() == [32, 4]
    # from another offset, places that cut the filler elsewhere, and no distractor
    trial = tracking.Trial(("0042",), (("Q", "R", "S"),), (0, 0, 0), (0.2, 0.2, 0.9), 3)
    tokens, targets, distances = tracking.sequence(stream, trial, 40, TOKENIZER)
    # min length 1 * (4 + 3 + 8) + 4 + 4 + 2 = 25: 15 of filler "c defghijklmnop", cuts 3, 3, 14
    assert tracking.min_length(2, 1) == 25
    assert text(tokens) == "c dQ=0042;R=Q;efghijklmnoS=R;p?0042:Q R S"
    assert targets.tolist() == [35, 37, 39] and distances.tolist() == [30 - 3, 30 - 10, 30 - 25]


def test_the_drawn_tokens_by_hand():
    """The targets drawn at random (a statement's variable, a chain's value) are found where
    test_layout_by_hand's trial puts them, and weigh drawn_weight x text_weight in training."""
    stream = np.frombuffer(b"ab=c9defghijklmnop" * 4, dtype=np.uint8)
    trial = tracking.Trial(values=("1234", "5678"), names=(("A", "B"), ("C", "D")), order=(0, 1, 1, 0),
                           places=(0.0, 0.3, 0.5, 1.0), filler_start=0)
    tokens, _, _, drawn = tracking.layout(stream, trial, 40, TOKENIZER)
    # "A=1234;ab C=5678;c D=C;defghB=A;?...": A at 0 is no target; its digits at 2-5, C at 10, its digits at
    # 12-15, D at 19, B at 28: the inputs before them
    assert drawn.tolist() == [1, 2, 3, 4, 9, 11, 12, 13, 14, 18, 27]
    assert text(tokens[1:][drawn]) == "1234C5678DB"
    weights = {}
    for value in (0.0, 0.5, 1.0):
        x, y, weights[value] = TASK.batch(STREAM, np.random.default_rng(5), 20, 64, TOKENIZER,
                                          {**ONE, "drawn_weight": value}, 5.0, 0.5, 0.0)
    for row in range(20):
        full = torch.cat([x[row, :1], y[row]]).tolist()
        statements, _, _, _ = parse(full)
        firsts = sum(1 for _, _, right in statements if right.isdigit())
        dropped = weights[0.0][row] == 0.0
        # every statement's variable but one at the window's start, and the digits of each chain's value
        assert firsts == 2 and int(dropped.sum()) == sum(start > 0 for start, _, _ in statements) + 4 * firsts
        assert all(chr(t).isupper() or chr(t).isdigit() for t in y[row, dropped].tolist())
        assert torch.equal(weights[0.5][row][dropped], torch.full((int(dropped.sum()),), 0.25))
        assert torch.equal(weights[0.0][row][~dropped], weights[1.0][row][~dropped])
    for bad in (2, -0.5, True, "0"):
        with pytest.raises(UsageError, match="drawn_weight must be a number from 0 to 1"):
            TrainConfig(task="tracking", task_options={"drawn_weight": bad})


def test_the_text_digits_option():
    """text_digits: the filler keeps the text's digits (only its `=` become spaces), in the evaluated
    trials and the training batches alike; without it no digit but the values' and the question's."""
    stream = np.frombuffer(b"ab=c9defghijklmnop" * 4, dtype=np.uint8)
    trial = tracking.Trial(values=("1234", "5678"), names=(("A", "B"), ("C", "D")), order=(0, 1, 1, 0),
                           places=(0.0, 0.3, 0.5, 1.0), filler_start=0, text_digits=True)
    tokens, targets, distances = tracking.sequence(stream, trial, 40, TOKENIZER)
    assert text(tokens) == "A=1234;ab C=5678;c9D=C;defghB=A;?1234:A B"         # test_layout_by_hand's, but the 9
    assert targets.tolist() == [37, 39] and distances.tolist() == [32, 4]
    kept = {**ONE, "text_digits": True}
    assert TASK.columns(kept)["text_digits"] is True
    assert all(t.text_digits for t in TASK.trials(STREAM.size, 64, [2], 3, TOKENIZER, kept))
    assert not any(t.text_digits for t in TASK.trials(STREAM.size, 64, [2], 3, TOKENIZER, ONE))
    for options, digits_in_filler in ((kept, True), (ONE, False)):
        x, y, _ = TASK.batch(STREAM, np.random.default_rng(2), 30, 64, TOKENIZER, options, 5.0, 0.5, 0.0)
        found = False
        for row in range(30):
            tokens = torch.cat([x[row, :1], y[row]]).tolist()
            full, (statements, asked, _, _) = text(tokens), parse(tokens)
            words = "".join("#" if any(start <= i < full.index(";", start) + 1 for start, _, _ in statements) else ch
                            for i, ch in enumerate(full[:asked]))
            assert "=" not in words                                                  # "=" only in statements
            found = found or any(ch.isdigit() for ch in words)
        assert found == digits_in_filler
    with pytest.raises(UsageError, match="text_digits must be true or false"):
        TrainConfig(task="tracking", task_options={"text_digits": 1})


@pytest.mark.parametrize("chains, digits", [(1, 4), (2, 4), (3, 4), (2, 1), (3, 2)])
def test_generator_invariants_read_back_from_the_tokens(chains, digits):
    length, per_value = 100, 6
    plan = tracking.trials(STREAM.size, length, [1, 2, 3, 4], per_value, chains, seed=4, digits=digits)
    assert [t.hops for t in plan] == [h for h in (1, 2, 3, 4) for _ in range(per_value)]
    for trial in plan:
        tokens, targets, distances = tracking.sequence(STREAM, trial, length, TOKENIZER)
        assert len(tokens) == length + 1
        statements, asked, value, answer = parse(tokens)
        hops = trial.hops
        assert len(trial.names) == chains and all(len(names) == hops + 1 for names in trial.names)
        assert len(statements) == chains * (hops + 1)
        variables = [v for _, v, _ in statements]
        assert len(set(variables)) == len(variables)                                 # distinct across every chain
        assert value == trial.values[0] and len(set(trial.values)) == chains
        assert all(len(v) == digits and v.isdigit() for v in trial.values)
        where = {v: (start, rhs) for start, v, rhs in statements}
        chain = trial.names[0]
        assert where[chain[0]][1] == value                                           # the first assigns the value
        for j in range(1, hops + 1):
            assert where[chain[j]][1] == chain[j - 1]                                # each next the previous variable
            assert where[chain[j]][0] > where[chain[j - 1]][0]                       # in chain order
        holders = []                                                     # who holds the value, in text order
        for _, v, rhs in statements:
            if rhs == value or rhs in holders:
                holders.append(v)
        assert holders == list(chain)                                                # no distractor variable holds it
        for c in range(1, chains):
            assert where[trial.names[c][0]][1] == trial.values[c] != value
        assert answer == " ".join(chain)
        assert text(tokens[1:][targets]) == "".join(chain)
        assert distances.tolist() == [asked - where[v][0] for v in chain] and min(distances) >= 4
        ours = set(range(asked, length + 1))                                         # question and answer
        for start, v, rhs in statements:
            ours |= set(range(start, start + len(v) + len(rhs) + 2))
        filler = text(tokens[sorted(set(range(length + 1)) - ours)])
        assert len(filler) == length - tracking.min_length(hops, chains, digits)
        assert not any(ch in filler for ch in "0123456789=")


def test_the_digits_option():
    """Values of one digit: the layout by hand, the shortest window, the rows' column, training batches
    and the oracle; digits outside 1-9 refused."""
    stream = np.frombuffer(b"ab=c9defghijklmnop" * 4, dtype=np.uint8)
    trial = tracking.Trial(values=("7", "3"), names=(("A", "B"), ("C", "D")), order=(0, 1, 1, 0),
                           places=(0.0, 0.3, 0.5, 1.0), filler_start=0)
    # min length 2 * (1 + 3 + 4) + 1 + 2 + 2 = 21: at length 31 the 32 tokens hold 10 of filler, cut at 0, 3, 5, 10
    assert tracking.min_length(1, 2, 1) == 21
    tokens, targets, distances = tracking.sequence(stream, trial, 31, TOKENIZER)
    assert text(tokens) == "A=7;ab C=3;c D=C;defghB=A;?7:A B"
    assert targets.tolist() == [28, 30] and distances.tolist() == [26, 4]
    one = {"distractors": 1, "digits": 1, "drawn_weight": 1.0, "text_digits": False}
    assert TASK.min_length(TOKENIZER, one) == 2 * (1 + 3 + 16) + 1 + 8 + 2 == 51
    assert TASK.options({"task": "tracking", "task_options": {"digits": 1}}) == one
    assert TASK.columns(one) == {"distractors": 1, "digits": 1, "text_digits": False}
    plan = TASK.trials(STREAM.size, 64, [1, 4], 3, TOKENIZER, one)
    assert all(len(v) == 1 for t in plan for v in t.values)
    assert all(a.correct for a in TASK.answers(Chain(), STREAM, plan, 64, TOKENIZER, "cpu", 16384, one))
    x, y, w = TASK.batch(STREAM, np.random.default_rng(0), 8, 64, TOKENIZER, one, 5.0, 1.0, 0.0)
    for row in range(8):
        _, _, value, answer = parse(torch.cat([x[row, :1], y[row]]).tolist())
        assert len(value) == 1 and value.isdigit()
        assert text(y[row][w[row] == 5.0].tolist()) == answer.replace(" ", "")        # the chain's letters weighted
    for bad in (0, 10, True, 2.0):
        with pytest.raises(UsageError, match="digits must be an integer from 1 to 9"):
            TrainConfig(task="tracking", task_options={"digits": bad})


def test_trials_are_fixed_by_the_seed():
    a = tracking.trials(STREAM.size, 64, [1, 4], 3, 2, seed=0)
    assert a == tracking.trials(STREAM.size, 64, [1, 4], 3, 2, seed=0) != tracking.trials(STREAM.size, 64, [1, 4], 3, 2,
                                                                                              seed=1)
    assert [t.filler_start for t in a] == spread(STREAM.size, 64, 3) * 2
    assert TASK.trials(STREAM.size, 64, [1, 4], 3, TOKENIZER, ONE, seed=0) == a
    assert all(len(t.names) == 1 for t in TASK.trials(STREAM.size, 64, [2], 2, TOKENIZER, {**ONE, "distractors": 0}))
    for t in a:
        assert sorted(t.order) == sorted(list(range(2)) * (t.hops + 1)) and list(t.places) == sorted(t.places)


def test_min_length_and_a_length_too_short():
    assert TASK.min_length(TOKENIZER, ONE) == 60 == tracking.min_length(4, 2)        # the most hops: 4
    assert [tracking.min_length(h, 2) for h in (1, 2, 3, 4)] == [30, 40, 50, 60]
    assert TASK.min_length(TOKENIZER, {**ONE, "distractors": 0}) == 37
    for hops in (1, 2, 3, 4):
        trial = tracking.trials(STREAM.size, 64, [hops], 1, 2)[0]
        shortest = tracking.min_length(hops, 2)
        tokens, _, _ = tracking.sequence(STREAM, trial, shortest, TOKENIZER)         # no filler at all
        assert len(tokens) == shortest + 1 and len(parse(tokens)[0]) == 2 * (hops + 1)
        with pytest.raises(UsageError, match=f"at least {shortest} tokens, got {shortest - 1}"):
            tracking.sequence(STREAM, trial, shortest - 1, TOKENIZER)
    plan = TASK.trials(STREAM.size, 59, list(TASK.axis_values), 2, TOKENIZER, ONE)
    with pytest.raises(UsageError, match="at least 60 tokens, got 59"):
        TASK.answers(Chain(), STREAM, plan, 59, TOKENIZER, "cpu", 16384, ONE)
    with pytest.raises(RelbenchError, match="at least 60 tokens"):
        TASK.batch(STREAM, np.random.default_rng(0), 2, 59, TOKENIZER, ONE, 1.0, 1.0, 0.0)


def test_answers_of_oracles():
    for length in (64, 200):
        plan = TASK.trials(STREAM.size, length, list(TASK.axis_values), 3, TOKENIZER, ONE)
        answers = TASK.answers(Chain(), STREAM, plan, length, TOKENIZER, "cpu", 40 * length, ONE)
        assert len(answers) == sum(t.hops + 1 for t in plan) == 3 * (2 + 3 + 4 + 5)
        assert all(a.correct for a in answers)
        assert [a.trial for a in answers] == [i for i, t in enumerate(plan) for _ in range(t.hops + 1)]
        assert [a.distance for a in answers] == [d for t in plan
                                                 for d in tracking.sequence(STREAM, t, length, TOKENIZER)[2].tolist()]
        assert not any(a.correct for a in TASK.answers(Chain(fixed=ord(" ")), STREAM, plan, length, TOKENIZER, "cpu",
                                                       16384, ONE))
        # following the distractor's chain, not the asked value's, is never right: its variables are others
        assert not any(a.correct for a in TASK.answers(Chain(follow=1), STREAM, plan, length, TOKENIZER, "cpu",
                                                       16384, ONE))
    stream = torch.from_numpy(STREAM.copy())
    assert retrieval_accuracy(Chain(), "tracking", stream, 64, TOKENIZER, "cpu", trials=8) == 1.0
    assert retrieval_accuracy(Chain(fixed=ord("A")), "tracking", stream, 64, TOKENIZER, "cpu", trials=8) < 0.5


def test_batch_weights_and_shift():
    x, y, w = TASK.batch(STREAM, np.random.default_rng(5), 40, 64, TOKENIZER, ONE, 5.0, 0.5, 0.0)
    again = TASK.batch(STREAM, np.random.default_rng(5), 40, 64, TOKENIZER, ONE, 5.0, 0.5, 0.0)
    assert torch.equal(x, again[0]) and torch.equal(w, again[2])
    assert x.shape == y.shape == w.shape == (40, 64)
    assert torch.equal(x[:, 1:], y[:, :-1])                                           # the same tokens, shifted
    predicted = Chain()(x).argmax(-1)
    hops = set()
    for row in range(40):
        full = torch.cat([x[row, :1], y[row]]).tolist()                               # the trial's 65 tokens
        statements, asked, _, answer = parse(full)
        colon = full.index(ord(":"), asked)
        n = (len(answer) + 1) // 2
        hops.add(n - 1)
        assert len(statements) == 2 * n                                               # one distractor chain
        expected = torch.full((64,), 0.5)
        expected[colon + 2 * torch.arange(n)] = 5.0
        assert torch.equal(w[row], expected), row
        at = w[row] == 5.0
        assert torch.equal(predicted[row, at], y[row, at])                            # the weighted targets: the chain
    assert hops == {1, 2, 3, 4}                                                       # drawn from axis_values
    config = TrainConfig(task="tracking", task_options={"distractors": 0}, batch_size=4, answer_weight=3.0)
    x, y, w = training_batch(torch.from_numpy(STREAM.copy()), 7, config, 48, TOKENIZER)
    assert x.shape == (4, 48) and all(len(parse(torch.cat([x[r, :1], y[r]]).tolist())[0]) == (w[r] == 3.0).sum()
                                      for r in range(4))                              # no distractor: n statements
    val = validation_batches(torch.from_numpy(STREAM.copy()), config, 48, TOKENIZER)
    assert len(val) == config.eval_batches and val[0][0].shape == (4, 48)
    with pytest.raises(UsageError, match="distractors must be an integer from 0 to 4"):
        TrainConfig(task="tracking", task_options={"distractors": 5})
    with pytest.raises(UsageError, match="not an option of task tracking"):
        TrainConfig(task="tracking", task_options={"hops": 2})


def test_rows_per_distance_bin():
    assert TASK.count == "queries" and TASK.key[-3:] == ("distractors", "digits", "text_digits")
    assert TASK.columns(ONE) == COLUMNS
    assert TASK.options({}) == ONE and TASK.options({"task": "tracking", "task_options": {"distractors": 2}}) == \
        {**ONE, "distractors": 2}
    common = {"variant": "rope", "seed": 0, "length": 64, "hops": 2, "trials": 2, "distractors": 1, "digits": 4}
    answers = [Answer(0, 4, True), Answer(0, 5, False), Answer(0, 33, True), Answer(1, 7, True), Answer(1, 40, False),
               Answer(1, 63, False)]
    rows = TASK.rows(common, answers)
    assert [(r["distance_low"], r["distance_high"], r["queries"], r["correct"]) for r in rows] == \
        [(4, 8, 3, 2), (32, 64, 3, 1)]
    for row in rows:
        assert row["accuracy"] == row["correct"] / row["queries"] and row["status"] == "ok" and row["hops"] == 2
        assert (row["acc_low"], row["acc_high"]) == pytest.approx(wilson(row["correct"], row["queries"]))
    plan = TASK.trials(STREAM.size, 64, [3], 4, TOKENIZER, ONE)
    real = TASK.rows(common, TASK.answers(Chain(), STREAM, plan, 64, TOKENIZER, "cpu", 16384, ONE))
    assert sum(r["queries"] for r in real) == 4 * 4 and all(r["accuracy"] == 1.0 for r in real)
    assert all(r["distance_high"] == 2 * r["distance_low"] for r in real)
    skipped = TASK.skipped_row(common, "unsupported", "too short")
    assert skipped["queries"] == 0 and skipped["status"] == "unsupported"


def test_a_tokenizer_that_splits_a_character_is_refused():
    class Split:
        name = fingerprint = "split-test"
        vocab_size = 256

        def encode(self, text):
            return np.asarray([0, 0])

    with pytest.raises(UsageError, match="does not encode 'A' as one token"):
        TASK.min_length(Split(), ONE)


@pytest.mark.parametrize("lowest, hops", [(1.0, {1}), (0.5, {1, 2}), (0.2, {1, 2, 3}), (0.0, {1, 2, 3, 4})])
def test_the_curriculum_grows_the_chains(lowest, hops):
    """Under depth_curriculum the batch's `lowest` l allows hop counts up to 1 + 3 (1 - l)."""
    _, _, w = TASK.batch(STREAM, np.random.default_rng(3), 60, 64, TOKENIZER, ONE, 5.0, 0.5, lowest)
    assert {int((row == 5.0).sum()) - 1 for row in w} == hops
