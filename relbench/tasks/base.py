"""The task registry: what `extrapolate --task NAME` measures, where its rows go, and whether a
model can be trained on it (`task = NAME` in [train]). Each task's module declares its `Task`;
how a task's rows are computed from a model lives with evaluation (relbench/evaluation/evaluators.py),
which takes the tasks from here rather than by name."""

from __future__ import annotations

from dataclasses import dataclass

from relbench.errors import NameTaken, unknown


@dataclass(frozen=True)
class Task:
    name: str                 # as `--task` and `tasks = [...]` spell it
    csv: str                  # the CSV of the run directory `extrapolate` writes its rows to
    key: tuple[str, ...]      # the columns that identify a row: one already there is kept unless --force
    trains_as: str | None     # the training task (`task = ...` in [train]) of the same sequences, or None
    about: str                # one line: what a row says


TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    if task.name in TASKS:
        raise NameTaken("task", task.name)
    TASKS[task.name] = task
    return task


def get_task(name: str) -> Task:
    """The registered task `name`, or the one-line error that lists the known ones."""
    if name not in TASKS:
        raise unknown("task", name, list(TASKS))
    return TASKS[name]


def training_tasks() -> list[str]:
    """What `task = ...` in [train] accepts: the training task of every registered task ("lm" for
    perplexity: windows of text)."""
    return list(dict.fromkeys(t.trains_as for t in TASKS.values() if t.trains_as))


PERPLEXITY = register_task(Task(
    "perplexity", "extrapolation.csv", ("variant", "seed", "length", "mode", "stride", "n_tokens", "segment"), "lm",
    "perplexity and bits per byte at a length, in a protocol (relbench/evaluation/perplexity.py)"))
