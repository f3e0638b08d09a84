"""PNG plots of a run, rendered from the same rows as the tables (matplotlib, no display needed).

- perplexity_vs_length.png: perplexity against evaluation length per variant (log x), one panel
  per evaluation mode, 95% intervals when there are several seeds;
- loss_by_position.png: mean loss against position inside the window at the longest length, with
  the training length marked;
- learned_bias.png: the learned bias against relative distance, per head, for every trained
  variant with a learned distance bias (xl, t5, ...), with ALiBi's fixed lines for comparison;
- <task>.png for each retrieval task (passkey.png, mqar.png, ...): accuracy per variant, length by the
  task's condition (passkey: depth of the key) or, for a binned task, by distance (mqar: from pair to
  query), over the seeds that learned the task at 1x (none when no seed learned it);
- <task>_curves.png (passkey_curves.png, ...): the task's answer, accuracy against length per scheme in its
  tier table's order, each learned seed with their range and mean (reporting/curves.py);
- copy_distance.png: loss with an earlier copy of the text / with unrelated text in its place, against its distance (copy.csv);
- attention_cost.png: attention time against length per backend, from profile.csv.

Panels are laid out in rows of at most four.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from relbench import positions
from relbench.errors import RelbenchError
from relbench.positions import forms
from relbench.positions.base import RelativeBias
from relbench.reporting import curves
from relbench.reporting.style import grid, label, save, style_of
from relbench.runs import checkpoints, results, rundir
from relbench.tasks.base import RetrievalTask

PLOTS = "plots"


def _legend(ax) -> None:
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def log_axes(ax, xticks: list[int] | None = None) -> None:
    """Log axes labelled with plain numbers (lengths in base 2)."""
    plain = matplotlib.ticker.FormatStrFormatter("%g")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    if xticks is not None:
        ax.set_xticks([int(x) for x in xticks])
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(_MinorPlain())


class _MinorPlain(matplotlib.ticker.Formatter):
    """Minor log ticks labelled "%g": all of them while the axis spans at most a decade
    (perplexities), only 2 and 5 up to two decades, none beyond (attention times over several
    decades keep just the powers of ten), so the labels never run into each other."""

    def __call__(self, x, pos=None) -> str:
        low, high = sorted(self.axis.get_view_interval())
        span = high / low if low > 0 else float("inf")
        mantissa = round(x / 10 ** np.floor(np.log10(x)), 6) if x > 0 else 0
        return f"{x:g}" if span <= 10 or (span <= 100 and mantissa in (2, 5)) else ""


def family_of(variant: str) -> str:
    """The family a variant's panel is drawn in ("relative bias" for FIRE's position-normalised kind)."""
    try:
        schemes = positions.parse(forms.scheme_spec(variant)).schemes
    except RelbenchError:
        return "other"
    if len(schemes) > 1:
        return "layout"                  # a scheme per layer: its own panel
    family = schemes[0].family
    return family.split(" (")[0] or "other"


LINESTYLES = ("-", "--", ":", "-.")
RATIO_TICKS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0, 32.0)


def ratio_title(variant: str, mine: pd.DataFrame, longest: int) -> str:
    """A panel's title: the scheme and its ratio at its longest length, saying where a line stops early
    (`learned` has no positions past its training length)."""
    last = mine.sort_values("length").iloc[-1]
    stops = f" (to {int(last['length']):g} only)" if last["length"] < longest else f" at {int(last['length']):g}"
    return f"{label(variant)}\n×{last['ratio_mean']:.2f}{stops}"


def perplexity_vs_length(summary: pd.DataFrame, train_length: int, path: Path) -> Path:
    """Perplexity at each length as a ratio to the variant's own at the training length, one small panel
    per scheme (six to a row, one shared log y axis), its protocols as line styles with their 95%
    intervals over seeds; panels ordered by the first protocol's ratio at the longest length (the flat
    first), each titled with that ratio, so that no line is drawn over another scheme's."""
    protocols = list(summary["protocol"].unique())
    shown = summary[summary["status"] == "ok"]
    lengths = sorted(summary["length"].unique())
    first = shown[shown["protocol"] == protocols[0]]
    ends = {v: m.sort_values("length")["ratio_mean"].iloc[-1] for v, m in first.groupby("variant", sort=False)}
    variants = sorted(shown["variant"].unique(), key=lambda v: (ends.get(v, np.inf), v))
    fig, axes = grid(len(variants), width=2.3, height=2.0, columns=6, sharex=True, sharey=True)
    for ax, variant in zip(axes, variants):
        for protocol, style in zip(protocols, LINESTYLES):
            mine = shown[(shown["protocol"] == protocol) & (shown["variant"] == variant)].sort_values("length")
            ax.errorbar(mine["length"], mine["ratio_mean"], yerr=mine["ratio_ci95"].fillna(0), capsize=2,
                        linestyle=style, markersize=3, **style_of(variant))
        mine = first[first["variant"] == variant]
        ax.set_title(ratio_title(variant, mine, max(lengths)) if not mine.empty else label(variant), fontsize=8)
        ax.axvline(train_length, color="grey", linestyle=":", linewidth=0.8)
        ax.axhline(1.0, color="grey", linewidth=0.6)
        log_axes(ax, lengths)
        ax.tick_params(labelsize=7)
        ax.tick_params(axis="x", labelrotation=45)
    low, high = axes[0].get_ylim()          # shared: a few plain ticks, no minor labels to run together
    axes[0].set_yticks([t for t in RATIO_TICKS if low <= t <= high] or [1.0])
    axes[0].yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    if len(protocols) > 1:                  # the protocols' line styles, in black: every panel has its own colour
        handles = [matplotlib.lines.Line2D([], [], color="black", linestyle=style) for _, style in zip(protocols, LINESTYLES)]
        fig.legend(handles, [textwrap.shorten(p, 60) for p in protocols], loc="outside upper center",
                   ncols=len(protocols), fontsize=8, frameon=False)
    fig.supxlabel(f"evaluation length (tokens); dotted: the training length {train_length}", fontsize=9)
    fig.supylabel("perplexity / perplexity at the training length", fontsize=9)
    return save(fig, path)


def loss_by_position(bins: pd.DataFrame, train_length: int, path: Path) -> Path:
    mode = "nonoverlap" if "nonoverlap" in set(bins["mode"]) else bins["mode"].iloc[0]
    here = bins[bins["mode"] == mode]
    longest = int(here["length"].max())
    here = here[here["length"] == longest]
    if "segment" in here:   # one protocol: the widest measurement at that length (n_tokens is per bin)
        here = here[here["segment"] == here["segment"].max()]
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    for variant, mine in here.groupby("variant", sort=False):
        per_bin = mine.groupby(["bin_start", "bin_end"]).apply(lambda g: g["loss_sum"].sum() / g["n_tokens"].sum(),
                                                               include_groups=False).reset_index(name="loss")
        centre = (per_bin["bin_start"] + per_bin["bin_end"] - 1) / 2 + 1
        ax.plot(centre, per_bin["loss"], label=variant, **style_of(variant))
    ax.axvline(train_length, color="grey", linestyle=":", label="training length")
    ax.set(xlabel="position in window (log bins)", ylabel="mean loss (nats)",
           title=f"Loss by position at length {longest} ({mode})")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    _legend(ax)
    return save(fig, path)


def learned_bias(run_dir: Path, config: dict[str, Any], path: Path) -> Path | None:
    """Bias against distance per head, layer 0 and the last layer, for learned distance biases."""
    seed = config.get("seeds", [0])[0]
    panels = []
    for variant in config.get("variants", []):
        folder = rundir.checkpoint_dir(run_dir, variant, seed)
        meta = checkpoints.read_meta(folder)
        if not meta or not meta.get("finished"):
            continue
        if not any(issubclass(cls, RelativeBias) for cls in positions.parse(variant).schemes):
            continue
        model = checkpoints.load_model(folder)
        if model.n_params(positions_only=True) == 0:
            continue
        biased = [i for i in range(len(model.blocks)) if isinstance(model.position(i), RelativeBias)]
        shown = sorted({biased[0], biased[-1]}) if len(model.positions) > 1 else biased[:1]
        panels += [(variant, layer, model.position(layer)) for layer in shown]
    if not panels:
        return None
    train_length = int(config["model"]["train_length"])
    distance = torch.arange(0, 2 * train_length)
    fig, axes = grid(len(panels), sharex=True)  # same distances in every panel; biases differ in scale
    for ax, (variant, layer, enc) in zip(axes, panels):
        with torch.no_grad():
            values = enc.distance_bias(distance).float()                     # (H, D)
            alibi = -positions.alibi.slopes(enc.n_heads)[:, None] * distance  # (H, D)
        for h in range(values.shape[0]):
            line, = ax.plot(distance, values[h] - values[h, 0], label=f"head {h}")
            ax.plot(distance, alibi[h], color=line.get_color(), linestyle="--", linewidth=0.8, alpha=0.6)
        shifted = values - values[:, :1]
        low, high = float(shifted.min()), float(shifted.max())
        margin = 0.1 * (high - low) + 0.5
        ax.set(title=f"{variant}, layer {layer}", ylim=(low - margin, high + margin))
        ax.axvline(train_length, color="grey", linestyle=":")
    axes[0].legend(fontsize=7, title="dashed: ALiBi", title_fontsize=7)
    fig.supxlabel(f"distance i - j (dotted: the training length {train_length})", fontsize=9)
    fig.supylabel("bias - bias at distance 0, per head", fontsize=9)
    return save(fig, path)


def attention_cost(profile: pd.DataFrame, path: Path) -> Path | None:
    from relbench.cost.profiling import shape_labels

    ok = profile[profile["status"] == "ok"].copy()
    if ok.empty:
        return None
    ok["total_ms"] = ok["bias_ms"] + ok["attention_ms"]
    ok["shape"] = shape_labels(ok)
    several = ok["shape"].nunique() > 1
    variants = list(ok["variant"].unique())
    fig, axes = grid(len(variants), sharex=True, sharey=True)
    for ax, variant in zip(axes, variants):
        for (backend, shape), mine in ok[ok["variant"] == variant].groupby(["backend", "shape"], sort=False):
            mine = mine.sort_values("length")
            ax.plot(mine["length"], mine["total_ms"], marker="o", label=f"{backend} ({shape})" if several else backend)
        ax.set(xlabel="length", title=variant)
        log_axes(ax, sorted(ok["length"].unique()))
        ax.legend(fontsize=7)
    for ax in axes:
        if ax.get_subplotspec().is_first_col():
            ax.set_ylabel("bias + attention forward (ms)")
    return save(fig, path)


def retrieval_heatmaps(rows: pd.DataFrame, train_length: int, path: Path, learned: set[tuple[str, int]],
                       task: RetrievalTask) -> Path | None:
    """Retrieval accuracy per variant, one panel each: evaluation length (x) by where the answer sits
    (y: the task's condition, e.g. the key's depth for passkey; for a binned task the distance of the
    evidence, in power-of-two bins, e.g. from pair to query for MQAR),
    pooled over the seeds that learned the task at the training length (`learned`: (variant, seed)).
    A variant with no learned seed gets an empty panel titled "not learned"; with no learned seed at
    all (language models asked for a passkey) there is nothing to draw and no plot is written."""
    ok = rows[rows["status"] == "ok"]
    if ok.empty or not any((v, int(s)) in learned for v, s in zip(ok["variant"], ok["seed"])):
        return None
    ok = ok.assign(place=ok["distance_low"] if task.binned else ok[task.axis])
    count = task.count
    variants = list(dict.fromkeys(ok["variant"]))
    lengths = sorted(ok["length"].unique())
    places = sorted(ok["place"].unique())
    fig, axes = grid(len(variants), width=3.4, height=3.4 if task.binned else 2.8)
    image = None
    for ax, variant in zip(axes, variants):
        mine = ok[(ok["variant"] == variant) & ok["seed"].map(lambda s, v=variant: (v, int(s)) in learned)]
        ax.set_xticks(range(len(lengths)), [f"{n:g}" + ("*" if n == train_length else "") for n in lengths], fontsize=7)
        labels = [task.place(d) for d in places]
        ax.set_yticks(range(len(places)), labels, fontsize=6 if len(places) > 8 else 7)
        seeds = mine["seed"].nunique()
        total = ok[ok["variant"] == variant]["seed"].nunique()
        if mine.empty:
            ax.set_title(f"{label(variant)}: not learned (0/{total})", fontsize=9)
            ax.set_xlim(-0.5, len(lengths) - 0.5)
            ax.set_ylim(-0.5, len(places) - 0.5)
            continue
        pooled = mine.groupby(["place", "length"])[["correct", count]].sum()
        cells = (pooled["correct"] / pooled[count]).unstack("length").reindex(index=places, columns=lengths)
        cells = cells.to_numpy(dtype=float)
        image = ax.imshow(cells, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
        for (i, j), value in np.ndenumerate(cells):
            if not np.isnan(value):
                ax.text(j, i, f"{value:.0%}", ha="center", va="center", fontsize=5 if len(places) > 8 else 6,
                        color="white" if value < 0.6 else "black")
        ax.set_title(f"{label(variant)} ({seeds}/{total} seeds learned)" if total > 1 else label(variant), fontsize=9)
    axes[0].set(xlabel="length (* training)", ylabel=task.place_label)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.6, label=f"{task.name} accuracy")
    return save(fig, path)


def copy_distance(copies: pd.DataFrame, train_length: int, path: Path) -> Path | None:
    """Loss with an earlier copy of the text / with unrelated text in its place, against the copy's distance, mean over seeds."""
    ok = copies[copies["status"] == "ok"]
    if ok.empty:
        return None
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    for variant, mine in ok.groupby("variant", sort=False):
        mean = mine.groupby("distance")[["ratio", "ratio_low", "ratio_high"]].mean().reset_index()
        ax.errorbar(mean["distance"], mean["ratio"], yerr=[mean["ratio"] - mean["ratio_low"],
                                                           mean["ratio_high"] - mean["ratio"]],
                    capsize=2, label=variant, **style_of(variant))
    ax.axvline(train_length, color="grey", linestyle=":", label="training length")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.set(xlabel="distance of the earlier copy (tokens)", ylabel="loss with copy / with unrelated text",
           title="Does the model use a copy of the text d tokens back? (1 = not at all)")
    _legend(ax)
    return save(fig, path)


def render_all(run_dir: Path, config: dict[str, Any], summary: pd.DataFrame | None) -> dict[str, Path]:
    from relbench.cost.profiling import PROFILE_CSV
    from relbench.evaluation.evaluators import POSITIONS_CSV

    run_dir = Path(run_dir)
    out: dict[str, Path] = {}
    folder = run_dir / PLOTS
    if summary is not None and not summary.empty:
        train_length = int(config["model"]["train_length"])
        out["perplexity vs length"] = perplexity_vs_length(summary, train_length, folder / "perplexity_vs_length.png")
        if (run_dir / POSITIONS_CSV).is_file():
            out["loss by position"] = loss_by_position(results.read_csv(run_dir / POSITIONS_CSV), train_length,
                                                       folder / "loss_by_position.png")
        bias = learned_bias(run_dir, config, folder / "learned_bias.png")
        if bias is not None:
            out["learned bias"] = bias
    from relbench.evaluation import decisions
    from relbench.evaluation.reach import run_reach
    from relbench.tasks import TASKS, retrieval_tasks

    for task in retrieval_tasks():
        if config and (run_dir / task.csv).is_file():
            found = run_reach(run_dir, task.csv)
            learned = {(v, s) for v, r in found.items() for s in r.learned_seeds}
            train_length = int(config["model"]["train_length"])
            out[task.name] = retrieval_heatmaps(results.read_csv(run_dir / task.csv), train_length,
                                                folder / f"{task.name}.png", learned, task)
            out[f"{task.name} curves"] = curves.draw(decisions.decide(found, task.name, train_length), found,
                                                     folder / f"{task.name}_curves.png")
    copy_csv = TASKS["copy"].csv
    if config and (run_dir / copy_csv).is_file():
        out["copy distance"] = copy_distance(results.read_csv(run_dir / copy_csv), int(config["model"]["train_length"]),
                                             folder / "copy_distance.png")
    if (run_dir / PROFILE_CSV).is_file():
        cost = attention_cost(results.read_csv(run_dir / PROFILE_CSV), folder / "attention_cost.png")
        if cost is not None:
            out["attention cost"] = cost
    return {name: path for name, path in out.items() if path is not None}
