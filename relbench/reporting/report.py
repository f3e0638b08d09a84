"""Tables from a run directory's rows: a Rich table, report.md with plots, and pivoted CSVs.

Every view is rendered from the same tidy rows of extrapolation.csv (and train.csv, positions.csv,
profile.csv), so the terminal, the Markdown, the CSV and the plots never disagree. With several
seeds a cell shows the mean, the 95% interval half-width (Student's t) and the ratio to the
training length; "~" marks a variant the seeds cannot tell from the best one at that length.
Beside each perplexity table, bits per byte: the figure that compares runs with different
tokenizers (perplexity is per token, and a BPE token holds several bytes).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table

from relbench.comparisons import MARGIN, unresolved
from relbench.errors import RelbenchError
from relbench.evaluation.summaries import recorded_summary
from relbench.reporting import overview, tiers
from relbench.runs import results, rundir
from relbench.stats import summarize
from relbench.training import finetune

PIVOT_CSV = "extrapolation_pivot.csv"
REPORT_MD = "report.md"


def load_rows(run_dir: Path) -> pd.DataFrame:
    path = Path(run_dir) / results.EXTRAPOLATION_CSV
    rows = results.read_csv(path)
    missing = {"variant", "seed", "length", "mode", "status", "ppl"} - set(rows.columns)
    if missing:
        raise RelbenchError(f"{path} lacks columns {sorted(missing)}; rerun `relbench extrapolate`")
    rows["message"] = ["" if pd.isna(m) else str(m) for m in rows["message"]] if "message" in rows else ""
    return with_protocol(rows)


def with_protocol(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` with a `protocol` column: what was scored and how (mode, requested stride, scored tokens
    and segment length). Rows of different protocols are never mixed in one table or ratio."""
    if "protocol" in rows:
        return rows
    rows = rows.copy()
    rows["protocol"] = rows["mode"]
    return rows


def variant_order(rows: pd.DataFrame, config: dict[str, Any]) -> list[str]:
    trained = [v for v in config.get("variants", []) if v in set(rows["variant"])]
    return trained + sorted(set(rows["variant"]) - set(trained))


def reference_length(rows: pd.DataFrame, config: dict[str, Any]) -> int:
    """The training length when it was evaluated, else the shortest evaluated length."""
    train_length = int(config["model"]["train_length"])
    lengths = sorted(rows["length"].unique())
    return train_length if train_length in lengths else int(lengths[0])


def aggregate(rows: pd.DataFrame, config: dict[str, Any]) -> pd.DataFrame:
    """One row per variant x mode x length: seed statistics of perplexity and of the ratio to the
    reference length (computed per seed, then summarised), and whether the best is resolved."""
    ref = reference_length(rows, config)
    rows = with_protocol(rows)
    out = []
    for protocol, by_mode in rows.groupby("protocol", sort=False):
        mode = by_mode["mode"].iloc[0]
        ok = by_mode[by_mode["status"] == "ok"]
        per_seed = {(r.variant, r.length, r.seed): r.ppl for r in ok.itertuples()}
        for length in sorted(by_mode["length"].unique()):
            here = ok[ok["length"] == length]
            means = here.groupby("variant")["ppl"].mean()
            best = means.idxmin() if len(means) else None
            best_by_seed = {r.seed: r.ppl for r in here[here["variant"] == best].itertuples()}
            for variant in variant_order(by_mode, config):
                mine = by_mode[(by_mode["variant"] == variant) & (by_mode["length"] == length)]
                if mine.empty:
                    continue
                seeds = sorted(mine["seed"].unique())
                ppl = {s: per_seed.get((variant, length, s), math.nan) for s in seeds}
                ratio = [ppl[s] / per_seed.get((variant, ref, s), math.nan) for s in seeds]
                p, r = summarize(list(ppl.values())), summarize(ratio)
                statuses = sorted(set(mine["status"]))
                tie = None if variant == best or p.n == 0 else unresolved(ppl, best_by_seed)
                ok_mine = mine[mine["status"] == "ok"]
                bits = summarize([float(v) for v in ok_mine.get("bits_per_byte", pd.Series(dtype=float)).dropna()])
                text_low, text_high = (float(ok_mine[c].mean()) if c in ok_mine and len(ok_mine) else math.nan
                                       for c in ("ppl_low", "ppl_high"))
                out.append({"variant": variant, "mode": mode, "protocol": protocol, "length": int(length), "n_seeds": p.n,
                            "status": "ok" if statuses == ["ok"] else "/".join(statuses),
                            "ppl_mean": p.mean, "ppl_std": p.std, "ppl_ci95": p.half_width,
                            "ppl_low": text_low, "ppl_high": text_high,
                            "ratio_mean": r.mean, "ratio_ci95": r.half_width, "bpb_mean": bits.mean,
                            "bpb_ci95": bits.half_width, "bpb_n": bits.n, "best": variant == best,
                            "unresolved_vs_best": tie})
    return pd.DataFrame(out)


def pivot(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per variant and mode, columns per length: ppl mean, std, 95% half-width, ratio."""
    out = []
    for (variant, protocol), mine in summary.groupby(["variant", "protocol"], sort=False):
        record: dict[str, Any] = {"variant": variant, "mode": mine["mode"].iloc[0], "protocol": protocol,
                                  "n_seeds": int(mine["n_seeds"].max())}
        for r in mine.itertuples():
            record.update({f"ppl@{r.length}": r.ppl_mean, f"std@{r.length}": r.ppl_std,
                           f"ci95@{r.length}": r.ppl_ci95, f"ratio@{r.length}": r.ratio_mean,
                           f"bpb@{r.length}": r.bpb_mean, f"status@{r.length}": r.status})
        out.append(record)
    return pd.DataFrame(out)


def _cell(r) -> str:
    if r.status != "ok":
        return r.status
    text = f"{r.ppl_mean:.3f}"
    if r.n_seeds > 1:
        text += f" ±{r.ppl_ci95:.3f}"
    elif not math.isnan(getattr(r, "ppl_low", math.nan)):
        text += f" [{r.ppl_low:.3f}, {r.ppl_high:.3f}]"
    if not math.isnan(r.ratio_mean):
        text += f" (x{r.ratio_mean:.2f}" + (f" ±{r.ratio_ci95:.2f})" if r.n_seeds > 1 else ")")
    if r.unresolved_vs_best is True:
        text += " ~"
    return text


def perplexity_table(summary: pd.DataFrame, protocol: str) -> tuple[list[str], list[list[str]]]:
    mine = summary[summary["protocol"] == protocol]
    lengths = sorted(mine["length"].unique())
    header = ["variant"] + [f"L={n}" for n in lengths]
    body = []
    for variant, rows in mine.groupby("variant", sort=False):
        cells = {r.length: _cell(r) for r in rows.itertuples()}
        body.append([variant] + [cells.get(n, "-") for n in lengths])
    return header, body


def bits_table(summary: pd.DataFrame, protocol: str) -> tuple[list[str], list[list[str]]] | None:
    """Bits per byte per variant and length (mean over seeds ± 95% half-width); None when the rows
    predate the bits_per_byte column."""
    mine = summary[summary["protocol"] == protocol]
    if not (mine["bpb_n"] > 0).any():
        return None
    lengths = sorted(mine["length"].unique())
    body = []
    for variant, rows in mine.groupby("variant", sort=False):
        cells = {r.length: f"{r.bpb_mean:.4f}" + (f" ±{r.bpb_ci95:.4f}" if r.bpb_n > 1 else "") if r.bpb_n
                 else "-" if r.status == "ok" else r.status for r in rows.itertuples()}
        body.append([variant] + [cells.get(n, "-") for n in lengths])
    return ["variant"] + [f"L={n}" for n in lengths], body


def _path_note(rows: pd.DataFrame, requested: str | None = None) -> str:
    """" [chunked]": the attention path the rows really took, when it is not the backend asked for
    (the split backend on a sequence too short to split runs the chunked path; auto picks one)."""
    if "path" not in rows:
        return ""
    paths = sorted({str(p) for p in rows["path"].dropna() if str(p)})
    return f" [{'/'.join(paths)}]" if paths and paths != [requested] else ""


def cost_table(rows: pd.DataFrame, config: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Bias construction and attention time (ms, one layer, batch 1) per variant and length, with the
    attention path that ran in brackets."""
    lengths = sorted(rows["length"].unique())
    header = ["variant"] + [f"L={n} bias / attn ms [path]" for n in lengths]
    body = []
    for variant in variant_order(rows, config):
        mine = rows[(rows["variant"] == variant) & (rows["status"] == "ok")].groupby("length")
        cells = []
        for n in lengths:
            if n not in mine.groups:
                status = rows[(rows["variant"] == variant) & (rows["length"] == n)]["status"]
                cells.append(status.iloc[0] if len(status) else "-")
            else:
                group = mine.get_group(n)
                cells.append(f"{group['bias_ms'].median():.2f} / {group['attention_ms'].median():.1f}"
                             + _path_note(group))
        body.append([variant] + cells)
    return header, body


def learned_cell(summary: dict[str, Any]) -> str:
    """A seed's "learned at step" cell: the step, and the moments it was measured at ([train] moments)."""
    if not summary.get("learned"):
        return f"not learned in {summary['steps']}"
    moments = summary.get("moments") or []
    return f"{summary['learned_step']}" + (f" (measured at {len(moments)} moments, steps {moments[0]}-{moments[-1]})"
                                           if len(moments) > 1 else "")


def training_table(run_dir: Path, config: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "seeds", "params", "position params", "position lr x", "precision", "final val loss",
              "train time (s)", "tokens/s"]
    criterion = float(config.get("train", {}).get("criterion_accuracy", 0) or 0) > 0
    if criterion:
        header.append("learned at step, per seed")
    body = []
    curves = results.read_csv(run_dir / results.TRAIN_CSV) if (run_dir / results.TRAIN_CSV).is_file() else None
    for variant in config.get("variants", []):
        found = [recorded_summary(run_dir, variant, s, config, curves) for s in config.get("seeds", [0])]
        done = [s for s in found if s is not None]
        if not done:
            continue
        val = summarize([s["val_loss"] for s in done])
        val_text = f"{val.mean:.4f}" + (f" ±{val.half_width:.4f}" if val.n > 1 else "")
        scale = (f"{done[0]['position_lr_scale']:g} ({done[0].get('position_lr_source', '?')})"
                 if "position_lr_scale" in done[0] and done[0]["position_params"] else "-")
        row = [variant, str(len(done)), f"{done[0]['n_params']:,}", f"{done[0]['position_params']:,}", scale,
               str(done[0].get("precision", "-")), val_text,
               f"{sum(s['train_seconds'] for s in done) / len(done):.1f}",
               f"{sum(s['tokens_per_s'] for s in done) / len(done):,.0f}"]
        if criterion:
            row.append(", ".join(learned_cell(s) for s in done))
        body.append(row)
    return header, body


def profile_table(rows: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Per variant x backend (x shape, when several were profiled), per length: attention forward ms
    (+ bias construction ms), peak MB, and forward+backward ms where measured."""
    from relbench.cost.profiling import shape_labels

    rows = rows.assign(shape=shape_labels(rows))
    several = rows["shape"].nunique() > 1
    lengths = sorted(rows["length"].unique())
    header = ["variant", "backend"] + (["shape"] if several else []) + [f"L={n}" for n in lengths]
    body = []
    for (variant, backend, shape), mine in rows.groupby(["variant", "backend", "shape"], sort=False):
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
            cells.append(cell + _path_note(mine.loc[[n]], str(backend)))
        body.append([str(variant), str(backend)] + ([str(shape)] if several else []) + cells)
    return header, body


PROFILE_TITLE = ("Cost: attention forward ms (+ bias construction ms), peak extra memory, "
                 "| fb = forward+backward ms, [path] = the path that ran when it is not the backend asked for")


def rich_table(title: str, header: list[str], body: list[list[str]]) -> Table:
    table = Table(title=title, title_justify="left")
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i == 0 else "right", no_wrap=i == 0)   # never cut a variant's name
    for row in body:
        table.add_row(*row)
    return table


def markdown_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def task_tables() -> list[tuple[str, str]]:
    """(CSV name, title) of every task table a report can hold: copy distance, then every registered
    retrieval task's accuracy and reach (relbench/tasks), in registration order."""
    from relbench.tasks import retrieval_tasks
    return [("copy.csv", "Copy distance: loss with an earlier copy of the text / with unrelated text there (1.00: not used)"),
            *((task.csv, task.title()) for task in retrieval_tasks())]


HEADLINE_TITLE = ("Headline: does a model that uses its context at the training length still use it longer, "
                  "and at what cost")


def render(run_dir: Path, console: Console, plots: bool = True, margin: float = MARGIN) -> dict[str, Path]:
    """Print the tables; write report.md, the pivoted CSV, each retrieval task's pairwise comparisons
    (`<task>_comparisons.csv`, equivalence within +-`margin`) and the plots (PNG). A retrieval task's
    tiers come first."""
    from relbench.cost.profiling import PROFILE_CSV
    run_dir = Path(run_dir)
    has_rows = (run_dir / results.EXTRAPOLATION_CSV).is_file()
    has_profile = (run_dir / PROFILE_CSV).is_file()
    tasks = [(name, title) for name, title in task_tables() if (run_dir / name).is_file()]
    if not has_rows and not has_profile and not tasks:
        rundir.require_run(run_dir)  # a missing directory, or one that is not a run, says so
        raise RelbenchError(f"{run_dir} has nothing to report yet; run `relbench extrapolate --run-dir {run_dir}` "
                            f"or `relbench profile --run-dir {run_dir}` first")
    written: dict[str, Path] = {}
    config: dict[str, Any] = rundir.require_run(run_dir) if has_rows or tasks else {}
    rows = summary = None
    if has_rows:
        rows = load_rows(run_dir)
        summary = aggregate(rows, config)
    sections, notes = overview_sections(run_dir, config, summary, rows)
    if summary is not None:
        sections += perplexity_sections(summary, rows, config)
    tiered: list = []
    sections += tiers.task_sections(run_dir, tasks, config, margin, tiered, written)
    sections[:0] = tiered
    if has_rows:
        sections.append(("Cost per layer, batch 1: building the position terms / attention (ms)", *cost_table(rows, config)))
    if config:
        sections.append(("Training", *training_table(run_dir, config)))
    if summary is not None:
        written["pivot"] = run_dir / PIVOT_CSV
        results.write_csv(written["pivot"], pivot(summary))
    if has_profile:
        sections.append((PROFILE_TITLE, *profile_table(results.read_csv(run_dir / PROFILE_CSV))))
    for title, header, body in sections:
        console.print(rich_table(title, header, body))
        if title == HEADLINE_TITLE:
            for note in notes:
                console.print(note, markup=False)
    figures = {}
    if plots:
        from relbench.reporting import plots as plotting

        figures = plotting.render_all(run_dir, config, summary)
        written.update({f"plot:{name}": path for name, path in figures.items()})
    written["report"] = run_dir / REPORT_MD
    results.atomic_write_text(written["report"], markdown(config, rows, summary, sections, figures, run_dir, notes))
    return written


def overview_sections(run_dir: Path, config: dict[str, Any], summary: pd.DataFrame | None,
                      rows: pd.DataFrame | None) -> tuple[list, list[str]]:
    """The headline and the overview sections (none without a run's config), and the headline's notes."""
    sections: list = []
    notes: list[str] = []
    if config:
        top = overview.headline(run_dir, config, summary, rows)
        if top is not None:
            header, body, notes = top
            sections.append((HEADLINE_TITLE, header, body))
        table = overview.overview(run_dir, summary, int(config["model"]["train_length"]))
        if table is not None:
            sections.append(("Overview: perplexity ratio, use of distant context, retrieval, attention reach", *table))
    return sections, notes


def perplexity_sections(summary: pd.DataFrame, rows: pd.DataFrame, config: dict[str, Any]) -> list:
    """Per protocol: the perplexity table, bits per byte (where recorded) and fine-tuning's comparison."""
    sections = []
    ref = reference_length(rows, config)
    for protocol in summary["protocol"].unique():
        sections.append((f"Perplexity, {protocol} (ratio to L={ref})", *perplexity_table(summary, protocol)))
        bits = bits_table(summary, protocol)
        if bits is not None:
            sections.append((f"Bits per byte, {protocol}", *bits))
        tuned = finetune.comparison_table(summary, rows, protocol)
        if tuned is not None:
            sections.append((f"Fine-tuning to the target length: perplexity zero-shot -> after fine-tuning, "
                             f"{protocol}", *tuned))
    return sections


def markdown(config: dict[str, Any], rows: pd.DataFrame | None, summary: pd.DataFrame | None, sections,
             figures: dict[str, Path], run_dir: Path, notes: list[str] | None = None) -> str:
    lines = ["# relbench report"]
    if config:
        lines += ["", *overview.describe_run(config)]
    if rows is not None:
        if summary is not None and summary["n_seeds"].max() > 1:
            lines += ["", "Cells: mean perplexity over seeds ± half-width of its 95% interval (Student's t), "
                          "(x ratio to the training length, computed per seed then averaged, ± its 95% interval); ~ "
                          "marks a variant whose paired difference to the best at that length the seeds cannot "
                          "resolve (95% interval contains 0)."]
        else:
            lines += ["", "Cells: perplexity [95% bootstrap interval over the scored windows] (x ratio to the "
                          "training length)."]
        lines += ["", f"Perplexity is per token of the run's tokenizer ({config.get('tokenizer', 'bytes')}). Bits per "
                      "byte (the total loss in bits over the scored predictions / the UTF-8 bytes of their targets) "
                      "is the figure that compares tokenizers: a BPE token holds several bytes, so its perplexity "
                      "is higher for the same model quality; for byte tokens bits per byte is the loss / ln 2."]
    for title, header, body in sections:
        lines += ["", f"## {title}", "", markdown_table(header, body)]
        if title == HEADLINE_TITLE:
            lines += [line for note in notes or [] for line in ("", note)]
    if figures:
        lines += ["", "## Plots", ""]
        lines += [f"![{name}]({path.relative_to(run_dir)})" for name, path in figures.items()]
    notes = rows[rows["status"] != "ok"].drop_duplicates(["variant", "length", "status"]) if rows is not None else []
    if len(notes):
        lines += ["", "## Not evaluated", ""]
        lines += [f"- {r.variant} at {r.length}: {r.status} ({r.message})" for r in notes.itertuples()]
    return "\n".join(lines) + "\n"
