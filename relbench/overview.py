"""What a reader needs to read a perplexity ratio correctly, side by side per variant: the ratio
itself, whether the model uses context at a distance (copy), whether it retrieves a key stated
once (passkey reach), and how far it looks at its training length, with hard windows flagged.

A flat perplexity ratio can mean "extrapolates" or "never looks further than a few tokens"; the
other columns tell which.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from relbench import results
from relbench.stats import summarize

REACH_ACCURACY = 0.9   # passkey reach: the longest length with mean accuracy at least this


def _read(run_dir: Path, name: str) -> pd.DataFrame:
    path = Path(run_dir) / name
    return results.read_csv(path) if path.is_file() else pd.DataFrame()


def _interval(values: list[float], low: list[float], high: list[float]) -> str:
    """Mean over seeds with its t-interval, or one seed's bootstrap interval."""
    s = summarize(values)
    if s.n == 0:
        return "-"
    if s.n > 1:
        return f"{s.mean:.2f} ±{s.half_width:.2f}"
    return f"{s.mean:.2f} [{low[0]:.2f}, {high[0]:.2f}]" if low and not math.isnan(low[0]) else f"{s.mean:.2f}"


def copy_table(copies: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Variant x copy distance: loss with the copy / without (1.00: the copy is not used)."""
    ok = copies[copies["status"] == "ok"]
    distances = sorted(copies["distance"].unique())
    header = ["variant"] + [f"d={int(d)}" for d in distances]
    body = []
    for variant, mine in copies.groupby("variant", sort=False):
        cells = []
        for d in distances:
            here = ok[(ok["variant"] == variant) & (ok["distance"] == d)]
            if here.empty:
                status = mine[mine["distance"] == d]["status"]
                cells.append(status.iloc[0] if len(status) else "-")
                continue
            cells.append(_interval(list(here["ratio"]), list(here["ratio_low"]), list(here["ratio_high"])))
        body.append([variant] + cells)
    return header, body


def passkey_accuracy(keys: pd.DataFrame) -> pd.DataFrame:
    """Mean accuracy over depths and seeds per variant and length (status ok only)."""
    ok = keys[keys["status"] == "ok"]
    return ok.groupby(["variant", "length"], sort=False)["accuracy"].mean().reset_index()


def passkey_reach(keys: pd.DataFrame) -> dict[str, int | None]:
    """Per variant, the longest evaluated length at which mean passkey accuracy is at least 90%."""
    out: dict[str, int | None] = {}
    for variant, mine in passkey_accuracy(keys).groupby("variant", sort=False):
        good = mine[mine["accuracy"] >= REACH_ACCURACY]["length"]
        out[variant] = int(good.max()) if len(good) else None
    return out


def passkey_table(keys: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Variant x length: mean passkey accuracy over depths (and seeds), and the reach."""
    accuracy = passkey_accuracy(keys)
    lengths = sorted(keys["length"].unique())
    reach = passkey_reach(keys)
    header = ["variant"] + [f"L={int(n)}" for n in lengths] + ["reach (>= 90%)"]
    body = []
    for variant, mine in keys.groupby("variant", sort=False):
        cells = []
        for n in lengths:
            here = accuracy[(accuracy["variant"] == variant) & (accuracy["length"] == n)]
            status = mine[mine["length"] == n]["status"]
            cells.append(f"{float(here['accuracy'].iloc[0]):.0%}" if len(here) else (status.iloc[0] if len(status) else "-"))
        body.append([variant] + cells + [str(reach.get(variant) or "none")])
    return header, body


def window_flag(row) -> str:
    """"hard: 3/16 heads see <= 85" when position terms close hard windows inside the training length."""
    if not row.hard_heads:
        return "-"
    return f"hard: {row.hard_heads:g}/{row.heads:g} heads see <= {row.hard_window:g}"


def overview(run_dir: Path, summary: pd.DataFrame | None, train_length: int) -> tuple[list[str], list[list[str]]] | None:
    """One row per variant: perplexity at the training length and its ratio at the longest length per
    mode, the copy ratio inside the training length and at the farthest distance, passkey reach,
    mean attention distance at the training length, and the hard-window flag."""
    copies, keys, reach = (_read(run_dir, name) for name in ("copy.csv", "passkey.csv", "attention.csv"))
    frames = [f for f in (summary, copies, keys) if f is not None and not f.empty]
    if not frames:
        return None
    variants = list(dict.fromkeys(v for f in frames for v in f["variant"]))
    if summary is None or summary.empty:
        summary = pd.DataFrame(columns=["variant", "length", "protocol", "status", "ppl_mean"])
    ok = summary[summary["status"] == "ok"]
    longest = int(summary["length"].max()) if len(summary) else 0
    protocols = list(summary["protocol"].unique())
    header = ["variant"] + ([f"ppl at {train_length}"] if protocols else [])
    header += [f"x at {longest}, {p.split(',')[0]}" for p in protocols]
    near = far = None
    if not copies.empty:
        inside = [d for d in copies["distance"].unique() if d <= train_length]
        near, far = (max(inside) if inside else None), copies["distance"].max()
        header += ([f"copy d={int(near)}"] if near is not None else []) + ([f"copy d={int(far)}"] if far != near else [])
    if not keys.empty:
        header.append("passkey reach")
        reach_len = passkey_reach(keys)
    if not reach.empty:
        header += [f"mean attention distance at {train_length}", "hard window"]
    body = []
    for variant in variants:
        row = [variant]
        if protocols:
            base = ok[(ok["variant"] == variant) & (ok["length"] == train_length)]
            row.append(f"{base['ppl_mean'].iloc[0]:.3f}" if len(base) else "-")
        for protocol in protocols:
            cell = summary[(summary["variant"] == variant) & (summary["length"] == longest)
                           & (summary["protocol"] == protocol)]
            if cell.empty:
                row.append("-")
            elif cell["status"].iloc[0] != "ok":
                row.append(cell["status"].iloc[0])
            else:
                r = cell.iloc[0]
                row.append(f"{r.ratio_mean:.2f}" + (f" ±{r.ratio_ci95:.2f}" if r.n_seeds > 1 else ""))
        if not copies.empty:
            for d in ([near] if near is not None else []) + ([far] if far != near else []):
                here = copies[(copies["variant"] == variant) & (copies["distance"] == d) & (copies["status"] == "ok")]
                row.append(_interval(list(here["ratio"]), list(here["ratio_low"]), list(here["ratio_high"]))
                           if len(here) else "-")
        if not keys.empty:
            row.append(str(reach_len.get(variant) or "none"))
        if not reach.empty:
            mine = reach[(reach["variant"] == variant) & (reach["status"] == "ok")]
            if mine.empty:
                row += ["-", "-"]
            else:
                worst = mine.sort_values("hard_heads").iloc[-1]
                row += [f"{mine['mean_distance'].mean():.1f}", window_flag(worst)]
        body.append(row)
    return header, body
