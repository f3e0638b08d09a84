"""The task registry: every task `extrapolate` measures is declared once, with its CSV and row key,
has an evaluator, and is what the config and the command line accept."""

import pytest
import torch

from relbench.config import EvalConfig, TrainConfig
from relbench.errors import UsageError
from relbench.evaluation import extrapolate
from relbench.evaluation.evaluators import evaluators
from relbench.runs import results
from relbench.tasks import TASKS, Answer, RetrievalTask, Task, get_task, register_task, training_tasks


def test_every_task_has_an_evaluator_and_a_csv_of_its_own():
    assert list(TASKS) == list(evaluators()) == ["perplexity", "copy", "passkey", "mqar", "flipflop", "tracking", "needles"]
    assert len({t.csv for t in TASKS.values()}) == len(TASKS)
    assert TASKS["perplexity"].csv == results.EXTRAPOLATION_CSV
    for name, evaluator in evaluators().items():
        assert evaluator.task is TASKS[name]
        assert extrapolate.Tables.keys()[evaluator.task.csv] == list(evaluator.task.key)
        assert {"variant", "seed"} <= set(evaluator.task.key)


def test_training_tasks_come_from_the_registry():
    assert sorted(training_tasks()) == ["flipflop", "lm", "mqar", "needles", "passkey", "tracking"]
    assert TASKS["copy"].trains_as is None                      # copy is measured, never trained on
    TrainConfig(task="mqar")
    with pytest.raises(UsageError, match='unknown training task "copy"'):
        TrainConfig(task="copy")


def test_an_unknown_task_is_one_line_naming_the_known_ones():
    with pytest.raises(UsageError, match=r'unknown task "pasky" \(did you mean "passkey"\?\); choose from: perplexity'):
        get_task("pasky")
    with pytest.raises(UsageError, match='unknown task "copies"'):
        EvalConfig(tasks=["copies"])
    with pytest.raises(ValueError, match="registered twice"):
        register_task(Task("copy", "other.csv", ("variant", "seed"), None, ""))


class FirstToken(RetrievalTask):
    """A toy retrieval task registered by this test: the window's first token, asked for at its end.
    One answer per trial (the prediction at the last input), correct when it is the first token."""

    def min_length(self, tokenizer, options):
        return 2

    def trials(self, stream_size, length, values, per_value, tokenizer, options, seed=0):
        return [(value, i) for value in values for i in range(per_value)]

    def sequence(self, trial, length):
        value, i = trial
        first = 65 + (i + int(10 * value)) % 26                          # a capital letter
        return torch.tensor([first] + [32] * (length - 1) + [first])     # (length + 1,)

    def answers(self, model, stream, plan, length, tokenizer, device, max_batch_tokens, options):
        tokens = torch.stack([self.sequence(t, length) for t in plan])
        predicted = model(tokens[:, :-1]).argmax(-1)[:, -1]
        return [Answer(i, None, bool(p == t)) for i, (p, t) in enumerate(zip(predicted, tokens[:, -1]))]

    def batch(self, stream, rng, count, length, tokenizer, options, answer_weight, text_weight, lowest):
        tokens = torch.stack([self.sequence((0.0, int(rng.integers(0, 26))), length) for _ in range(count)])
        weights = torch.full((count, length), float(text_weight))
        weights[:, -1] = float(answer_weight)
        return tokens[:, :-1], tokens[:, 1:], weights


@pytest.fixture
def toy_task():
    task = register_task(FirstToken("firsttoken", "firsttoken.csv", ("variant", "seed", "length", "depth", "trials"),
                                    "firsttoken", "first token recalled at the end", label="First token",
                                    short="first-token", axis_values=(0.0, 1.0)))
    yield task
    del TASKS[task.name]


def test_a_task_registered_from_a_test_module_runs_the_whole_path(tmp_path, toy_task):
    """Training, the criterion, extrapolate, reach and report.md take a task from the registry: one
    registered here, named by no code of relbench, is trained, evaluated and reported."""
    from typer.testing import CliRunner

    from relbench.cli import app

    assert "firsttoken" in training_tasks() and list(evaluators())[-1] == "firsttoken"
    runner, run_dir = CliRunner(), tmp_path / "run"
    file = tmp_path / "t.toml"
    file.write_text('preset = "tiny"\nvariants = ["alibi"]\nseeds = [0]\n[train]\nsteps = 4\neval_every = 2\n'
                    'checkpoint_every = 4\ntask = "firsttoken"\ncriterion_accuracy = 0.95\ncriterion_trials = 10\n')
    result = runner.invoke(app, ["train", "--config", str(file), "--run-dir", str(run_dir)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["extrapolate", "--run-dir", str(run_dir), "--lengths", "32", "64", "--task",
                                 "firsttoken", "--trials", "4", "--not-learned"])
    assert result.exit_code == 0, result.output
    assert result.output.count("firsttoken L=") == 2
    rows = results.read_csv(run_dir / "firsttoken.csv")
    assert sorted(set(zip(rows["length"], rows["depth"]))) == [(32, 0.0), (32, 1.0), (64, 0.0), (64, 1.0)]
    assert (rows["trials"] == 4).all() and rows["accuracy"].between(0, 1).all()
    result = runner.invoke(app, ["report", "--run-dir", str(run_dir)])
    assert result.exit_code == 0, result.output
    report = (run_dir / "report.md").read_text()
    assert "First token accuracy (all depths pooled" in report and "first-token reach" in report
