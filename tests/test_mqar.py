"""Multi-query associative recall: trials laid out as documented (checked against positions computed
by hand), the alphabet kept out of the filler, training weights per role, accuracy and
retrieval_accuracy against oracle models, and the mqar rows (and passkey's Wilson columns) that
`extrapolate` writes for a tiny trained run."""

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from relbench.cli import app
from relbench.config import TrainConfig
from relbench.data.tokenizer import ByteTokenizer
from relbench.errors import UsageError
from relbench.evaluation.extrapolate import Job
from relbench.stats import wilson
from relbench.tasks import TASKS, mqar
from relbench.training.batches import retrieval_accuracy, training_batch, validation_batches

TOKENIZER = ByteTokenizer()
# filler with bytes of the task's alphabet in it ("é" is 0xC3 0xA9, "ü" 0xC3 0xBC): they must not survive
STREAM = np.frombuffer(("Filler text, café and Düsseldorf, no digits here. " * 300).encode(), dtype=np.uint8)
SPACE = ord(" ")


class NextToken(torch.nn.Module):
    """Puts all mass on the true next token of any sequence it was told about (`answers`), or on
    the token `shift` positions after it (shift 1: one position late), or always on `fixed`."""

    def __init__(self, answers=None, shift=0, fixed=None):
        super().__init__()
        self.answers, self.shift, self.fixed = answers or {}, shift, fixed

    def forward(self, tokens):
        B, L = tokens.shape
        logits = torch.zeros(B, L, 256)
        for b in range(B):
            full = self.answers.get(tuple(tokens[b].tolist()))
            for p in range(L):
                if self.fixed is not None:
                    logits[b, p, self.fixed] = 10.0
                elif full is not None and p + 1 + self.shift < len(full):
                    logits[b, p, full[p + 1 + self.shift]] = 10.0
        return logits


class Induction(torch.nn.Module):
    """A perfect recall model: predicts the token that followed the most recent earlier occurrence
    of the last `context` tokens (context 1 recalls an mqar key's value; 8 reads a passkey back)."""

    def __init__(self, context):
        super().__init__()
        self.context = context

    def forward(self, tokens):
        B, L = tokens.shape
        logits = torch.zeros(B, L, 256)
        c = self.context
        for b in range(B):
            row = tokens[b].numpy()
            windows = np.lib.stride_tricks.sliding_window_view(row, c)           # (L - c + 1, c), window i ends at i + c - 1
            same = (windows[:, None, :] == windows[None, :, :]).all(-1)         # (W, W)
            same = np.tril(same, -1)                                             # only earlier windows
            for i in range(len(windows)):
                earlier = np.flatnonzero(same[i])
                if earlier.size and earlier[-1] + c < L:
                    logits[b, i + c - 1, row[earlier[-1] + c]] = 10.0
        return logits


def test_alphabet_is_two_disjoint_quarters_of_the_upper_half():
    assert mqar.alphabet(256) == (range(128, 192), range(192, 256))
    keys, values = mqar.alphabet(4096)
    assert (keys.start, keys.stop, values.start, values.stop) == (2048, 3072, 3072, 4096)
    with pytest.raises(UsageError, match="1 to 64 pairs"):
        mqar.draw(np.random.default_rng(0), 65, 256, 0.0, 0)


def test_sequence_layout_by_hand_at_depth_0_and_1():
    # length 64, 2 pairs: 65 tokens, 57 of filler; pairs (130 -> 200), (150 -> 201), asked in the order 1, 0
    for depth, start in ((0.0, 0), (1.0, 57)):
        trial = mqar.Trial(keys=(130, 150), values=(200, 201), order=(1, 0), depth=depth, filler_start=5)
        tokens, asked, distances = mqar.sequence(STREAM, trial, 64, TOKENIZER)
        assert len(tokens) == 65
        assert tokens[start: start + 4].tolist() == [130, 200, 150, 201]             # k1 v1 k2 v2
        assert tokens[61:].tolist() == [150, 201, 130, 200]                           # q v q v, last token is a value
        assert asked.tolist() == [61, 63]                                             # target positions (tokens[1:])
        assert tokens[1:][asked].tolist() == [201, 200]                               # ... hold the queried values
        # query keys at 61 and 63, their keys in the pair block at start + 2 (pair 1) and start (pair 0)
        assert distances.tolist() == [61 - (start + 2), 63 - start]
        filler = np.concatenate([tokens[:start], tokens[start + 4: 61]])
        expected = STREAM[5: 5 + 57].astype(np.int64)
        expected[expected >= 128] = SPACE                                             # the alphabet cleaned out
        assert filler.tolist() == expected.tolist()
    assert distances.tolist() == [2, 6]                                               # depth 1: right before the queries
    # the model reads the space where a queried value stands: a value is a target, never an input
    inputs = mqar.model_inputs(tokens, asked, SPACE)
    assert inputs.shape == (64,) and inputs[61:].tolist() == [150, SPACE, 130]
    assert inputs[:61].tolist() == tokens[:61].tolist()                              # the rest as it is
    batch = mqar.model_inputs(np.stack([tokens, tokens]), np.stack([asked, asked]), SPACE)
    assert batch.tolist() == [inputs.tolist()] * 2


def test_the_answers_of_earlier_queries_are_not_inputs():
    """No query's value is an input, so a later query cannot learn which values were asked already:
    the pair block holds the only copy of each value the model reads."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(1, 9))
        trial = mqar.draw(rng, n, 256, float(rng.random()), int(rng.integers(0, 4000)))
        tokens, asked, _ = mqar.sequence(STREAM, trial, 100, TOKENIZER)
        inputs = mqar.model_inputs(tokens, asked, SPACE)
        start, query = mqar.layout(100, n, trial.depth)
        values = set(np.flatnonzero(inputs >= 192).tolist())                         # value tokens among the inputs
        assert values == set(range(start + 1, start + 2 * n, 2))                      # the pair block's, no others
        assert inputs[query:].tolist() == [t for k in np.asarray(trial.keys)[list(trial.order)]
                                           for t in (int(k), SPACE)][:100 - query]


def test_task_tokens_occur_only_in_the_pair_block_and_the_queries():
    stream = np.random.default_rng(1).integers(0, 256, 5000).astype(np.uint8)         # every byte, half of them task tokens
    rng = np.random.default_rng(2)
    for _ in range(20):
        n = int(rng.integers(1, 9))
        trial = mqar.draw(rng, n, 256, float(rng.random()), int(rng.integers(0, 4000)))
        tokens, asked, distances = mqar.sequence(stream, trial, 100, TOKENIZER)
        start, query = mqar.layout(100, n, trial.depth)
        task = set(np.flatnonzero(tokens >= 128).tolist())
        assert task == set(range(start, start + 2 * n)) | set(range(query, 101))
        block = tokens[start: start + 2 * n]
        for j, key in enumerate(trial.keys):
            assert block[0::2].tolist().count(key) == 1 and block[2 * j + 1] == trial.values[j]
        assert (tokens[asked] == np.asarray(trial.keys)[list(trial.order)]).all()     # the query keys
        assert (tokens[asked - distances] == tokens[asked]).all()                     # distance back: the same key
        assert (tokens[asked - distances + 1] == tokens[asked + 1]).all()             # ... followed by the answer


def test_min_length_and_a_length_too_short():
    trial = mqar.Trial((130, 131), (200, 200), (0, 1), 0.5, 0)
    assert mqar.min_length(2) == 7
    tokens, asked, _ = mqar.sequence(STREAM, trial, 7, TOKENIZER)                     # no filler at all
    assert tokens.tolist() == [130, 200, 131, 200, 130, 200, 131, 200] and asked.tolist() == [4, 6]
    with pytest.raises(UsageError, match="at least 7 tokens, got 6"):
        mqar.sequence(STREAM, trial, 6, TOKENIZER)
    with pytest.raises(UsageError, match="another vocabulary size"):
        mqar.sequence(STREAM, mqar.Trial((2100,), (3100,), (0,), 0.0, 0), 20, TOKENIZER)   # drawn for bpe:4096


def test_trials_are_fixed_with_distinct_keys_and_values_with_replacement():
    a = mqar.trials(10_000, 200, [0.0, 0.5], 3, 4, seed=0)
    assert a == mqar.trials(10_000, 200, [0.0, 0.5], 3, 4, seed=0) != mqar.trials(10_000, 200, [0.0, 0.5], 3, 4, seed=1)
    assert [t.depth for t in a] == [0.0] * 3 + [0.5] * 3 and max(t.filler_start for t in a) <= 10_000 - 201
    for t in a:
        assert len(set(t.keys)) == 4 and all(128 <= k < 192 for k in t.keys) and all(192 <= v < 256 for v in t.values)
        assert sorted(t.order) == [0, 1, 2, 3]
    full = mqar.trials(10_000, 300, [0.0], 2, 64)                                     # every key of the alphabet
    for t in full:
        assert sorted(t.keys) == list(range(128, 192))
        assert len(set(t.values)) < 64                                                # values drawn with replacement


def test_distance_bins_are_powers_of_two():
    assert [mqar.distance_bin(d) for d in (1, 2, 3, 4, 7, 8, 63, 64)] == \
        [(1, 2), (2, 4), (2, 4), (4, 8), (4, 8), (8, 16), (32, 64), (64, 128)]


def test_accuracy_scores_each_query_at_its_value():
    trial_list = mqar.trials(STREAM.size, 80, [0.0, 1.0], 2, 3)
    sequences = [mqar.sequence(STREAM, t, 80, TOKENIZER) for t in trial_list]
    answers = {tuple(mqar.model_inputs(s, a, SPACE).tolist()): s.tolist() for s, a, _ in sequences}
    perfect = mqar.accuracy(NextToken(answers), STREAM, trial_list, 80, TOKENIZER, "cpu", max_batch_tokens=160)
    assert [a.correct for a in perfect] == [True] * 12
    assert [a.trial for a in perfect] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert [a.distance for a in perfect] == [d for _, _, ds in sequences for d in ds.tolist()]
    late = mqar.accuracy(NextToken(answers, shift=1), STREAM, trial_list, 80, TOKENIZER, "cpu")
    assert not any(a.correct for a in late)                                           # one position off: the next key
    fixed = mqar.accuracy(NextToken(fixed=trial_list[0].values[0]), STREAM, trial_list, 80, TOKENIZER, "cpu")
    assert [a.correct for a in fixed] == [v == trial_list[0].values[0] for t in trial_list
                                          for v in np.asarray(t.values)[list(t.order)]]
    wrong = dict(answers)                                                             # the last query of trial 1 off
    key = tuple(mqar.model_inputs(sequences[1][0], sequences[1][1], SPACE).tolist())
    wrong[key] = answers[key][:-1] + [192 if answers[key][-1] != 192 else 193]
    assert [a.correct for a in mqar.accuracy(NextToken(wrong), STREAM, trial_list, 80, TOKENIZER, "cpu")] == \
        [True] * 5 + [False] + [True] * 6


def test_training_batches_weight_answers_text_and_random_tokens():
    config = TrainConfig(task="mqar", mqar_pairs=3, batch_size=5, answer_weight=5.0, text_weight=0.5,
                         depth_curriculum=100)
    tokens = torch.from_numpy(STREAM.copy())
    x, y, w = training_batch(tokens, 10, config, 64, TOKENIZER)
    again = training_batch(tokens, 10, config, 64, TOKENIZER)
    assert torch.equal(x, again[0]) and torch.equal(w, again[2])                    # a function of (seed, step)
    assert not torch.equal(training_batch(tokens, 11, config, 64, TOKENIZER)[0], x)
    assert x.shape == y.shape == w.shape == (5, 64)
    # the targets are the trial's tokens shifted; the inputs the same but the space where a queried value
    # stands (tokens 60 and 62; 64, the last value, is a target only)
    assert torch.equal(y[:, :-1][:, list(range(59)) + [60, 62]], x[:, 1:][:, list(range(59)) + [60, 62]])
    assert (x[:, [60, 62]] == SPACE).all() and (y[:, [59, 61, 63]] >= 192).all()
    # 65 tokens, 3 pairs: 53 of filler, queries at tokens 59, 61, 63; values at 60, 62, 64 = targets 59, 61, 63
    assert (w[:, [59, 61, 63]] == 5.0).all() and (w[:, [58, 60, 62]] == 0.0).all()
    room = 65 - 12
    for row in range(5):
        full = torch.cat([x[row, :1], y[row]])                                        # (65,) the trial's tokens
        block = [p for p in range(59) if full[p] >= 128]                              # the pair block
        assert len(block) == 6 and block == list(range(block[0], block[0] + 6))
        assert block[0] >= round(0.9 * room) - 1                                      # step 10 of 100: near the queries
        pairs = dict(zip(full[block[0]: block[0] + 6: 2].tolist(), full[block[0] + 1: block[0] + 6: 2].tolist()))
        assert len(pairs) == 3 and [pairs[int(full[q])] for q in (59, 61, 63)] == full[[60, 62, 64]].tolist()
        zero = {p - 1 for p in block if p >= 1} | {58, 60, 62}
        for p in range(64):
            expected = 5.0 if p in (59, 61, 63) else 0.0 if p in zero else 0.5
            assert w[row, p] == expected, (row, p)
    val = validation_batches(tokens, TrainConfig(task="mqar", mqar_pairs=3, batch_size=3, eval_batches=2), 64, TOKENIZER)
    assert len(val) == 2 and val[0][0].shape == val[0][1].shape == (3, 64) and (val[0][2][:, [59, 61, 63]] == 1.0).all()
    assert (val[0][0][:, [60, 62]] == SPACE).all()
    assert torch.equal(val[0][0], validation_batches(tokens, TrainConfig(task="mqar", mqar_pairs=3, batch_size=3,
                                                                         eval_batches=2), 64, TOKENIZER)[0][0])
    with pytest.raises(UsageError, match="mqar"):
        TrainConfig(task="mqaar")


PAIRS3 = {"mqar": {"pairs": 3}, "passkey": {}}


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_retrieval_accuracy_of_recall_oracles_keeps_the_mode(mode):
    stream = np.frombuffer(("Filler text of the validation split, no digits here. " * 100).encode(), dtype=np.uint8)
    for task, context, length in (("mqar", 1, 64), ("passkey", 8, 160)):
        model = Induction(context).train(mode == "train")
        assert retrieval_accuracy(model, task, stream, length, TOKENIZER, "cpu", trials=10, options=PAIRS3[task]) == 1.0
        assert model.training == (mode == "train")
        assert retrieval_accuracy(NextToken(fixed=SPACE).train(mode == "train"), task, torch.from_numpy(stream.copy()),
                                  length, TOKENIZER, "cpu", trials=10, options=PAIRS3[task]) == 0.0
    assert retrieval_accuracy(Induction(1), "mqar", stream, 64, TOKENIZER, "cpu", trials=10, options={"pairs": 16}) == 1.0
    with pytest.raises(UsageError, match="at least 63 tokens, got 60"):   # n_pairs reaches the trials
        retrieval_accuracy(Induction(1), "mqar", stream, 60, TOKENIZER, "cpu", trials=10, options={"pairs": 16})
    with pytest.raises(UsageError, match="retrieval task"):
        retrieval_accuracy(Induction(1), "lm", stream, 64, TOKENIZER, "cpu")


def test_job_takes_the_pairs_of_an_mqar_run():
    def pairs(train):
        return Job(*[None] * 11, train=train).options(TASKS["mqar"])["pairs"]
    assert pairs({"task": "mqar", "mqar_pairs": 2}) == 2
    assert pairs({"task": "passkey", "mqar_pairs": 2}) == 4
    assert pairs({}) == 4


def test_extrapolate_writes_mqar_rows_and_passkey_intervals(tmp_path):
    runner = CliRunner()
    file, run_dir = tmp_path / "e.toml", tmp_path / "run"
    file.write_text('preset = "tiny"\nvariants = ["alibi"]\nseeds = [0]\n[train]\nsteps = 3\neval_every = 3\n'
                    'checkpoint_every = 3\ntask = "mqar"\nmqar_pairs = 2\n')
    result = runner.invoke(app, ["train", "--config", str(file), "--run-dir", str(run_dir)])
    assert result.exit_code == 0, result.output
    command = ["extrapolate", "--run-dir", str(run_dir), "--lengths", "32", "128", "--task", "mqar", "passkey",
               "--trials", "2"]
    result = runner.invoke(app, command)
    assert result.exit_code == 0, result.output
    assert result.output.count("mqar L=") == 2 and "alibi" in result.output
    rows = pd.read_csv(run_dir / "mqar.csv")
    assert set(rows["status"]) == {"ok"} and (rows["n_pairs"] == 2).all() and (rows["trials"] == 2).all()
    for (_length, _depth), mine in rows.groupby(["length", "depth"]):
        assert mine["queries"].sum() == 2 * 2                                         # trials x pairs
    assert sorted(rows.groupby(["length", "depth"]).groups) == [(n, d) for n in (32, 128)
                                                                 for d in (0.0, 0.25, 0.5, 0.75, 1.0)]
    assert (rows["distance_high"] == 2 * rows["distance_low"]).all()
    assert (rows["accuracy"] == rows["correct"] / rows["queries"]).all()
    for _, row in rows.iterrows():
        assert (row["acc_low"], row["acc_high"]) == pytest.approx(wilson(row["correct"], row["queries"]))
    # length 32, 2 pairs: 25 filler tokens, queries at 29 and 31. Depth 0: keys at 0 and 2, distances 27 to 31;
    # depth 1: keys at 25 and 27, distances 2 to 6
    at = rows[rows["length"] == 32]
    assert set(at[at["depth"] == 0.0]["distance_low"]) == {16}
    assert set(at[at["depth"] == 1.0]["distance_low"]) <= {2, 4}
    keys = pd.read_csv(run_dir / "passkey.csv")
    ok = keys[keys["status"] == "ok"]
    assert set(ok["length"]) == {128} and set(keys[keys["length"] == 32]["status"]) == {"unsupported"}
    for _, row in ok.iterrows():
        assert (row["acc_low"], row["acc_high"]) == pytest.approx(wilson(row["correct"], row["trials"]))
        assert row["acc_low"] <= row["accuracy"] <= row["acc_high"]
    assert runner.invoke(app, command).output.count("mqar L=") == 0                  # nothing left to compute
    assert len(pd.read_csv(run_dir / "mqar.csv")) == len(rows)
