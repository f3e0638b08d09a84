"""The task registry: what `extrapolate --task NAME` measures, where its rows go, and whether a
model can be trained on it (`task = NAME` in [train]). Each task's module declares its `Task`, and
everything else (training batches, the criterion, evaluation, reach, decisions, report tables and
plots) reads it from here and names no task.

A *retrieval task* (`RetrievalTask`: passkey, mqar, and any registered after them) is one unit: its
generator of fixed, seeded trials, its training and validation sequences with their loss weights,
how a model's answers are scored, the CSV its rows go to and their columns, and how the report and
its plots name it. Its rows are accuracies with Wilson intervals, per length x condition (the
task's `axis`: the depth of the key, a probability of the generator, a number of hops), either one
row per condition pooling its trials or, for a `binned` task, one row per distance bin of its
answers (the queries whose evidence is that far back). Reach (evaluation/reach.py) and the
decisions (evaluation/decisions.py) pool a task's rows per length, whatever the task.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

from relbench.errors import NameTaken, UsageError, unknown
from relbench.stats import wilson


@dataclass(frozen=True)
class Task:
    name: str                 # as `--task` and `tasks = [...]` spell it
    csv: str                  # the CSV of the run directory `extrapolate` writes its rows to
    key: tuple[str, ...]      # the columns that identify a row: one already there is kept unless --force
    trains_as: str | None     # the training task (`task = ...` in [train]) of the same sequences, or None
    about: str                # one line: what a row says


class Answer(NamedTuple):
    trial: int                # index into the trial list
    distance: int | None      # a binned task: how far back the answer's evidence is (None: not binned)
    correct: bool


def distance_bin(distance: int) -> tuple[int, int]:
    """The power-of-two bin [low, high) that holds `distance` (>= 1): [1, 2), [2, 4), [4, 8), ..."""
    low = 1 << (int(distance).bit_length() - 1)
    return low, 2 * low


@torch.no_grad()
def teacher_forced(model, trial_list: list, sequence: Callable, length: int, device, max_batch_tokens: int,
                   whole: bool = False) -> list[Answer]:
    """The answers of `trial_list`, one forward pass per batch: `sequence(trial)` gives its (length + 1,)
    tokens, the target positions of its answers and their distances; an answer is right when the argmax
    at its position is the target there. `whole`: the positions are one answer, right when all are, and
    the distance is the trial's."""
    model.eval()
    out = []
    per_batch = max(1, max_batch_tokens // length)
    for b in range(0, len(trial_list), per_batch):
        batch = [sequence(t) for t in trial_list[b: b + per_batch]]
        tokens = torch.from_numpy(np.stack([tokens for tokens, _, _ in batch])).to(device)      # (B, length + 1)
        predicted = model(tokens[:, :-1]).argmax(-1)                                          # (B, length)
        for i, (_, positions, distances) in enumerate(batch):
            at = torch.as_tensor(np.asarray(positions), device=device)
            correct = predicted[i, at] == tokens[i, 1:][at]
            if whole:
                out.append(Answer(b + i, int(distances), bool(correct.all())))
            else:
                out += [Answer(b + i, int(d), bool(c)) for d, c in zip(distances, correct.tolist())]
    return out


def spread(stream_size: int, length: int, count: int) -> list[int]:
    """`count` filler offsets spread evenly over a stream of `stream_size` tokens, each with room for
    a window of `length` + 1 (the fixed trials of every retrieval task start here)."""
    last = max(0, stream_size - length - 1)
    starts = np.linspace(0, last, count + 2)[1:-1] if count > 1 else [last / 2]
    return [int(s) for s in starts]


@dataclass(frozen=True)
class RetrievalTask(Task, abc.ABC):
    """A task trained to criterion and measured by accuracy at growing lengths. Subclasses implement
    the four methods below; the fields say how its rows and tables read."""
    label: str = ""                                   # as a title names it ("Passkey", "MQAR")
    short: str = ""                                   # as a column header names it ("passkey", "MQAR")
    axis: str = "depth"                               # the column of each fixed trial set's condition
    axis_values: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)   # the conditions evaluated (and validated)
    binned: bool = False                              # rows per distance bin of the answers, or one per condition
    place_label: str = "depth of the key"             # what a heatmap's rows are
    weigh_conditions: bool = False                    # a length's accuracy: the mean over conditions (each
                                                      # equal), not over answers (a task whose conditions
                                                      # give different answers per trial: flip-flop's reads)
    defaults: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)   # the generator's options

    @property
    def count(self) -> str:
        """The column of a row's answers: queries (binned) or trials."""
        return "queries" if self.binned else "trials"

    def place(self, value: float) -> str:
        """A heatmap row's label: a distance bin's start, a depth as a percentage, else the value."""
        return f"{int(value):g}" if self.binned else f"{value:.0%}" if self.axis == "depth" else f"{value:g}"

    def title(self) -> str:
        pooled = "all queries pooled" if self.binned else f"all {self.axis}s pooled"
        pooled = f"the mean over {self.axis} of its answers pooled" if self.weigh_conditions else pooled
        return (f"{self.label} accuracy ({pooled}; mean over the seeds that learned, per seed in brackets; one "
                f"learned seed: its Wilson 95% interval), and reach: the longest length at 90% or more")

    def options(self, train: Mapping[str, Any]) -> dict[str, Any]:
        """The generator's options of a run whose [train] table is `train` (its defaults for a run
        trained on another task), checked."""
        given = dict(train.get("task_options") or {}) if train.get("task") == self.name else {}
        unknown_keys = sorted(set(given) - set(self.defaults))
        if unknown_keys:
            raise UsageError(f"task_options: {', '.join(unknown_keys)} is not an option of task {self.name} "
                             f"(its options: {', '.join(self.defaults) or 'none'})")
        out = {**self.defaults, **given}
        self.check(out)
        return out

    def check(self, options: Mapping[str, Any]) -> None:
        """Raise a one-line UsageError when an option is out of range (none by default)."""

    def columns(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The options a row records, part of its key (mqar: n_pairs)."""
        return {}

    @abc.abstractmethod
    def min_length(self, tokenizer, options: Mapping[str, Any]) -> int:
        """The shortest window a trial fits in."""

    @abc.abstractmethod
    def trials(self, stream_size: int, length: int, values: list[float], per_value: int, tokenizer,
               options: Mapping[str, Any], seed: int = 0) -> list:
        """A fixed, seeded set of trials: `per_value` for each condition in `values`, in that order,
        the same for every variant (they depend on nothing else)."""

    @abc.abstractmethod
    def answers(self, model, stream: np.ndarray, plan: list, length: int, tokenizer, device,
                max_batch_tokens: int, options: Mapping[str, Any]) -> list[Answer]:
        """Every answer of every trial in `plan`, trial by trial."""

    @abc.abstractmethod
    def batch(self, stream: np.ndarray, rng: np.random.Generator, count: int, length: int, tokenizer,
              options: Mapping[str, Any], answer_weight: float, text_weight: float,
              lowest: float) -> tuple[Any, Any, Any]:
        """(inputs, targets, loss weights) of `count` random training trials, (count, length) torch
        tensors each; `lowest` is the curriculum's easiest condition still drawn from (1 - s/N at step s
        of a depth_curriculum of N; 0: every condition)."""

    def score(self, answers: list[Answer], per_value: int) -> float:
        """The accuracy of answers to trials drawn `per_value` per condition (trial i of condition
        i // per_value): over the answers, or with `weigh_conditions` the mean of each condition's."""
        if not self.weigh_conditions:
            return float(np.mean([a.correct for a in answers]))
        by_value: dict[int, list[bool]] = {}
        for answer in answers:
            by_value.setdefault(answer.trial // per_value, []).append(answer.correct)
        return float(np.mean([np.mean(correct) for correct in by_value.values()]))

    def rows(self, common: dict[str, Any], answers: list[Answer]) -> list[dict[str, Any]]:
        """The rows of one condition's answers: one pooling them, or one per distance bin."""
        if not self.binned:
            correct = sum(a.correct for a in answers)
            low, high = wilson(correct, len(answers))
            return [{**common, "status": "ok", "correct": correct, "accuracy": correct / len(answers),
                     "acc_low": low, "acc_high": high, "message": ""}]
        bins: dict[tuple[int, int], list[bool]] = {}
        for answer in answers:
            bins.setdefault(distance_bin(answer.distance), []).append(answer.correct)
        out = []
        for (low, high), correct in sorted(bins.items()):
            acc_low, acc_high = wilson(sum(correct), len(correct))
            out.append({**common, "distance_low": low, "distance_high": high, "queries": len(correct),
                        "correct": sum(correct), "accuracy": sum(correct) / len(correct), "acc_low": acc_low,
                        "acc_high": acc_high, "status": "ok", "message": ""})
        return out

    def skipped_row(self, common: dict[str, Any], status: str, message: str) -> dict[str, Any]:
        """The one row of a condition that did not run, and why."""
        nan = float("nan")
        if not self.binned:
            return {**common, "status": status, "correct": nan, "accuracy": nan, "acc_low": nan, "acc_high": nan,
                    "message": message}
        return {**common, "distance_low": nan, "distance_high": nan, "queries": 0, "correct": nan, "accuracy": nan,
                "acc_low": nan, "acc_high": nan, "status": status, "message": message}


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


def retrieval_tasks() -> list[RetrievalTask]:
    """Every registered retrieval task, in registration order."""
    return [t for t in TASKS.values() if isinstance(t, RetrievalTask)]


def retrieval_task(name: str) -> RetrievalTask:
    """The retrieval task `name`, or one line naming the known ones."""
    known = {t.name: t for t in retrieval_tasks()}
    if name not in known:
        raise unknown("retrieval task", name, list(known))
    return known[name]


def training_tasks() -> list[str]:
    """What `task = ...` in [train] accepts: the training task of every registered task ("lm" for
    perplexity: windows of text)."""
    return list(dict.fromkeys(t.trains_as for t in TASKS.values() if t.trains_as))


PERPLEXITY = register_task(Task(
    "perplexity", "extrapolation.csv", ("variant", "seed", "length", "mode", "stride", "n_tokens", "segment"), "lm",
    "perplexity and bits per byte at a length, in a protocol (relbench/evaluation/perplexity.py)"))
