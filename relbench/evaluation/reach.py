"""Reach: how far beyond its training length a model that learned retrieval still retrieves.

Competence first (DESIGN.md, "What a number may claim"): a seed counts for a variant's reach only
if that model learned the task at its training length. Training to criterion records it
(`learned` in the checkpoint's summary, relbench/training/train.py); a run trained without a criterion counts
as learned when its evaluated accuracy at the training length is at least REACH_ACCURACY, and so
does a model read at other positions than its criterion checked (the `drawn` form: positions/forms.py). A variant
with no learned seed has no reach: it is *not learned (0/3)*, never reach "none", which would read as
a failure to extrapolate.

Per variant x seed x length the accuracy pools every trial (passkey: all depths; MQAR: all queries)
with its Wilson 95% interval; across learned seeds the mean, with the per-seed values beside it.
Reach = the longest evaluated length whose mean accuracy over the learned seeds is at least 90%.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from relbench.evaluation.summaries import recorded_summary
from relbench.positions import forms
from relbench.runs import results
from relbench.stats import wilson

REACH_ACCURACY = 0.9   # reach: the longest length with mean accuracy over learned seeds at least this


@dataclass(frozen=True)
class Competence:
    """Whether one trained model learned its retrieval task at the training length, and when."""
    learned: bool
    learned_step: int | None = None     # first of the checks that held the criterion (None: not trained to one)
    steps: int | None = None            # steps trained (the cap when it did not learn)
    source: str = "criterion"           # "criterion" (training said so) or "accuracy at 1x" (evaluation did)


def training_competence(run_dir: Path, variant: str, seed: int, config: dict[str, Any] | None = None,
                        curves: pd.DataFrame | None = None) -> Competence | None:
    """What training to criterion recorded for this model (its checkpoint, or without one its rows in
    train.csv: relbench/evaluation/summaries.py); None when it was not trained to one, and for a
    variant read at other positions than the criterion checked (the `drawn` form): then, as for a run
    without a criterion, its evaluated accuracy at the training length decides."""
    if forms.places_positions(variant):
        return None
    summary = recorded_summary(run_dir, variant.split("@")[0], seed, config, curves) or {}
    if summary.get("learned") is None:
        return None
    return Competence(bool(summary["learned"]), summary.get("learned_step"), summary.get("steps"))


def accuracy_by_length(rows: pd.DataFrame, count: str, conditions: str | None = None) -> pd.DataFrame:
    """Per variant x seed x length: successes, trials, accuracy and its Wilson interval. `count` is
    the column of trials per row ("trials" for passkey, whose rows are depths; "queries" for MQAR).
    With `conditions` (a column, e.g. flip-flop's p_ignore) the accuracy is the mean of each
    condition's, so that a condition with more answers per trial does not outweigh the others, and
    `correct` is that accuracy times the answers."""
    ok = rows[rows["status"] == "ok"] if "status" in rows.columns else rows.iloc[:0]
    if ok.empty:
        return pd.DataFrame(columns=["variant", "seed", "length", "correct", "n", "accuracy", "low", "high"])
    if conditions is not None:
        each = ok.groupby(["variant", "seed", "length", conditions], sort=False).agg(
            correct=("correct", "sum"), n=(count, "sum")).reset_index()
        each["accuracy"] = each["correct"] / each["n"]
        pooled = each.groupby(["variant", "seed", "length"], sort=False).agg(
            accuracy=("accuracy", "mean"), n=("n", "sum")).reset_index()
        pooled["correct"] = pooled["accuracy"] * pooled["n"]
    else:
        pooled = ok.groupby(["variant", "seed", "length"], sort=False).agg(
            correct=("correct", "sum"), n=(count, "sum")).reset_index()
        pooled["accuracy"] = pooled["correct"] / pooled["n"]
    bounds = [wilson(c, int(n)) for c, n in zip(pooled["correct"], pooled["n"])]
    pooled["low"], pooled["high"] = [b[0] for b in bounds], [b[1] for b in bounds]
    return pooled


@dataclass
class Reach:
    """One variant's reach on one task, from its learned seeds."""
    variant: str
    seeds: list[int]                                     # every evaluated seed
    learned: dict[int, Competence]                       # per seed
    accuracy: dict[int, float] = field(default_factory=dict)           # length -> mean over learned seeds
    per_seed: dict[int, dict[int, float]] = field(default_factory=dict)  # seed -> length -> accuracy
    interval: dict[int, dict[int, tuple[float, float]]] = field(default_factory=dict)  # seed -> length -> Wilson 95%
    reach: int | None = None                             # longest length at >= REACH_ACCURACY; None: none
    unsupported_beyond: bool = False                     # it cannot run beyond its reach (a learned table of positions)
    longer_untested: bool = False                        # it passed at its longest evaluated length, and the
                                                         # task was evaluated longer for other variants

    @property
    def learned_seeds(self) -> list[int]:
        return [s for s in self.seeds if self.learned[s].learned]

    @property
    def competent(self) -> bool:
        return bool(self.learned_seeds)

    def seed_reach(self, seed: int) -> int | None:
        good = [n for n, a in self.per_seed.get(seed, {}).items() if a >= REACH_ACCURACY]
        return max(good) if good else None

    def cell(self) -> str:
        """The reach as a table shows it: "2048 (3/3)", "128 (2/3; seeds 2048, 128)", "not learned (0/3)"."""
        k, n = len(self.learned_seeds), len(self.seeds)
        if not k:
            return f"not learned ({k}/{n})"
        reach = str(self.reach) if self.reach is not None else f"< {min(self.accuracy)}"
        if self.unsupported_beyond:
            reach = f"{reach} (cannot run longer)"
        elif self.longer_untested:
            reach = f">= {reach} (longer not evaluated)"
        if n == 1:
            return reach
        per = ", ".join(str(self.seed_reach(s) or "-") for s in self.learned_seeds)
        return f"{reach} ({k}/{n}; per seed {per})"


def reach_of(rows: pd.DataFrame, count: str, train_lengths: dict[tuple[str, int], int],
             competence: dict[tuple[str, int], Competence | None], conditions: str | None = None) -> dict[str, Reach]:
    """Per variant, its Reach from the task's rows (passkey.csv or mqar.csv). `train_lengths`: the
    training length of each (variant, seed); `competence`: what training recorded (None: not trained
    to a criterion, decided here by the accuracy at the training length). A seed that training says
    did not learn counts among the variant's seeds even without rows (extrapolate skips it)."""
    pooled = accuracy_by_length(rows, count, conditions)
    longest = int(pooled["length"].max()) if len(pooled) else 0
    variants = list(dict.fromkeys([str(v) for v in pooled["variant"]]
                                  + [v for (v, _), c in competence.items() if c is not None and not c.learned]))
    out: dict[str, Reach] = {}
    for variant in variants:
        mine = pooled[pooled["variant"] == variant]
        unevaluated = {s for (v, s), c in competence.items() if v == variant and c is not None and not c.learned}
        seeds = sorted({int(s) for s in mine["seed"].unique()} | unevaluated)
        per_seed: dict[int, dict[int, float]] = {s: {} for s in seeds}
        interval: dict[int, dict[int, tuple[float, float]]] = {s: {} for s in seeds}
        for r in mine.itertuples():       # one pass: each seed's accuracy and Wilson interval per length
            per_seed[int(r.seed)][int(r.length)] = float(r.accuracy)
            interval[int(r.seed)][int(r.length)] = (float(r.low), float(r.high))
        learned = {}
        for s in seeds:
            known = competence.get((variant, s))
            if known is None:
                at_1x = per_seed[s].get(train_lengths.get((variant, s), -1), math.nan)
                known = Competence(bool(at_1x >= REACH_ACCURACY), source="accuracy at 1x")
            learned[s] = known
        reach = Reach(variant, seeds, learned, per_seed=per_seed, interval=interval)
        good = reach.learned_seeds
        if good:
            lengths = sorted(set.intersection(*(set(per_seed[s]) for s in good)))
            reach.accuracy = {n: sum(per_seed[s][n] for s in good) / len(good) for n in lengths}
            passing = [n for n, a in reach.accuracy.items() if a >= REACH_ACCURACY]
            reach.reach = max(passing) if passing else None
            reach.longer_untested = reach.reach is not None and reach.reach == max(lengths) < longest
            refused = (rows[(rows["variant"] == variant) & (rows["status"] == "unsupported")]
                       if "status" in rows else rows.iloc[:0])
            reach.unsupported_beyond = reach.longer_untested and bool((refused["length"] > reach.reach).any())
        out[variant] = reach
    return out


def run_reach(run_dir: Path, name: str) -> dict[str, Reach]:
    """The reach of every variant in a run directory's table `name` of a retrieval task (passkey.csv,
    mqar.csv, ...), with the seeds that were trained to criterion on that task and did not learn it
    (not evaluated; empty when none)."""
    path, task = Path(run_dir) / name, Path(name).stem
    rows = results.read_csv(path) if path.is_file() else pd.DataFrame()
    pairs = [(str(v), int(s)) for v, s in rows[["variant", "seed"]].drop_duplicates().itertuples(index=False)] \
        if not rows.empty else []
    config = results.read_json(Path(run_dir) / results.CONFIG) if (Path(run_dir) / results.CONFIG).is_file() else {}
    if config.get("train", {}).get("task") == task:
        pairs += [(v, int(s)) for s in config.get("seeds", []) for v in config.get("variants", []) if (v, int(s)) not in pairs]
    lengths = {(v, s): int(rows[(rows["variant"] == v) & (rows["seed"] == s)]["train_length"].iloc[0])
               if "train_length" in rows.columns and ((rows["variant"] == v) & (rows["seed"] == s)).any() else -1
               for v, s in pairs}
    curves = results.read_csv(Path(run_dir) / results.TRAIN_CSV) if (Path(run_dir) / results.TRAIN_CSV).is_file() else None
    competence = {(v, s): training_competence(run_dir, v, s, config, curves) for v, s in pairs}
    if rows.empty and not any(c is not None for c in competence.values()):
        return {}
    from relbench.tasks import retrieval_tasks
    task = next((t for t in retrieval_tasks() if t.csv == Path(name).name), None)
    count = task.count if task is not None else "trials"
    conditions = task.axis if task is not None and task.weigh_conditions and task.axis in rows.columns else None
    return reach_of(rows, count, lengths, competence, conditions)


def steps_to_learn(reach: Reach) -> str:
    """"800 (700-900)" the mean (range) over the learned seeds of a criterion run; "-" without one."""
    steps = [reach.learned[s].learned_step for s in reach.learned_seeds if reach.learned[s].learned_step is not None]
    if not steps:
        return "-"
    mean = sum(steps) / len(steps)
    return f"{mean:.0f}" + (f" ({min(steps)}-{max(steps)})" if len(steps) > 1 else "")


def reach_table(reaches: dict[str, Reach], task: str) -> tuple[list[str], list[list[str]]]:
    """Variant x length: mean accuracy over learned seeds (the per-seed values; with one learned seed,
    its Wilson 95% interval over the pooled trials), steps to learn, reach."""
    lengths = sorted({n for r in reaches.values() for s in r.per_seed.values() for n in s})
    header = ["variant", "learned"] + [f"L={n}" for n in lengths] + ["steps to learn", f"{task} reach (>= 90%)"]
    body = []
    for variant, r in reaches.items():
        cells = []
        for n in lengths:
            if not r.competent:
                cells.append("-")
                continue
            per = [r.per_seed[s].get(n) for s in r.learned_seeds]
            if any(a is None for a in per):
                cells.append("-")
                continue
            text = f"{r.accuracy[n]:.0%}"
            if len(per) > 1:
                text += " (" + "/".join(f"{a:.0%}" for a in per) + ")"
            elif n in r.interval.get(r.learned_seeds[0], {}):
                low, high = r.interval[r.learned_seeds[0]][n]
                text += f" [{low:.0%}-{high:.0%}]"
            cells.append(text)
        body.append([variant, f"{len(r.learned_seeds)}/{len(r.seeds)}"] + cells + [steps_to_learn(r), r.cell()])
    return header, body


def competence_note(reaches: dict[str, Reach]) -> str | None:
    """A sentence on the seeds that did not learn, or None when every seed learned."""
    missing = {v: [s for s in r.seeds if not r.learned[s].learned] for v, r in reaches.items()}
    missing = {v: s for v, s in missing.items() if s}
    if not missing:
        return None
    parts = [f"`{v}` seed{'s' if len(s) > 1 else ''} {', '.join(map(str, s))}" for v, s in missing.items()]
    return ("Not learned at the training length (left out of reach, which comes only from the seeds that "
            "learned): " + "; ".join(parts) + ".")


def summary_cells(reaches: dict[str, Reach], variant: str) -> dict[str, Any]:
    """What the headline table shows of one variant on one task."""
    r = reaches.get(variant)
    if r is None:
        return {"reach": "not run", "steps": "-"}
    return {"reach": r.cell(), "steps": steps_to_learn(r)}
