"""`relbench tune-lr`: each variant's learning-rate multiplier for its position parameters, chosen by
validation loss at the training length (never by extrapolation).

Position parameters start small (tables at std 0.02, KERPLE's scalars in U(0, 2)) and Adam moves each
entry by about one learning rate per step, so how fast they should learn differs between schemes: a
(2k+1, H) table may need a larger step than a d x d projection (transformer-xl's W_R) or a scalar
that scales a whole bias (KERPLE). One multiplier for everything favours some schemes over others.
A sweep trains every variant that has position parameters at each multiplier of a small grid, in an
ordinary run directory (the variants are named "xl:position_lr_scale=3", ...), and keeps, per variant,
the multiplier with the lowest validation loss at the training length (mean over seeds):

    RUN/lr_sweep.csv       variant, position_lr_scale, seed, val_loss, chosen
    RUN/position_lr.json   {"chosen": {variant: multiplier}, "grid": [...], "preset": ..., ...}

`relbench train --position-lr-scale RUN/position_lr.json` trains with those choices; the presets ship
the choices of the committed sweep (results/lr-sweep).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from relbench import positions
from relbench.errors import RelbenchError, UsageError
from relbench.runs import checkpoints, results, rundir
from relbench.stats import summarize

SWEEP_CSV = "lr_sweep.csv"
CHOICE_JSON = "position_lr.json"
GRID = (1.0, 3.0, 10.0, 30.0, 100.0)  # 100: at 30 most variants were still improving


def learned_variants(shape: dict[str, int]) -> list[str]:
    """Registered variants that have position parameters for a model of this shape."""
    return [name for name in positions.names() if positions.build(name, **shape).n_params() > 0]


def grid_spec(spec: str, scale: float) -> str:
    """"xl" -> "xl:position_lr_scale=3"; "xl:k=64" -> "xl:k=64,position_lr_scale=3"."""
    parsed = positions.parse(spec)
    if parsed.is_layout or len(parsed.pattern) > 1:
        raise UsageError(f'variant "{spec}" is a layout; tune-lr sweeps the position learning rate of one scheme')
    if parsed.position_lr_scale is not None:
        raise UsageError(f'variant "{spec}" already sets position_lr_scale; tune-lr sweeps it')
    return f"{spec}{',' if ':' in spec else ':'}position_lr_scale={scale:g}"


def validate_grid(grid: list[float]) -> list[float]:
    if not grid:
        raise UsageError("give at least one multiplier, e.g. --grid 1 3 10 30")
    bad = [g for g in grid if not (g > 0 and math.isfinite(g))]
    if bad:
        raise UsageError(f"learning-rate multipliers must be positive numbers, got {bad[0]}")
    if len(set(grid)) != len(grid):
        raise UsageError(f"multiplier {next(g for g in grid if grid.count(g) > 1):g} is given twice")
    return sorted(grid)


def collect(run_dir: Path, specs: list[str], grid: list[float], seeds: list[int]) -> pd.DataFrame:
    """One row per variant x multiplier x seed with the final validation loss, and `chosen` marking
    each variant's multiplier with the lowest mean validation loss."""
    rows = []
    for spec in specs:
        for scale in grid:
            for seed in seeds:
                meta = checkpoints.read_meta(rundir.checkpoint_dir(run_dir, grid_spec(spec, scale), seed)) or {}
                if not meta.get("finished"):
                    raise RelbenchError(f"{spec} at position_lr_scale={scale:g} seed {seed} has not finished training in "
                                        f"{run_dir}; run the same `relbench tune-lr` again to finish the sweep")
                rows.append({"variant": spec, "position_lr_scale": scale, "seed": seed,
                             "val_loss": float(meta["summary"]["val_loss"])})
    frame = pd.DataFrame(rows)
    means = frame.groupby(["variant", "position_lr_scale"])["val_loss"].mean()
    best = {variant: float(group.idxmin()[1]) for variant, group in means.groupby(level=0)}
    frame["chosen"] = [best[r.variant] == r.position_lr_scale for r in frame.itertuples()]
    return frame


def choice(frame: pd.DataFrame, run_config: dict[str, Any]) -> dict[str, Any]:
    chosen = frame[frame["chosen"]].groupby("variant")["position_lr_scale"].first()
    return {"chosen": {variant: float(scale) for variant, scale in chosen.items()},
            "grid": sorted(float(g) for g in frame["position_lr_scale"].unique()),
            "seeds": sorted(int(s) for s in frame["seed"].unique()),
            "criterion": "lowest mean validation loss at the training length",
            "preset": run_config.get("preset"), "model": run_config.get("model"),
            "train": {k: v for k, v in run_config.get("train", {}).items()
                      if k not in ("position_lr_scale", "position_lr_scales")},
            "data": run_config.get("data") or {"dataset": run_config.get("dataset")}}


def write(run_dir: Path, frame: pd.DataFrame, run_config: dict[str, Any]) -> dict[str, Any]:
    results.write_csv(Path(run_dir) / SWEEP_CSV, frame)
    chosen = choice(frame, run_config)
    results.write_json(Path(run_dir) / CHOICE_JSON, chosen)
    return chosen


def read_choice(path: Path) -> dict[str, float]:
    """The per-variant multipliers of a position_lr.json (or of the run directory that holds one)."""
    path = Path(path)
    if path.is_dir():
        path = path / CHOICE_JSON
    if not path.is_file():
        raise UsageError(f"{path} does not exist; give a number or the position_lr.json that `relbench tune-lr` wrote")
    data = results.read_json(path)
    chosen = data.get("chosen") if isinstance(data, dict) else None
    if not isinstance(chosen, dict) or not all(isinstance(v, (int, float)) and v > 0 for v in chosen.values()):
        raise RelbenchError(f"{path} holds no per-variant multipliers; rerun `relbench tune-lr`")
    return {str(k): float(v) for k, v in chosen.items()}


def table(frame: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Variant x multiplier: mean validation loss (± 95% half-width over seeds), * on the chosen one."""
    grid = sorted(frame["position_lr_scale"].unique())
    header = ["variant"] + [f"x{g:g}" for g in grid] + ["chosen"]
    body = []
    for variant, mine in frame.groupby("variant", sort=False):
        cells, chosen = [], "-"
        for g in grid:
            here = mine[mine["position_lr_scale"] == g]
            if here.empty:
                cells.append("-")
                continue
            s = summarize(list(here["val_loss"]))
            text = f"{s.mean:.4f}" + (f" ±{s.half_width:.4f}" if s.n > 1 else "")
            if bool(here["chosen"].iloc[0]):
                text, chosen = text + " *", f"x{g:g}"
            cells.append(text)
        body.append([variant] + cells + [chosen])
    return header, body
