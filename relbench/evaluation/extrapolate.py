"""The `extrapolate` command's work: every trained variant x seed, at every length, for each task
registered in relbench/tasks, each evaluated by its evaluator (relbench/evaluation/evaluators.py,
which says what rows each task writes where), and on each pair's first unit attention.csv (how
far the model looks at its training length, hard windows).

Rows are written as each unit of work (a variant x seed at one length) finishes; under torchrun
the processes share the units and rank 0 writes the rows of each round (extrapolate_run). A row
already there for the same key (for perplexity the key holds the protocol: mode, effective
stride, scored tokens and segment length; for the tasks the number of trials, and for mqar the
number of pairs) is kept and not recomputed unless `force`, so an interrupted run computes only
the rest when run again, and rows of different protocols never replace each other. Every row
records the precision the model was trained in; evaluation is fp32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from relbench.errors import RelbenchError
from relbench.evaluation.evaluators import POSITIONS_CSV, POSITIONS_KEY, Job, Update, evaluators, not_learned
from relbench.evaluation.perplexity import ScoredText
from relbench.model import GPT
from relbench.positions import forms
from relbench.runs import checkpoints, distributed, results, rundir
from relbench.tasks import TASKS

ATTENTION_CSV = "attention.csv"   # how far each model looks at its training length (inspect.window_diagnostics)
ATTENTION_KEY = ["variant", "seed", "length"]
DONE = ("ok", "unsupported")


def attention_row(model: GPT, base: dict[str, Any], text: ScoredText, windows_used: int = 4) -> dict:
    """Attention reach at the training length, on the first window of up to `windows_used` segments."""
    from relbench.cost.inspection import window_diagnostics

    length = model.config.train_length
    starts = [offset + text.context for offset in text.offsets[:windows_used]]
    tokens = torch.stack([text.tokens[s: s + length] for s in starts]).to(next(model.parameters()).device)
    return {**base, "length": length, "windows": len(starts), "status": "ok", **window_diagnostics(model, tokens)}


def _read(path: Path, key: list[str]) -> pd.DataFrame:
    return results.read_csv(path, set(key) | {"status"}) if path.is_file() else pd.DataFrame()


def _done(table: pd.DataFrame, row: dict[str, Any], key: list[str]) -> bool:
    """Whether `table` holds a finished row (ok or unsupported) with `row`'s values in every key column."""
    if table.empty or any(k not in table.columns for k in key):
        return False
    same = table["status"].isin(DONE)
    for k in key:
        same &= table[k].astype(str) == str(row[k])
    return bool(same.any())


@dataclass(frozen=True)
class Unit:
    """The work on one variant x seed at one length: for each task its items still to do (the
    perplexity protocols, the copy distances whose inputs have this length, each retrieval task's
    conditions (passkey's depths); see evaluation/evaluators.py), and on the pair's first unit the attention row. Under
    torchrun the units are what the processes share."""
    spec: str
    seed: int
    length: int
    base: dict          # the fields every row of this variant x seed starts with (the device comes later)
    work: tuple[tuple[str, tuple], ...] = ()   # (task, items) for the tasks with items at this length
    attention: bool = False

    @property
    def empty(self) -> bool:
        return not (self.work or self.attention)


class Tables:
    """The CSVs `extrapolate` adds rows to, read once. Every rank merges every update (so all hold
    the same tables); only rank 0 writes the CSVs an update changed."""

    @staticmethod
    def keys() -> dict[str, list[str]]:
        """Each CSV's row key: every registered task's (read when asked: a task registered after import
        has its table too) and attention.csv's."""
        return {**{task.csv: list(task.key) for task in TASKS.values()}, ATTENTION_CSV: ATTENTION_KEY}

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.frames = {name: _read(self.run_dir / name, key) for name, key in self.keys().items()}
        bins = self.run_dir / POSITIONS_CSV
        self.frames[POSITIONS_CSV] = results.read_csv(bins) if bins.is_file() else pd.DataFrame()

    def done(self, name: str, row: dict[str, Any]) -> bool:
        return _done(self.frames[name], row, self.keys()[name])

    @classmethod
    def row(cls, name: str, row: dict[str, Any]) -> Update:
        """The update that puts `row` in place of the one with its key."""
        return name, {k: row[k] for k in cls.keys()[name]}, [row]

    def merge(self, updates: list[Update]) -> None:
        for name, key, rows in updates:
            self.frames[name] = results.replace_rows(self.frames[name], key, rows)
        if distributed.is_main():
            for name in dict.fromkeys(name for name, _, _ in updates):
                results.write_csv(self.run_dir / name, self.frames[name])


def result_tables() -> dict[str, list[str]]:
    """Every table `extrapolate` writes, with the columns that identify a row (positions.csv: a
    perplexity row's group of bins), for `relbench merge` (runs/merge.py)."""
    return {**Tables.keys(), POSITIONS_CSV: POSITIONS_KEY}


def checkpoint_of(run_dir: Path, spec: str, seed: int) -> Path:
    """The checkpoint a spec evaluates: the trained variant's ("rope" for "rope@yarn:factor=16")."""
    return rundir.checkpoint_dir(run_dir, forms.trained_spec(spec), seed)


def _base(run_dir: Path, spec: str, seed: int) -> dict[str, Any]:
    """The fields every row of a spec x seed starts with. `variant` is the spec as given, evaluation
    form included ("rope@yarn:factor=16": its own rows, table rows and plot lines); `form` is the
    form alone ("yarn:factor=16", or the one a checkpoint was fine-tuned under; "" for the variant as
    trained); `finetune_length` and
    `finetune_steps` say how a fine-tuned checkpoint ("rope+ft1024") was made (0 and 0: zero-shot)."""
    meta = checkpoints.read_meta(checkpoint_of(run_dir, spec, seed)) or {}
    precision = meta.get("train", {}).get("precision") or meta.get("summary", {}).get("precision") or "unknown"
    tuned = meta.get("finetune", {})
    return {"variant": spec, "form": forms.form_text(spec), "seed": seed,
            "finetune_length": tuned.get("length", 0), "finetune_steps": tuned.get("steps", 0),
            "train_length": meta.get("model", {}).get("train_length"), "precision": precision, "eval_precision": "fp32"}


def pair_units(tables: Tables, spec: str, seed: int, base: dict[str, Any], job: Job,
               skipped: tuple[str, ...] = ()) -> list[Unit]:
    """The units of one variant x seed, one per length, holding only the rows still to do (every
    row with `job.force`) of the tasks not `skipped`."""
    def left(task: str) -> Callable[[dict], bool]:
        csv = TASKS[task].csv
        return lambda fields: job.force or not tables.done(csv, {**base, **fields})

    mine = [(name, e) for name, e in evaluators().items() if name in job.tasks and name not in skipped]
    units = []
    for i, length in enumerate(job.lengths):
        work = tuple((name, items) for name, e in mine if (items := e.todo(job, i, left(name))))
        units.append(Unit(spec, seed, length, base, work, i == 0 and (job.force or not tables.done(
            ATTENTION_CSV, {**base, "length": base["train_length"]}))))
    return units


def plan(run_dir: Path, pairs: list[tuple[str, int]], job: Job, console) -> tuple[Tables, list[Unit]]:
    """The CSVs as they are and the units with work left, in the order one process does them."""
    tables, units = Tables(run_dir), []
    for spec, seed in pairs:
        meta = checkpoints.read_meta(checkpoint_of(run_dir, spec, seed)) or {}
        reasons = {task: not_learned(meta, task, spec) for task in job.tasks}
        skipped = tuple(task for task, reason in reasons.items() if reason and not job.not_learned)
        for task in skipped:
            console.print(f"{spec:<12} seed {seed}: {reasons[task]} (--not-learned evaluates it)", markup=False)
        mine = pair_units(tables, spec, seed, _base(run_dir, spec, seed), job, skipped)
        kept = len(job.lengths) * len(job.modes) - sum(len(items) for u in mine for task, items in u.work
                                                        if task == "perplexity")
        if "perplexity" in job.tasks and kept:
            console.print(f"{spec:<12} seed {seed}: {kept} perplexity row(s) already computed, kept", markup=False)
        units += [u for u in mine if not u.empty]
    return tables, units


def unit_updates(unit: Unit, models: list[GPT], job: Job,
                 costs: dict[tuple[str, int], dict]) -> tuple[list[Update], list[str]]:
    """Every row of `unit` from the pair's moments (the finished model last), as updates of the CSVs,
    and the lines that report them."""
    base = {**unit.base, "device": str(job.device)}
    label = f"{unit.spec:<12} seed {unit.seed}"
    updates, lines = [], []
    if unit.attention:
        updates.append(Tables.row(ATTENTION_CSV, attention_row(models[-1], base, job.text)))
    for task, items in unit.work:
        task_updates, task_lines = evaluators()[task].rows(models, base, unit.length, items, job, costs, label)
        updates += task_updates
        lines += task_lines
    return updates, lines


def extrapolate_run(run_dir: Path, pairs: list[tuple[str, int]], job: Job, console) -> pd.DataFrame:
    """Evaluate every (variant, seed) in `pairs` for every task of `job` (see the module doc) and
    return the perplexity table.

    The work is a list of units (variant x seed x length). Under torchrun the processes take them
    round-robin, one unit each per round; after each round every rank's rows are gathered in unit
    order, so rank 0 writes the same CSVs, rows in the same order, as one process would (one
    process: rounds of one unit). A RelbenchError in any unit stops every rank after that round."""
    tables, units = distributed.on_main(plan, Path(run_dir), pairs, job, console)
    costs: dict[tuple[str, int], dict] = {}
    models, loaded = [], None
    for start in range(0, len(units), distributed.world()):
        index = start + distributed.rank()
        updates, lines, error = [], [], None
        if index < len(units):
            unit = units[index]
            try:
                if loaded != (unit.spec, unit.seed):   # the previous models are dropped before the next load
                    models, loaded = [], (unit.spec, unit.seed)
                    models = checkpoints.load_moments(checkpoint_of(run_dir, unit.spec, unit.seed), job.device)
                    for model in models:
                        model.config.attention = job.backend
                        forms.apply(model, unit.spec)  # an evaluation form: the weights stay as trained
                updates, lines = unit_updates(unit, models, job, costs)
            except RelbenchError as failure:
                error = failure
        gathered = distributed.all_gather((updates, lines, error))   # rank order: unit order
        for rank_updates, rank_lines, _ in gathered:
            tables.merge(rank_updates)
            for line in rank_lines:
                console.print(line, markup=False)
        for _, _, rank_error in gathered:
            if rank_error is not None:
                raise rank_error
    return tables.frames[results.EXTRAPOLATION_CSV]
