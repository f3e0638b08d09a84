"""What a reader needs to read a perplexity ratio correctly, side by side per variant: the ratio
itself, whether the model uses context at a distance (copy), whether it retrieves a key stated
once (each retrieval task's reach), and how far it looks at its training length, with hard windows flagged.

A flat perplexity ratio can mean "extrapolates" or "never looks further than a few tokens"; the
other columns tell which.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from relbench.config import run_data
from relbench.evaluation import reach as reach_module
from relbench.runs import machine, results
from relbench.stats import summarize
from relbench.tasks import retrieval_tasks


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
    """Variant x copy distance: loss with the copy / with unrelated text in its place (1.00: the copy is not used)."""
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


USE_MARGIN = 0.01   # a copy that lowers the loss by less than 1% is not use of context, however tight its interval


def uses_context(copies: pd.DataFrame, segment: int) -> dict[str, list[int]]:
    """Per variant, the copy distances >= `segment` at which its model uses the earlier copy: the
    ratio at most 1 - USE_MARGIN and the whole of its interval (bootstrap over trials, or t over
    seeds) below 1.00. An empty list: at every such distance the copy lowers the loss by less than
    that, by nothing the interval can tell from 1.00, or raises it."""
    out: dict[str, list[int]] = {}
    ok = copies[(copies["status"] == "ok") & (copies["distance"] >= segment)]
    for variant, mine in ok.groupby("variant", sort=False):
        used = []
        for distance, here in mine.groupby("distance"):
            s = summarize(list(here["ratio"]))
            high = s.high if s.n > 1 else float(here["ratio_high"].iloc[0])
            if high < 1.0 and s.mean <= 1 - USE_MARGIN:
                used.append(int(distance))
        out[variant] = used
    return out


def context_note(copies: pd.DataFrame, segment: int) -> str | None:
    """What a report's perplexity columns can claim, from its own copy rows: whether its language
    models use context at a distance (None without copy rows)."""
    if copies is None or copies.empty:
        return None
    used = uses_context(copies, segment)
    users = {v: d for v, d in used.items() if d}
    if not users:
        return (f"**These language models do not use distant context.** For all {len(used)} variants, the copy "
                f"ratio at every distance >= {segment} tokens is 1.00 within its interval, above it, or less than "
                f"{USE_MARGIN:.0%} below it: an exact copy of the text to predict, standing that far back, does not "
                f"help them. Their perplexity ratios "
                f"therefore show whether a scheme keeps short-range prediction intact at longer lengths, not whether "
                f"it extrapolates the use of context; the retrieval track (passkey and MQAR reach of models trained "
                f"to retrieve at their training length) measures that.")
    parts = [f"`{v}` up to d={max(d)}" for v, d in users.items()]
    others = [v for v, d in used.items() if not d]
    return (f"Use of distant context (copy ratio at most {1 - USE_MARGIN:.2f}, its interval below 1.00): " + ", ".join(parts)
            + (f"; not used by {', '.join(f'`{v}`' for v in others)}, whose perplexity ratios show only that "
               f"short-range prediction holds" if others else "") + ".")


def window_flag(row) -> str:
    """"hard: 3/16 heads see <= 85" when position terms close hard windows inside the training length."""
    if not row.hard_heads:
        return "-"
    return f"hard: {row.hard_heads:g}/{row.heads:g} heads see <= {row.hard_window:g}"


def overview(run_dir: Path, summary: pd.DataFrame | None, train_length: int) -> tuple[list[str], list[list[str]]] | None:
    """One row per variant: perplexity at the training length and its ratio at the longest length per
    mode, the copy ratio inside the training length and at the farthest distance, each retrieval task's reach,
    mean attention distance at the training length, and the hard-window flag."""
    copies, reach = (_read(run_dir, name) for name in ("copy.csv", "attention.csv"))
    keys = {task: rows for task in retrieval_tasks() if not (rows := _read(run_dir, task.csv)).empty}
    frames = [f for f in (summary, copies, *keys.values()) if f is not None and not f.empty]
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
    reaches = {task: reach_module.run_reach(run_dir, task.csv) for task in keys}
    header += [f"{task.short} reach" for task in keys]
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
        row += [found[variant].cell() if variant in found else "-" for found in reaches.values()]
        if not reach.empty:
            mine = reach[(reach["variant"] == variant) & (reach["status"] == "ok")]
            if mine.empty:
                row += ["-", "-"]
            else:
                worst = mine.sort_values("hard_heads").iloc[-1]
                row += [f"{mine['mean_distance'].mean():.1f}", window_flag(worst)]
        body.append(row)
    return header, body


RETRIEVAL_TRACK = "retrieval"   # where `relbench bench` puts the retrieval run inside the language-model run


def tracks(run_dir: Path, config: dict) -> tuple[Path | None, Path | None]:
    """(language-model run, retrieval run) that a report on `run_dir` reads: a retrieval run is
    itself (its task is not lm); a language-model run holds its retrieval track, when there is one, in
    RETRIEVAL_TRACK (what `relbench bench` writes)."""
    run_dir = Path(run_dir)
    if config.get("train", {}).get("task", "lm") != "lm":
        return None, run_dir
    inner = run_dir / RETRIEVAL_TRACK
    return run_dir, (inner if (inner / results.CONFIG).is_file() else None)


def _ratio_cell(summary: pd.DataFrame | None, variant: str, length: int) -> str:
    """The perplexity ratio at `length` with its interval: ± over seeds, or for one seed the
    bootstrap interval of the long perplexity over the reference perplexity."""
    if summary is None or summary.empty:
        return "-"
    mine = summary[(summary["variant"] == variant) & (summary["length"] == length)]
    if mine.empty:
        return "-"
    r = mine.iloc[0]   # the first protocol (the default mode)
    if r.status != "ok":
        return str(r.status)
    if r.n_seeds > 1:
        return f"x{r.ratio_mean:.2f} ±{r.ratio_ci95:.2f}"
    if math.isnan(r.ppl_low) or r.ppl_mean <= 0:
        return f"x{r.ratio_mean:.2f}"
    scale = r.ratio_mean / r.ppl_mean
    return f"x{r.ratio_mean:.2f} [{r.ppl_low * scale:.2f}, {r.ppl_high * scale:.2f}]"


def _cost_cell(rows: pd.DataFrame | None, variant: str, length: int) -> str:
    """Bias construction + attention of one layer at `length` (ms, median over seeds) and its ratio to `none`."""
    if rows is None or rows.empty or "attention_ms" not in rows:
        return "-"
    here = rows[(rows["length"] == length) & (rows["status"] == "ok")]

    def cost(v: str) -> float:
        mine = here[here["variant"] == v]
        return float((mine["bias_ms"].fillna(0) + mine["attention_ms"]).median()) if len(mine) else math.nan

    mine, none = cost(variant), cost("none")
    if math.isnan(mine):
        return "-"
    return f"{mine:.1f} ms" + (f" (x{mine / none:.2f})" if not math.isnan(none) and none > 0 and variant != "none" else "")


def headline(run_dir: Path, config: dict, summary: pd.DataFrame | None,
             rows: pd.DataFrame | None) -> tuple[list[str], list[list[str]], list[str]] | None:
    """The table a report opens with, one row per variant: perplexity ratio at 16x the training
    length (with interval), whether the language model uses distant context, passkey and MQAR
    reach over the seeds that learned, steps to learn, and the attention cost at 4x; with the notes
    that say what the columns may claim. None when the run has none of it."""
    lm_dir, retrieval_dir = tracks(run_dir, config)
    lm_length = int(config["model"]["train_length"])
    copies = _read(lm_dir, "copy.csv") if lm_dir is not None else pd.DataFrame()
    reaches = {task: reach_module.run_reach(retrieval_dir, task.csv) if retrieval_dir is not None else {}
               for task in retrieval_tasks()}
    lm_variants = list(summary["variant"].unique()) if summary is not None and not summary.empty else []
    variants = list(dict.fromkeys(lm_variants + [v for found in reaches.values() for v in found]))
    if not variants:
        return None
    header = ["variant"]
    far = 16 * lm_length
    if lm_variants:
        header += [f"ppl ratio at {far} (16x)", "copy used at d >= 64"]
    for task, found in reaches.items():
        if found:
            header += [f"{task.short} reach", f"steps to learn {task.short}"]
    if lm_variants:
        header.append(f"attention at {4 * lm_length} (4x), ms")
    used = uses_context(copies, 64) if not copies.empty else {}
    body = []
    for variant in variants:
        row = [variant]
        if lm_variants:
            row.append(_ratio_cell(summary, variant, far))
            row.append("-" if variant not in used else (f"yes, up to d={max(used[variant])}" if used[variant] else "no"))
        for found in reaches.values():
            if found:
                cells = reach_module.summary_cells(found, variant)
                row += [cells["reach"], cells["steps"]]
        if lm_variants:
            row.append(_cost_cell(rows, variant, 4 * lm_length))
        body.append(row)
    notes = []
    note = context_note(copies, 64) if not copies.empty else None
    if note:
        notes.append(note)
    for task, found in reaches.items():
        missing = reach_module.competence_note(found) if found else None
        if missing:
            notes.append(f"{task.label}: {missing}")
    if retrieval_dir is None and lm_variants:
        notes.append(f"No retrieval track in {Path(run_dir) / RETRIEVAL_TRACK} yet (`relbench bench` trains it after the "
                     "language models, and this report is written again with its reach): reach is not measured.")
    return header, body, notes


def describe_run(config: dict[str, Any]) -> list[str]:
    env = config.get("environment", {})
    model, train = config["model"], config["train"]
    seeds = config.get("seeds", [train.get("seed", 0)])
    return [
        f"Preset `{config.get('preset')}`: d_model {model['d_model']}, {model['n_layers']} layers, "
        f"{model['n_heads']} heads, trained at length {model['train_length']} for {train['steps']} steps "
        f"of {train['batch_size']} sequences ({train.get('precision', 'fp32')}), seeds {', '.join(map(str, seeds))}, "
        f"on {config.get('dataset_description', run_data(config).dataset)}, tokenizer {run_data(config).tokenizer} "
        f"(vocabulary {model.get('vocab_size', 256):,}).",
        "Each perplexity table names its protocol: the mode, and the scored tokens (the same at every length) "
        "in segments spread over the whole test split.",
        f"Machine: {machine.describe_environment(env)}.",
        *[f"Folded in (`relbench merge`) from {entry.get('run', '?')}: {', '.join(entry.get('variants', []))}, seeds "
          f"{', '.join(map(str, entry.get('seeds', [])))}, trained on "
          f"{machine.describe_environment(entry.get('environment', {}))}."
          for entry in config.get("merged_from", [])],
        *([f"Placed against the panel {config['against'].get('panel', '?')} (`relbench bench --against`): its "
           f"{', '.join(config['against'].get('variants', []))}, seeds "
           f"{', '.join(map(str, config['against'].get('seeds', [])))}, were trained on "
           f"{machine.describe_environment(config['against'].get('environment', {}))}; the other variants here on the "
           f"machine above. A CPU's float order moves single runs, so a host is one more source of spread."]
          if config.get("against") else []),
    ]
