"""The task registry: every task `extrapolate` measures is declared once, with its CSV and row key,
has an evaluator, and is what the config and the command line accept."""

import pytest

from relbench.config import EvalConfig, TrainConfig
from relbench.errors import UsageError
from relbench.evaluation import extrapolate
from relbench.evaluation.evaluators import EVALUATORS
from relbench.runs import results
from relbench.tasks import TASKS, Task, get_task, register_task, training_tasks


def test_every_task_has_an_evaluator_and_a_csv_of_its_own():
    assert set(TASKS) == set(EVALUATORS) == {"perplexity", "copy", "passkey", "mqar"}
    assert len({t.csv for t in TASKS.values()}) == len(TASKS)
    assert TASKS["perplexity"].csv == results.EXTRAPOLATION_CSV
    for name, evaluator in EVALUATORS.items():
        assert evaluator.task is TASKS[name]
        assert extrapolate.Tables.KEYS[evaluator.task.csv] == list(evaluator.task.key)
        assert {"variant", "seed"} <= set(evaluator.task.key)


def test_training_tasks_come_from_the_registry():
    assert sorted(training_tasks()) == ["lm", "mqar", "passkey"]
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
