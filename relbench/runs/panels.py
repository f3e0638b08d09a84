"""Panels: a committed retrieval result shipped with the package, so that a scheme of one's own is
placed among the baselines without retraining them (`relbench bench --against NAME`).

A panel is a run directory without checkpoints: config.json (the protocol: model, training, evaluation,
data and tokenizer, the variants and seeds), the task's table (passkey.csv or mqar.csv), train.csv
(each seed's curve and checks, from which relbench reads whether and when it learned) and
checksums.json, byte for byte as committed under results/ (scripts/ship_panels.py copies them;
tests/test_panels.py holds the copies equal). `--against` also takes the path of any such run directory.

A run against a panel starts as a copy of it; the user's variants train into it under the panel's
protocol and seeds, and the report compares every scheme there. A protocol that differs from the
panel's in any way that moves a number (model, training, evaluation trials or lengths, data,
tokenizer) is refused, naming the difference.
"""

from __future__ import annotations

import dataclasses
import shutil
from importlib import resources
from pathlib import Path
from typing import Any

from relbench.errors import RelbenchError, UsageError, unknown
from relbench.runs import results, runconfig

PANELS_PACKAGE = "relbench.panels"
EVAL_KEYS = ("trials", "length_multiples", "lengths", "eval_tokens")   # what moves a retrieval figure
DATA_KEYS = ("dataset", "tokenizer", "stream", "max_train_tokens")
# A user's scheme trains the panel's first six seeds (six seeds of the `new-variant` template: about 15 min
# on a 2-core AVX-512 CPU, docs/results.md); a panel may hold more seeds of its own schemes, which sharpen
# their comparisons with one another, while a pair with the user's scheme is compared over the seeds both have.
AGAINST_SEEDS = 6


def shipped() -> dict[str, Path]:
    """The panels in the package, by name."""
    root = resources.files(PANELS_PACKAGE)
    return {p.name: Path(str(p)) for p in root.iterdir() if p.is_dir() and (p / results.CONFIG).is_file()}


def files_of(config: dict[str, Any]) -> list[str]:
    """The files a panel of this configuration consists of."""
    return [results.CONFIG, results.TRAIN_CSV, results.CHECKSUMS, task_table(task_of(config))]


def task_table(task: str) -> str:
    """The CSV of the retrieval task `task` (relbench/tasks)."""
    from relbench.tasks import retrieval_task
    return retrieval_task(task).csv


def task_of(config: dict[str, Any]) -> str:
    task = config.get("train", {}).get("task")
    from relbench.tasks import retrieval_tasks
    if task not in [t.name for t in retrieval_tasks()]:
        raise UsageError(f"a panel is a retrieval result (task {' or '.join(t.name for t in retrieval_tasks())}); "
                         f"this one trained on {task!r}")
    return task


def trained_seeds(panel: dict[str, Any]) -> list[int]:
    """The seeds a user's scheme trains against `panel`: its first AGAINST_SEEDS."""
    return list(panel["seeds"])[:AGAINST_SEEDS]


def locate(name: str) -> tuple[str, Path]:
    """(label, folder) of a shipped panel's name or a run directory's path; an unknown name says which exist."""
    panels = shipped()
    if name in panels:
        return name, panels[name]
    folder = Path(name)
    if not folder.is_dir():
        if "/" in name or folder.suffix:
            raise RelbenchError(f"--against {name}: no such directory; name a shipped panel "
                                f"({', '.join(sorted(panels))}) or a retrieval run directory")
        raise unknown("panel", name, sorted(panels))
    if not (folder / results.CONFIG).is_file():
        raise RelbenchError(f"--against {name}: {folder} is not a relbench run (no {results.CONFIG})")
    config = results.read_json(folder / results.CONFIG)
    missing = [f for f in files_of(config) if not (folder / f).is_file()]
    if missing:
        raise RelbenchError(f"--against {name}: {folder} lacks {', '.join(missing)}; a panel needs a retrieval run "
                            f"evaluated with `relbench extrapolate --task {task_of(config)}`")
    return str(folder), folder


def protocol_differences(panel: dict[str, Any], run: dict[str, Any]) -> list[str]:
    """What differs between a panel's recorded protocol and a run's configuration (runconfig.run_config),
    each as "section.key: panel value, this run value"; empty when they are the same."""
    out = []
    for section in ("model", "train"):
        theirs, ours = runconfig.with_defaults(section, panel.get(section) or {}, run[section]), run[section]
        for key in sorted(set(theirs) | set(ours)):
            if key not in ("vocab_size",) and theirs.get(key) != ours.get(key):
                out.append(f"{section}.{key}: panel {theirs.get(key)!r}, this run {ours.get(key)!r}")
    for section, keys in (("eval", EVAL_KEYS), ("data", DATA_KEYS)):
        theirs, ours = panel.get(section) or {}, run.get(section) or {}
        out += [f"{section}.{k}: panel {theirs.get(k)!r}, this run {ours.get(k)!r}" for k in keys
                if theirs.get(k) != ours.get(k)]
    if panel.get("tokenizer_fingerprint") != run.get("tokenizer_fingerprint"):
        out.append("the tokenizer's vocabulary (its fingerprint differs)")
    return out


def experiment_of(panel: dict[str, Any], base):
    """The experiment (relbench.config.Experiment) that repeats a panel's protocol: `base` (the panel's
    preset, resolved by the caller) with the panel's recorded tables in place of its own."""
    from relbench.config import DataConfig, EvalConfig, ModelConfig, TrainConfig

    fields = {cls: {f.name for f in dataclasses.fields(cls)} for cls in (DataConfig, EvalConfig, ModelConfig, TrainConfig)}

    def table(cls, recorded):
        return cls(**{k: v for k, v in recorded.items() if k in fields[cls]})

    return dataclasses.replace(base, model=table(ModelConfig, panel["model"]), train=table(TrainConfig, panel["train"]),
                               eval=table(EvalConfig, panel.get("eval", {})), data=table(DataConfig, panel["data"]),
                               variants=None, seeds=trained_seeds(panel))


def start_run(label: str, panel_dir: Path, run_dir: Path) -> dict[str, Any]:
    """Make `run_dir` a run against the panel: a copy of its files, config.json recording the panel it
    came from. A run directory made from the same panel is kept (its user variants resume); any other
    existing run directory is refused."""
    panel = results.read_json(panel_dir / results.CONFIG)
    run_dir = Path(run_dir)
    if (run_dir / results.CONFIG).is_file():
        config = results.read_json(run_dir / results.CONFIG)
        against = config.get("against", {})
        if against.get("variants") != panel.get("variants") or against.get("seeds") != panel.get("seeds") \
                or protocol_differences(panel, config):
            raise UsageError(f"{run_dir} holds another run than one against the panel {label}; use another --run-dir "
                             f"(default runs/against-<panel>), or delete {run_dir} to start over")
        return config
    if run_dir.exists() and any(not p.name.startswith(".") for p in run_dir.iterdir()):   # .lock: this command's
        raise UsageError(f"{run_dir} is not empty and not a relbench run; use another --run-dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in files_of(panel):
        if name != results.CONFIG:
            shutil.copyfile(panel_dir / name, run_dir / name)
    config = {**panel, "against": {"panel": label, "variants": panel.get("variants", []), "seeds": panel.get("seeds", []),
                                   "environment": panel.get("environment", {}),
                                   "merged_from": panel.get("merged_from", [])}}
    config.pop("merged_from", None)
    results.write_json(run_dir / results.CONFIG, config)
    return config
