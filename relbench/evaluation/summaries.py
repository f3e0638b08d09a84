"""What training recorded about one run, read from its checkpoint or, without one, from train.csv.

A checkpoint's meta.json holds its training summary (relbench/training/train.py). Checkpoints are
not committed with a result (results/*/checkpoints/ is ignored: weights are large and a result is
its CSVs), so a committed result's report is made again from train.csv and config.json alone: the
summary is rebuilt from the run's rows there (its last step, its checks of validation accuracy and
the criterion in config.json, the last validation loss, the time) and its configuration (the
parameters counted without building the model, the position learning rate from the same rule
training used). The two agree on every key both have (tests/test_reach.py checks it).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pandas as pd

from relbench.runs import checkpoints, results, rundir


def recorded_summary(run_dir: Path, spec: str, seed: int, config: dict[str, Any] | None = None,
                     curves: pd.DataFrame | None = None) -> dict[str, Any] | None:
    """The training summary of (spec, seed) in `run_dir`: its finished checkpoint's, else the one
    train.csv and config.json give (with "source": "train.csv"), else None (never trained, or not
    finished and not in train.csv). `config`, `curves`: the run's config.json and train.csv when the
    caller has read them already."""
    meta = checkpoints.read_meta(rundir.checkpoint_dir(run_dir, spec, seed))
    if meta and meta.get("finished") and "summary" in meta:
        return meta["summary"]
    if meta is not None:          # a run that did not finish (diverged, or still training): not recorded
        return None
    run_dir = Path(run_dir)
    if config is None:
        config = results.read_json(run_dir / results.CONFIG) if (run_dir / results.CONFIG).is_file() else {}
    if curves is None:
        curves = results.read_csv(run_dir / results.TRAIN_CSV) if (run_dir / results.TRAIN_CSV).is_file() else None
    if curves is None or not config.get("model") or not config.get("train"):
        return None
    mine = curves[(curves["variant"] == spec) & (curves["seed"] == seed)].sort_values("step")
    if mine.empty:
        return None
    return summary_from_rows(spec, seed, mine, config)


def summary_from_rows(spec: str, seed: int, rows: pd.DataFrame, config: dict[str, Any]) -> dict[str, Any]:
    """A run's summary from its own train.csv rows (step order) and its run's config.json."""
    from relbench.config import ModelConfig, TrainConfig
    from relbench.cost.memory import parameter_count
    from relbench.training.step import position_lr
    from relbench.training.stopping import learned_at

    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    train = TrainConfig(**{k: v for k, v in config["train"].items() if k in fields})
    model = dataclasses.replace(ModelConfig(**config["model"]), position=spec)
    last = rows.iloc[-1]
    checks = [(int(s), float(a)) for s, a in zip(rows["step"], rows["val_accuracy"]) if not math.isnan(a)] \
        if "val_accuracy" in rows.columns else []
    val = rows["val_loss"].dropna()
    criterion = train.criterion_accuracy > 0
    # the first time the criterion held (a consolidated run trains on after it, and its later checks may dip)
    learned = next((found for k in range(1, len(checks) + 1)
                    if (found := learned_at(checks[:k], train.criterion_accuracy, train.criterion_checks)) is not None),
                   None) if criterion else None
    steps = int(last["step"])
    scale, source = position_lr(spec, train)
    seconds = float(last["elapsed_s"])
    return {"variant": spec, "seed": seed, "steps": steps, "step_cap": steps if criterion and learned is None else train.steps,
            "val_loss": float(val.iloc[-1]) if len(val) else float("nan"),
            "val_accuracy": checks[-1][1] if checks else float("nan"),
            "criterion": train.criterion_accuracy if criterion else None,
            "learned": (learned is not None) if criterion else None, "learned_step": learned,
            "consolidated_steps": steps - confirmed if (confirmed := confirming_step(checks, learned, train)) else 0,
            "moments": list(range(confirmed, steps + 1, train.eval_every)) if confirmed and train.moments > 1 else [],
            "position_lr_scale": scale, "position_lr_source": source, "precision": train.precision,
            "train_seconds": seconds, "tokens_per_s": float(last["tokens"]) / seconds if seconds > 0 else float("nan"),
            "n_params": parameter_count(model), "position_params": parameter_count(model, positions_only=True),
            "source": "train.csv"}


def confirming_step(checks: list[tuple[int, float]], learned: int | None, train) -> int | None:
    """The check that confirmed a criterion first met at step `learned`: the last of its consecutive checks."""
    if learned is None:
        return None
    steps = [step for step, _ in checks]
    return steps[steps.index(learned) + train.criterion_checks - 1]
