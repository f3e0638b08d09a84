"""<task>_curves.png: a retrieval task's answer in one figure: accuracy against length, one panel per
scheme in the order of its tier table (highest mean first), each learned seed a thin line, the range
over seeds shaded and their mean drawn bold, the training length marked. A panel's title names the
scheme, its tier and how many seeds learned; a scheme with no learned seed gets a panel that says
"not learned" (nothing of it is drawn: it says nothing about length).

Six panels to a row at 2.4 x 1.9 inches (110 dpi: about 1,600 pixels wide), one y scale (0-100%) and
one x scale (the evaluated lengths) shared by all, each scheme in its own colour from style.style_of,
the same in every plot of every run.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import numpy as np

from relbench.evaluation import decisions
from relbench.evaluation.reach import Reach
from relbench.reporting import style

COLUMNS = 6


def seed_lines(r: Reach, lengths: list[int]) -> dict[int, list[float]]:
    """Each learned seed's accuracy at `lengths` (NaN where not evaluated; 0 beyond the reach of a scheme
    that cannot run longer, as the decisions count it)."""
    out = {}
    for seed in r.learned_seeds:
        found = [decisions.measured(r, seed, n) for n in lengths]
        out[seed] = [m[0] if m is not None else np.nan for m in found]
    return out


def draw(decided: decisions.Decisions, reaches: dict[str, Reach], path: Path) -> Path | None:
    """The figure for one task's decisions (decisions.decide) over its reaches; None when no scheme learned."""
    if decided.summary is None or not any(r.competent for r in reaches.values()):
        return None
    _, rows = decisions.tier_table(decided, reaches)
    lengths = sorted({decided.train_length, *decided.beyond})
    fig, axes = style.grid(len(rows), width=2.4, height=1.9, columns=COLUMNS, sharex=True, sharey=True)
    for ax, row in zip(axes, rows):
        variant, tier, learned = row[0], row[1], row[3]
        r = reaches[variant]
        colour = style.style_of(variant)["color"]
        lines = seed_lines(r, lengths)
        if lines:
            values = np.array(list(lines.values()), dtype=float)
            for line in values:
                ax.plot(lengths, line, color=colour, linewidth=0.7, alpha=0.45)
            with np.errstate(all="ignore"):
                ax.fill_between(lengths, np.nanmin(values, axis=0), np.nanmax(values, axis=0), color=colour,
                                alpha=0.15, linewidth=0)
                ax.plot(lengths, np.nanmean(values, axis=0), color=colour, linewidth=2.2)
        if r.competent and r.unsupported_beyond:
            ax.text(0.97, 0.5, "cannot run longer:\ncounted 0%", transform=ax.transAxes, ha="right", va="center",
                    fontsize=7, color="grey")
        if not lines:
            ax.text(0.5, 0.5, "not learned", transform=ax.transAxes, ha="center", va="center", fontsize=9,
                    color="grey")
        ax.axvline(decided.train_length, color="grey", linestyle=":", linewidth=0.8)
        label = f"tier {tier}" if tier not in ("not learned", "-", "too few seeds") else tier
        ax.set_title(f"{style.label(variant)}\n{label}, {learned} learned", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.25, linewidth=0.5)
    axes[0].set_xscale("log", base=2)
    axes[0].set_xticks(lengths, [f"{n // decided.train_length}x" if n % decided.train_length == 0 else str(n)
                                 for n in lengths])
    axes[0].xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axes[0].set_ylim(-0.03, 1.03)
    axes[0].yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0, decimals=0))
    fig.suptitle(f"{decided.task} accuracy against length (training length {decided.train_length}): each learned "
                 f"seed, their range and mean; panels by the {decisions.summary_label(decided)}, tier in the title",
                 fontsize=9)
    return style.save(fig, path)
