"""Tables from a run directory's rows: a Rich table, report.md and pivoted CSVs.

Every view is rendered from the same tidy rows of extrapolation.csv (and train.csv), so the
terminal, the Markdown and the CSV never disagree.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table

from relbench import results
from relbench.errors import RelbenchError

PIVOT_CSV = "extrapolation_pivot.csv"
REPORT_MD = "report.md"


def load_rows(run_dir: Path) -> pd.DataFrame:
    path = Path(run_dir) / results.EXTRAPOLATION_CSV
    if not path.is_file():
        raise RelbenchError(f"{run_dir} has no {results.EXTRAPOLATION_CSV}; run `relbench extrapolate --run-dir {run_dir}` first")
    rows = results.read_csv(path)
    missing = {"variant", "length", "status", "ppl"} - set(rows.columns)
    if missing:
        raise RelbenchError(f"{path} lacks columns {sorted(missing)}; rerun `relbench extrapolate`")
    rows["message"] = rows.get("message", pd.Series(dtype=str)).fillna("")
    return rows


def variant_order(rows: pd.DataFrame, config: dict[str, Any]) -> list[str]:
    trained = [v for v in config.get("variants", []) if v in set(rows["variant"])]
    return trained + sorted(set(rows["variant"]) - set(trained))


def reference_length(rows: pd.DataFrame, config: dict[str, Any]) -> int:
    """The training length when it was evaluated, else the shortest evaluated length."""
    train_length = int(config["model"]["train_length"])
    lengths = sorted(rows["length"].unique())
    return train_length if train_length in lengths else int(lengths[0])


def pivot(rows: pd.DataFrame, config: dict[str, Any]) -> pd.DataFrame:
    """One row per variant: ppl@L and ratio@L (ppl over the reference length's ppl) per length,
    plus status@L where a length did not run."""
    ref = reference_length(rows, config)
    out = []
    for variant in variant_order(rows, config):
        mine = rows[rows["variant"] == variant].set_index("length")
        base = mine["ppl"].get(ref, math.nan)
        record: dict[str, Any] = {"variant": variant}
        for length in sorted(rows["length"].unique()):
            ppl = mine["ppl"].get(length, math.nan)
            record[f"ppl@{length}"] = ppl
            record[f"ratio@{length}"] = ppl / base if base and not math.isnan(base) else math.nan
            record[f"status@{length}"] = mine["status"].get(length, "missing")
        out.append(record)
    return pd.DataFrame(out)


def _cell(ppl: float, ratio: float, status: str) -> str:
    if status != "ok":
        return status
    return f"{ppl:.3f} (x{ratio:.2f})" if not math.isnan(ratio) else f"{ppl:.3f}"


def perplexity_table(rows: pd.DataFrame, config: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    wide = pivot(rows, config)
    lengths = sorted(rows["length"].unique())
    header = ["variant"] + [f"L={n}" for n in lengths]
    body = [[r["variant"]] + [_cell(r[f"ppl@{n}"], r[f"ratio@{n}"], r[f"status@{n}"]) for n in lengths]
            for _, r in wide.iterrows()]
    return header, body


def cost_table(rows: pd.DataFrame, config: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Bias construction and attention time (ms, one layer, batch 1) per variant and length."""
    lengths = sorted(rows["length"].unique())
    header = ["variant"] + [f"L={n} bias / attn ms" for n in lengths]
    body = []
    for variant in variant_order(rows, config):
        mine = rows[rows["variant"] == variant].set_index("length")
        cells = []
        for n in lengths:
            if n not in mine.index or mine.loc[n, "status"] != "ok":
                cells.append(mine["status"].get(n, "missing"))
            else:
                cells.append(f"{mine.loc[n, 'bias_ms']:.2f} / {mine.loc[n, 'attention_ms']:.1f}")
        body.append([variant] + cells)
    return header, body


def training_table(run_dir: Path, config: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "params", "position params", "final val loss", "train time (s)", "tokens/s"]
    body = []
    for variant in config.get("variants", []):
        meta = results.read_meta(results.checkpoint_dir(run_dir, variant, config["train"]["seed"]))
        if not meta or not meta.get("finished"):
            continue
        s = meta["summary"]
        body.append([variant, f"{s['n_params']:,}", f"{s['position_params']:,}", f"{s['val_loss']:.4f}",
                     f"{s['train_seconds']:.1f}", f"{s['tokens_per_s']:,.0f}"])
    return header, body


def rich_table(title: str, header: list[str], body: list[list[str]]) -> Table:
    table = Table(title=title, title_justify="left")
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in body:
        table.add_row(*row)
    return table


def markdown_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def profile_table(rows: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Per variant x backend, per length: attention forward ms (+ bias construction ms), peak MB,
    and forward+backward ms where measured."""
    lengths = sorted(rows["length"].unique())
    header = ["variant", "backend"] + [f"L={n}" for n in lengths]
    body = []
    for (variant, backend), mine in rows.groupby(["variant", "backend"], sort=False):
        mine = mine.set_index("length")
        cells = []
        for n in lengths:
            if n not in mine.index:
                cells.append("-")
                continue
            r = mine.loc[n]
            if r["status"] != "ok":
                cells.append(str(r["status"]))
                continue
            cell = f"{r['attention_ms']:.1f} (+{r['bias_ms']:.2f})"
            if pd.notna(r.get("attention_peak_mb")):
                cell += f" {r['attention_peak_mb']:.0f}MB"
            if pd.notna(r.get("train_ms", float("nan"))):
                cell += f" | fb {r['train_ms']:.0f}"
            cells.append(cell)
        body.append([str(variant), str(backend)] + cells)
    return header, body


PROFILE_TITLE = ("Cost: attention forward ms (+ bias construction ms), peak extra memory, "
                 "| fb = forward+backward ms")


def render(run_dir: Path, console: Console) -> dict[str, Path]:
    """Print the tables and write report.md (and the pivoted CSV when there are perplexities)."""
    from relbench.profile import PROFILE_CSV

    run_dir = Path(run_dir)
    has_rows = (run_dir / results.EXTRAPOLATION_CSV).is_file()
    has_profile = (run_dir / PROFILE_CSV).is_file()
    if not has_rows and not has_profile:
        results.require_run(run_dir)  # a missing directory, or one that is not a run, says so
        raise RelbenchError(f"{run_dir} has nothing to report yet; run `relbench extrapolate --run-dir {run_dir}` "
                            f"or `relbench profile --run-dir {run_dir}` first")
    written: dict[str, Path] = {}
    sections = []
    config: dict[str, Any] = {}
    rows = None
    if has_rows:
        config = results.require_run(run_dir)
        rows = load_rows(run_dir)
        ref = reference_length(rows, config)
        sections += [
            (f"Perplexity on the test split (ratio to L={ref})", *perplexity_table(rows, config)),
            ("Cost per layer, batch 1: building the position terms / attention (ms)", *cost_table(rows, config)),
            ("Training", *training_table(run_dir, config)),
        ]
        written["pivot"] = run_dir / PIVOT_CSV
        results.write_csv(written["pivot"], pivot(rows, config))
    if has_profile:
        sections.append((PROFILE_TITLE, *profile_table(results.read_csv(run_dir / PROFILE_CSV))))
    for title, header, body in sections:
        console.print(rich_table(title, header, body))
    written["report"] = run_dir / REPORT_MD
    results.atomic_write_text(written["report"], markdown(config, rows, sections))
    return written


def markdown(config: dict[str, Any], rows: pd.DataFrame | None, sections) -> str:
    lines = ["# relbench report"]
    if rows is not None:
        lines += ["", *describe_run(config, rows)]
    for title, header, body in sections:
        lines += ["", f"## {title}", "", markdown_table(header, body)]
    notes = rows[rows["status"] != "ok"] if rows is not None else []
    if len(notes):
        lines += ["", "## Not evaluated", ""]
        lines += [f"- {r.variant} at {r.length}: {r.status} ({r.message})" for r in notes.itertuples()]
    return "\n".join(lines) + "\n"


def describe_run(config: dict[str, Any], rows: pd.DataFrame) -> list[str]:
    env = config.get("environment", {})
    model = config["model"]
    return [
        f"Preset `{config.get('preset')}`: d_model {model['d_model']}, {model['n_layers']} layers, "
        f"{model['n_heads']} heads, trained at length {model['train_length']} for {config['train']['steps']} steps "
        f"of {config['train']['batch_size']} sequences, seed {config['train']['seed']}, on {config.get('dataset_description', config.get('dataset'))}.",
        f"Scored test tokens per length: {int(rows['n_tokens'].max()):,} (non-overlapping windows).",
        f"Machine: {env.get('platform', '?')}, {env.get('cpu_threads', '?')} threads, device {env.get('device', '?')}; "
        f"torch {env.get('torch', '?')}; relbench {env.get('relbench', '?')} at commit {env.get('git_commit') or 'unknown'}; "
        f"{env.get('date', '')}.",
    ]
