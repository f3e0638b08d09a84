"""How `extrapolate` evaluates each registered task (relbench/tasks): for a variant x seed at one
length, which of the task's rows are still to do (`todo`), and those rows computed from the model
(`rows`), as updates of the task's CSV and the lines that report them. `evaluators()` gives one per
registered task; extrapolate.py plans units of work from them and never names a task.

    perplexity  -> extrapolation.csv (a row per length x protocol, see evaluation/perplexity.py) and
                   positions.csv (loss by position bin of each row)
    copy        -> copy.csv     (a row per copy distance; the inputs of the farthest copy of each
                   length have that length, the adjacent copy's go with the first length)
    a retrieval task (passkey, mqar, ...: relbench/tasks/base.py, RetrievalTask)
                -> its CSV      (a row per length x condition, e.g. passkey.csv per depth; a binned
                   task's per distance bin too: mqar.csv, the queries whose key is that far back)
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from relbench.attention import path_label, recording
from relbench.cost import memory
from relbench.cost.profiling import profile_one
from relbench.evaluation import perplexity as evaluate
from relbench.evaluation.perplexity import ScoredText, effective_stride, position_rows, windows
from relbench.model import GPT
from relbench.positions import forms
from relbench.tasks import Task, copying
from relbench.tasks.base import PERPLEXITY, Answer, RetrievalTask, retrieval_tasks

POSITIONS_CSV = "positions.csv"
# a perplexity row's bins go with it: its key but n_tokens, which a bin row holds for the bin (the
# row's own count as the key made a forced re-evaluation add its bins beside the old ones)
POSITIONS_KEY = [k for k in PERPLEXITY.key if k != "n_tokens"]
COST = ("bias_ms", "bias_peak_mb", "attention_ms", "attention_peak_mb")
LONG_COST = 16384   # from this length on, the layer cost is one timed call

Update = tuple[str, dict, list]   # (CSV name, key, rows): the rows replace those that match every value of the key
Left = Callable[[dict], bool]     # whether the row with these fields (beside the pair's own) is still to do


@dataclass(frozen=True)
class Skipped:
    status: str     # "unsupported" or "oom"
    message: str


@dataclass(frozen=True)
class Job:
    """What every unit of one `extrapolate` command shares."""
    text: ScoredText
    lengths: tuple[int, ...]
    modes: tuple[str, ...]
    stride: int | None
    tasks: tuple[str, ...]
    trials: int
    max_batch_tokens: int
    backend: str
    device: torch.device
    tokenizer: Any
    force: bool = False
    train: dict[str, Any] = field(default_factory=dict)   # the run's [train] table: a retrieval task's options
    not_learned: bool = False   # also evaluate a task on models trained to criterion on it that did not learn it
    announce: Callable[[str], None] | None = None   # prints, before a long retrieval cell, its cost per trial

    def options(self, task: RetrievalTask) -> dict[str, Any]:
        """`task`'s generator options: the run's own when it trained on that task (mqar's pairs), its
        defaults otherwise."""
        return task.options(self.train)


ANNOUNCE_FROM = 16   # a retrieval cell at this many times the training length or more announces its cost first


def announce_cost(job: Job, task: str, label: str, base: dict[str, Any], length: int, trials: int,
                  one_trial: Callable[[], Any]) -> None:
    """Time `one_trial` (the cell's first trial, which the cell then runs again with the rest) and say
    what the cell will take, when `job.announce` is set and `length` is ANNOUNCE_FROM x the training
    length or more: at 512x one cell is minutes to hours, and the user learns which before it starts."""
    train_length = base.get("train_length") or length
    if job.announce is None or length < ANNOUNCE_FROM * train_length or trials < 2:
        return
    start = time.perf_counter()
    one_trial()
    seconds = time.perf_counter() - start
    total = seconds * trials
    job.announce(f"{label} {task} L={length}: {seconds:.2f} s for one trial (timed alone), {trials} trials: "
                 f"about {f'{total:.0f} s' if total < 120 else f'{total / 60:.1f} min'} for this length")


def update(task_csv: str, key: list[str] | tuple[str, ...], rows: list[dict[str, Any]]) -> Update:
    """The update that puts `rows`, which share one key, in place of those with that key."""
    shared = {k: rows[0][k] for k in key}
    if any({k: r[k] for k in key} != shared for r in rows):
        raise ValueError(f"rows of one {task_csv} update with different keys")
    return task_csv, shared, rows


def unfit(model: GPT, length: int, per_batch: int, backend: str, device: torch.device) -> Skipped | None:
    """Why `length` cannot run: beyond the scheme's positions, or more memory than the device has (on
    CPU the kernel would kill the process rather than raise); None when it can."""
    if model.max_length is not None and length > model.max_length:
        return Skipped("unsupported", f"no position representation beyond {model.max_length}")
    placed = any(enc.form is not None and enc.form.places for enc in model.positions)   # a dense bias per sequence
    biased = any(enc.adds_bias for enc in model.positions)
    need = memory.evaluation_bytes(model.config, backend, length, per_batch, biased, dense_bias=placed)
    have = memory.budget(device)
    if have is not None and need > have:
        return Skipped("oom", f"skipped: {backend} attention at length {length} needs about {memory.human(need)}, "
                              f"{memory.human(have)} available on {device}")
    return None


def guarded(compute, length: int, device: torch.device):
    """compute(), or Skipped("oom") when it runs out of memory."""
    try:
        return compute()
    except (RuntimeError, MemoryError) as error:
        if not memory.is_out_of_memory(error):
            raise
        return Skipped("oom", f"out of memory at length {length} on {device}")


def not_learned(meta: dict[str, Any], task: str, spec: str = "") -> str | None:
    """Why a checkpoint is not evaluated on `task`, or None: it was trained to criterion on that
    task and did not learn it, so its accuracy at longer lengths would say nothing (a model that
    never learned a task at 1x is *not learned*, not one that fails to extrapolate). A `spec` read at
    other positions than the criterion checked (the `drawn` form) is evaluated: its accuracy at the
    training length decides whether it learned (evaluation/reach.py)."""
    if spec and forms.places_positions(spec):
        return None
    train, summary = meta.get("train", {}), meta.get("summary", {})
    if train.get("task") != task or not train.get("criterion_accuracy") or summary.get("learned") is not False:
        return None
    accuracy = summary.get("val_accuracy")
    last = f"{accuracy:.0%} at its last check, " if accuracy is not None else ""
    return f"{task} not learned at its training length ({last}{summary.get('steps', '?')}-step cap): not evaluated"


class Evaluator(abc.ABC):
    """A task's evaluation. `todo` lists the work items of one variant x seed at `lengths[index]`
    still to do (protocols, distances, depths: hashable, picklable); `rows` computes them from the
    run's moments ([train] moments; one model for most runs), the finished model last."""

    task: Task

    @abc.abstractmethod
    def todo(self, job: Job, index: int, left: Left) -> tuple:
        """The work items still to do at `job.lengths[index]`."""

    @abc.abstractmethod
    def rows(self, models: Sequence[GPT], base: dict[str, Any], length: int, items: tuple, job: Job,
             costs: dict[tuple[str, int], dict], label: str) -> tuple[list[Update], list[str]]:
        """The updates of the task's CSV (and any other) and the lines that report them; `label` starts
        every line ("xl           seed 0")."""


def protocol_label(text: ScoredText, mode: str, stride: int | None) -> str:
    """What a perplexity row scored and how, e.g. "sliding, stride 128, 32,768 tokens in 8 segments of
    4,096": rows with different labels are different measurements."""
    how = f"{mode}, stride {stride}" if mode == "sliding" else mode
    return f"{how}, {text.n_tokens:,} tokens in {len(text.offsets)} segments of {text.segment:,}"


def perplexity_row(model: GPT, base: dict[str, Any], text: ScoredText, length: int, mode: str, stride: int | None,
                   max_batch_tokens: int, backend: str, device: torch.device) -> tuple[dict, evaluate.Perplexity | None]:
    """One tidy row (perplexity at `length` in `mode`) and the full result, or None if it did not run."""
    step = effective_stride(mode, stride, length)
    row = {**base, "length": length, "mode": mode, "protocol": protocol_label(text, mode, stride),
           "window": length, "stride": step, "segment": text.segment,
           "n_tokens": text.n_tokens, "n_windows": len(windows(text, length, mode, stride)), "attention": backend,
           "path": "",
           "status": "ok", "loss": float("nan"), "ppl": float("nan"), "ppl_low": float("nan"),
           "ppl_high": float("nan"), "n_bytes": float("nan"), "bits_per_byte": float("nan"), "eval_s": float("nan"),
           "tokens_per_s": float("nan"),
           **{k: float("nan") for k in COST}, "message": ""}
    outcome = unfit(model, length, max(1, max_batch_tokens // length), backend, device)
    if outcome is None:
        with recording() as taken:
            outcome = guarded(lambda: evaluate.perplexity(model, text, length, max_batch_tokens, device, mode, stride),
                              length, device)
        row["path"] = path_label(taken)
    if isinstance(outcome, Skipped):
        row.update(status=outcome.status, message=outcome.message)
        return row, None
    result = outcome
    row.update(loss=result.loss, ppl=result.ppl, ppl_low=result.ppl_low, ppl_high=result.ppl_high,
               n_bytes=result.n_bytes, bits_per_byte=result.bits_per_byte, eval_s=result.seconds,
               tokens_per_s=result.n_tokens / result.seconds)
    return row, result


def layer_cost(model: GPT, length: int, backend: str, device: torch.device) -> dict:
    """Cost of one layer of this model's shape (batch 1): bias construction and attention, the median
    of 3 calls after a warm-up; from 16384 on one call (each takes as long as the perplexity pass
    of a layer, and the calls differ by a few percent there)."""
    config = model.config
    cost = profile_one(config.position, backend, length, batch=1, heads=config.n_heads, head_dim=config.head_dim,
                       device=str(device), repeats=3 if length < LONG_COST else 1, train_max=0,
                       train_length=config.train_length)
    return {k: float("nan") if cost.get(k) is None else cost[k] for k in COST}


class PerplexityEvaluator(Evaluator):
    task = PERPLEXITY

    def todo(self, job: Job, index: int, left: Left) -> tuple:
        length = job.lengths[index]
        return tuple(mode for mode in job.modes if left(
            {"length": length, "mode": mode, "stride": effective_stride(mode, job.stride, length),
             "n_tokens": job.text.n_tokens, "segment": job.text.segment}))

    def rows(self, models, base, length, items, job, costs, label):
        """The perplexity rows of the finished model (with the layer cost, measured once per trained
        scheme and length) and their position bins."""
        updates, lines, model = [], [], models[-1]
        for mode in items:
            row, result = perplexity_row(model, base, job.text, length, mode, job.stride, job.max_batch_tokens,
                                         job.backend, job.device)
            if result is not None:
                # the trained scheme's cost, measured once for it and every evaluation form of it
                cost_key = (forms.scheme_spec(base["variant"]), length)
                if cost_key not in costs:
                    costs[cost_key] = layer_cost(model, length, job.backend, job.device)
                row.update(costs[cost_key])
                key = {k: row[k] for k in POSITIONS_KEY}
                updates.append((POSITIONS_CSV, key, position_rows(result, key)))
            updates.append(update(self.task.csv, self.task.key, [row]))
            shown = (f"ppl {row['ppl']:.3f}, {row['bits_per_byte']:.4f} bits/byte" if row["status"] == "ok"
                     else row["status"])
            lines.append(f"{label} L={length:<6} {mode:<10} {shown:<32} "
                         + (f"{row['eval_s']:.1f}s" if row["status"] == "ok" else row["message"]))
        return updates, lines


class CopyEvaluator(Evaluator):
    task = copying.TASK

    def todo(self, job: Job, index: int, left: Left) -> tuple:
        length = job.lengths[index]
        mine = [(d, n) for d, n in copying.distances(list(job.lengths))
                if n == length or (index == 0 and n not in job.lengths)]
        return tuple((d, n) for d, n in mine if left({"distance": d, "trials": job.trials}))

    def rows(self, models, base, length, items, job, costs, label):
        updates, lines = [], []
        for distance, inputs in items:      # the finished model's
            row = self.row(models[-1], base, distance, inputs, job)
            updates.append(update(self.task.csv, self.task.key, [row]))
            shown = f"ratio {row['ratio']:.3f}" if row["status"] == "ok" else f"{row['status']} {row['message']}"
            lines.append(f"{label} copy d={distance:<6} {shown}")
        return updates, lines

    @staticmethod
    def row(model: GPT, base: dict[str, Any], distance: int, length: int, job: Job) -> dict:
        """The copy row at `distance` (inputs of `length` tokens)."""
        row = {**base, "distance": distance, "length": length, "trials": job.trials, "status": "ok",
               "loss_copy": float("nan"), "loss_control": float("nan"), "ratio": float("nan"),
               "ratio_low": float("nan"), "ratio_high": float("nan"), "message": ""}
        outcome = unfit(model, length, max(1, job.max_batch_tokens // length), job.backend, job.device)
        if outcome is None:
            outcome = guarded(lambda: copying.copy_losses(model, job.text.tokens, distance, job.trials, job.device,
                                                          job.max_batch_tokens), length, job.device)
        if isinstance(outcome, Skipped):
            row.update(status=outcome.status, message=outcome.message)
        else:
            low, high = outcome.interval()
            row.update(loss_copy=float(outcome.loss_copy.mean()), loss_control=float(outcome.loss_control.mean()),
                       ratio=outcome.ratio, ratio_low=low, ratio_high=high)
        return row


class RetrievalEvaluator(Evaluator):
    """Any retrieval task (relbench/tasks/base.py, RetrievalTask): per length, a fixed trial set for
    each of the task's conditions, scored in one pass, its rows by condition (or distance bin)."""

    def __init__(self, task: RetrievalTask):
        self.task = task

    def todo(self, job: Job, index: int, left: Left) -> tuple:
        columns = self.task.columns(job.options(self.task))
        return tuple(v for v in self.task.axis_values
                     if left({"length": job.lengths[index], self.task.axis: v, "trials": job.trials, **columns}))

    def rows(self, models, base, length, items, job, costs, label):
        per_value = self.value_rows(models, base, length, items, job)
        value = "{:.2f}" if self.task.axis == "depth" else "{:g}"

        def accuracy(rows: list[dict]) -> float:
            return sum(r["correct"] for r in rows) / sum(r[self.task.count] for r in rows)
        shown = " ".join(f"{value.format(rows[0][self.task.axis])}:{accuracy(rows):.0%}" if rows[0]["status"] == "ok"
                         else rows[0]["status"] for rows in per_value)
        return ([update(self.task.csv, self.task.key, rows) for rows in per_value],
                [f"{label} {self.task.name} L={length:<6} {shown}"])

    def value_rows(self, models: Sequence[GPT], base: dict[str, Any], length: int, values: tuple[float, ...],
                   job: Job) -> list[list[dict]]:
        """The task's rows at `length`, for each condition in `values` (its rows by distance bin, or one
        pooling its trials; one row with the reason when the length did not run), the trials of each
        condition dealt among the run's moments (`dealt`)."""
        task, options = self.task, job.options(self.task)
        tokens = job.text.tokens.numpy()
        outcome = unfit(models[-1], length, max(1, job.max_batch_tokens // length), job.backend, job.device)
        shortest = task.min_length(job.tokenizer, options)
        if outcome is None and length < shortest:
            outcome = Skipped("unsupported", f"a {task.name} trial needs at least {shortest} tokens")
        # the full, fixed set of trials, of which the conditions still to do are taken: the same trials
        # whatever was computed before
        every = task.trials(tokens.size, length, list(task.axis_values), job.trials, job.tokenizer, options)
        plan = [t for i, t in enumerate(every) if task.axis_values[i // job.trials] in values]
        if outcome is None:
            def run(model: GPT, trials: list) -> list[Answer]:
                return task.answers(model, tokens, trials, length, job.tokenizer, job.device, job.max_batch_tokens,
                                    options)
            announce_cost(job, task.name, f"{base['variant']:<12} seed {base['seed']}", base, length, len(plan),
                          lambda: run(models[-1], plan[:1]))
            outcome = guarded(lambda: dealt(models, plan, job.trials, run), length, job.device)
        out = []
        for i, value in enumerate(values):
            common = {**base, "length": length, task.axis: value, "trials": job.trials, **task.columns(options)}
            if isinstance(outcome, Skipped):
                out.append([task.skipped_row(common, outcome.status, outcome.message)])
            else:
                out.append(task.rows(common, [a for a in outcome if i * job.trials <= a.trial < (i + 1) * job.trials]))
        return out


def dealt(models: Sequence[GPT], plan: list, per_value: int,
          run: Callable[[GPT, list], list[Answer]]) -> list[Answer]:
    """The answers to `plan` (`per_value` trials per condition, in blocks) with its trials dealt among a
    run's moments: trial i of each condition to moment i mod K, so every condition is measured at every
    moment, each trial once, and a cell costs what it costs with one model. Answers in trial order."""
    if len(models) == 1:
        return run(models[0], plan)
    out = []
    for index, model in enumerate(models):
        mine = [i for i in range(len(plan)) if i % per_value % len(models) == index]
        out += [a._replace(trial=mine[a.trial]) for a in run(model, [plan[i] for i in mine])] if mine else []
    return sorted(out, key=lambda a: a.trial)


def evaluators() -> dict[str, Evaluator]:
    """One evaluator per registered task, in the order a unit evaluates them (and prints their lines):
    perplexity, copy, then every retrieval task as registered (a task registered later, by a plugin or
    a test, is evaluated as the shipped ones are)."""
    out: dict[str, Evaluator] = {"perplexity": PerplexityEvaluator(), "copy": CopyEvaluator()}
    return {**out, **{task.name: RetrievalEvaluator(task) for task in retrieval_tasks()}}
