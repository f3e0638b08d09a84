"""Flip-flop language modelling (relbench/tasks/flipflop.py): the generator against a register run by
hand, the layout and distances, oracle models scored through the task's answers and the shared
evaluator, the training weights, the options, and the whole path train -> extrapolate -> report."""

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from relbench.cli import app
from relbench.config import TrainConfig
from relbench.data.tokenizer import ByteTokenizer
from relbench.errors import UsageError
from relbench.tasks import TASKS, flipflop

TOKENIZER = ByteTokenizer()
TASK = TASKS["flipflop"]


def register(ops: np.ndarray, bits: np.ndarray) -> list[int]:
    """The bit each read returns, by running a one-bit register over the program."""
    state, out = None, []
    for op, bit in zip(ops, bits):
        if op == 0:
            state = bit
        elif op == 1:
            out.append(state)
    return out


class LastWrite(torch.nn.Module):
    """The perfect flip-flop model: at every `r` it predicts the bit after the latest earlier `w`;
    `stale` reads the write before that one instead (a glitch that grows with sparse writes)."""

    def __init__(self, stale: bool = False):
        super().__init__()
        self.stale = stale

    def forward(self, tokens):
        B, L = tokens.shape
        logits = torch.zeros(B, L, 256)
        for b in range(B):
            writes = []
            for p in range(L):
                if tokens[b, p] == ord("w") and p + 1 < L:
                    writes.append(int(tokens[b, p + 1]))
                if tokens[b, p] == ord("r") and writes:
                    pick = writes[-2] if self.stale and len(writes) > 1 else writes[-1]
                    logits[b, p, pick] = 10.0
        return logits


class Constant(torch.nn.Module):
    def __init__(self, token: int):
        super().__init__()
        self.token = token

    def forward(self, tokens):
        logits = torch.zeros(*tokens.shape, 256)
        logits[..., self.token] = 10.0
        return logits


@pytest.mark.parametrize("p_ignore", [0.1, 0.8, 0.98])
def test_program_is_a_register_with_the_papers_probabilities(p_ignore):
    ops, bits = flipflop.program(flipflop.Trial(p_ignore, 7), 20000)
    assert ops[0] == 0 and ops[-1] == 1
    reads = np.flatnonzero(ops == 1)
    assert bits[reads].tolist() == register(ops, bits)                   # a read's bit is the last write's
    inner = ops[1:-1]
    assert abs((inner == 2).mean() - p_ignore) < 0.01                   # ignores at p_i
    assert abs((inner == 0).mean() - (1 - p_ignore) / 2) < 0.01          # writes and reads share the rest
    assert abs((inner == 1).mean() - (1 - p_ignore) / 2) < 0.01
    written = bits[ops != 1]
    assert abs(written.mean() - 0.5) < 0.02                              # writes and ignores are fair coins


@pytest.mark.parametrize("length", [32, 33, 64])
def test_sequence_layout_reads_and_distances_by_hand(length):
    trial = flipflop.Trial(0.8, 3)
    tokens, reads, distances = flipflop.sequence(trial, length, TOKENIZER)
    assert tokens.shape == (length + 1,)
    text = bytes(tokens.tolist()).decode()
    pad = 1 if length % 2 == 0 else 2
    assert text[:pad] == " " * pad and text[-2] == "r" and text[-1] in "01"
    body = text[pad:]
    assert set(body[0::2]) <= set("wri") and set(body[1::2]) <= set("01") and body[0] == "w"
    assert [text[p] for p in reads] == ["r"] * body[0::2].count("r")      # every read, and only reads
    for p, d in zip(reads, distances):
        last = text.rindex("w", 0, p)
        assert d == p - last >= 2                                        # tokens from the last write
        assert text[p + 1] == text[last + 1]                             # its target is that write's bit


def test_a_short_program_by_hand():
    tokens, reads, distances = flipflop.sequence(flipflop.Trial(0.0, 1), 8, TOKENIZER)   # no ignores
    text = bytes(tokens.tolist()).decode()
    assert text[0] == " " and text[1] == "w" and text[7] == "r" and len(text) == 9
    assert reads[-1] == 7 and distances[-1] == 7 - text.rindex("w", 0, 7)


def test_oracle_scores_one_and_a_constant_scores_the_share_of_its_bit():
    plan = flipflop.trials(list(TASK.axis_values), 4)
    assert len(plan) == 12 and [t.p_ignore for t in plan[::4]] == [0.1, 0.8, 0.98]
    assert plan == flipflop.trials(list(TASK.axis_values), 4)              # fixed: the same for every variant
    answers = TASK.answers(LastWrite(), np.zeros(0), plan, 64, TOKENIZER, "cpu", 16384, {"p_ignore": 0.8})
    assert answers and all(a.correct for a in answers)
    expected = sum(len(flipflop.sequence(t, 64, TOKENIZER)[1]) for t in plan)
    assert len(answers) == expected and [a.trial for a in answers] == sorted(a.trial for a in answers)
    zeros = TASK.answers(Constant(ord("0")), np.zeros(0), plan, 64, TOKENIZER, "cpu", 16384, {})
    truth = [flipflop.sequence(t, 64, TOKENIZER) for t in plan]
    share = np.mean([tokens[p + 1] == ord("0") for tokens, reads, _ in truth for p in reads])
    assert np.mean([a.correct for a in zeros]) == pytest.approx(share)
    assert 0 < share < 1


def test_a_stale_model_fails_only_where_two_writes_differ_and_rows_bin_by_distance():
    plan = flipflop.trials([0.8], 20)
    answers = TASK.answers(LastWrite(stale=True), np.zeros(0), plan, 128, TOKENIZER, "cpu", 4096, {})
    wrong = [a for a in answers if not a.correct]
    assert wrong and len(wrong) < len(answers)
    rows = TASK.rows({"variant": "x", "p_ignore": 0.8}, answers)
    assert sum(r["queries"] for r in rows) == len(answers)
    for r in rows:
        mine = [a for a in answers if r["distance_low"] <= a.distance < r["distance_high"]]
        assert r["queries"] == len(mine) and r["correct"] == sum(a.correct for a in mine)
    assert rows[0]["distance_low"] == 2                                  # a read is at least 2 tokens after a write


def test_batch_weights_only_the_reads():
    rng = np.random.default_rng(0)
    x, y, w = TASK.batch(np.zeros(0), rng, 4, 32, TOKENIZER, {"p_ignore": 0.5}, 5.0, 0.25, 0.0)
    assert x.shape == y.shape == w.shape == (4, 32)
    assert torch.equal(x[:, 1:], y[:, :-1])
    read = x == ord("r")
    assert torch.equal(w == 5.0, read) and (w[~read] == 0.25).all()
    again = TASK.batch(np.zeros(0), np.random.default_rng(0), 4, 32, TOKENIZER, {"p_ignore": 0.5}, 5.0, 0.25, 0.0)
    assert torch.equal(again[0], x)


def test_options_are_checked_at_the_edge():
    assert TrainConfig(task="flipflop", task_options={"p_ignore": 0.5}).task_options == {"p_ignore": 0.5}
    with pytest.raises(UsageError, match="p_ignor is not an option of task flipflop"):
        TrainConfig(task="flipflop", task_options={"p_ignor": 0.5})
    for bad in (1.0, -0.1, "0.8", True):
        with pytest.raises(UsageError, match="p_ignore must be in"):
            TrainConfig(task="flipflop", task_options={"p_ignore": bad})
    with pytest.raises(UsageError, match="trains a language model"):
        TrainConfig(task="lm", task_options={"p_ignore": 0.5})
    with pytest.raises(UsageError, match="not an option of task mqar"):
        TrainConfig(task="mqar", task_options={"p_ignore": 0.5})
    assert TASK.options({"task": "flipflop", "task_options": {"p_ignore": 0.3}}) == {"p_ignore": 0.3}
    assert TASK.options({"task": "mqar", "task_options": {"other": 1}}) == {"p_ignore": 0.8}   # another task's run


def test_train_extrapolate_report_through_the_shared_path(tmp_path):
    runner = CliRunner()
    file, run_dir = tmp_path / "f.toml", tmp_path / "run"
    file.write_text('preset = "tiny"\nvariants = ["alibi"]\nseeds = [0]\n[train]\nsteps = 4\neval_every = 2\n'
                    'checkpoint_every = 4\ntask = "flipflop"\ntask_options = {p_ignore = 0.5}\n')
    result = runner.invoke(app, ["train", "--config", str(file), "--run-dir", str(run_dir)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["extrapolate", "--run-dir", str(run_dir), "--lengths", "32", "128", "--task",
                                 "flipflop", "--trials", "3"])
    assert result.exit_code == 0, result.output
    assert result.output.count("flipflop L=") == 2 and "0.1:" in result.output and "0.98:" in result.output
    rows = pd.read_csv(run_dir / "flipflop.csv")
    assert set(rows["status"]) == {"ok"} and (rows["trials"] == 3).all()
    assert sorted(set(zip(rows["length"], rows["p_ignore"]))) == [(n, p) for n in (32, 128) for p in (0.1, 0.8, 0.98)]
    for (length, p), mine in rows.groupby(["length", "p_ignore"]):
        plan = [t for t in flipflop.trials([0.1, 0.8, 0.98], 3) if t.p_ignore == p]
        assert mine["queries"].sum() == sum(len(flipflop.sequence(t, length, TOKENIZER)[1]) for t in plan)
    result = runner.invoke(app, ["report", "--run-dir", str(run_dir)])
    assert result.exit_code == 0, result.output
    report = (run_dir / "report.md").read_text()
    assert "Flip-flop accuracy (the mean over p_ignore of its answers pooled;" in report and "flip-flop reach" in report
    assert (run_dir / "plots" / "flipflop.png").is_file() or "not learned" in report


def test_a_lengths_accuracy_weighs_each_condition_equally():
    """Flip-flop's dense trials hold many more reads than its sparse ones: a length's accuracy is the
    mean of the conditions' (9/10 and 1/2: 0.70), not the reads pooled (10/12)."""
    from relbench.evaluation.reach import accuracy_by_length

    rows = pd.DataFrame([{"variant": "x", "seed": 0, "length": 64, "p_ignore": p, "queries": n, "correct": c,
                          "status": "ok"} for p, n, c in ((0.1, 6, 5), (0.1, 4, 4), (0.98, 2, 1))])
    weighed = accuracy_by_length(rows, "queries", "p_ignore")
    assert weighed["accuracy"].tolist() == pytest.approx([0.7]) and weighed["n"].tolist() == [12]
    assert accuracy_by_length(rows, "queries")["accuracy"].tolist() == pytest.approx([10 / 12])
    assert TASK.weigh_conditions and not TASKS["passkey"].weigh_conditions and not TASKS["mqar"].weigh_conditions


def test_the_criterion_weighs_each_condition_equally():
    """Training's check (retrieval_accuracy) scores flip-flop as reach does: the mean of the conditions'
    accuracies (trial i of condition i // per_value), where passkey's pools its answers."""
    from relbench.tasks import Answer

    answers = [Answer(0, 2, True)] * 9 + [Answer(1, 2, False)] + [Answer(4, 6, True), Answer(5, 6, False)]
    assert TASK.score(answers, 2) == pytest.approx(0.7)                   # (9/10 + 1/2) / 2; condition 1 no reads
    assert TASKS["passkey"].score(answers, 2) == pytest.approx(10 / 12)
