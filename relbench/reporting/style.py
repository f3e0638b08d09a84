"""What every figure of relbench shares: a scheme's colour and marker (the same in every plot of every
run), a grid of small panels, and the PNG writer (atomic, 110 dpi)."""

from __future__ import annotations

import io
import re
import zlib
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from relbench import positions
from relbench.errors import RelbenchError
from relbench.runs import results


def save(fig, path: Path) -> Path:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    results.atomic_write_bytes(path, buffer.getvalue())
    return path


MARKERS = "os^vDP*Xhd<>p"


PALETTE = [*plt.get_cmap("tab20").colors[0::2], *plt.get_cmap("Dark2").colors, *plt.get_cmap("tab20").colors[1::2]]


def colour_key(variant: str) -> str:
    """What a variant's colour follows: its scheme (`fox:bias_init=5`, `fox@logn` and `fox+ft512` are
    fox's; `rope:window=64` is rope on every layer), or for a layout (a scheme per layer) the layout
    itself, so that `rope*1,none` and `rope:window=32*1,none` are told apart from each other and from
    `rope`. A spec this process cannot parse (a plugin not loaded) goes by the name before its options."""
    trained = variant.split("@")[0].split("+")[0]
    try:
        spec = positions.parse(trained)
    except RelbenchError:
        return trained.split(":")[0]
    return spec.text if spec.is_layout else spec.pattern[0].scheme


def label(variant: str, width: int = 32) -> str:
    """A variant as a panel's title shows it: a long spec (a layout with its options) broken after its
    commas into lines of at most `width` characters (a part longer than that keeps a line of its own), so
    that neighbouring titles do not run into each other; a short one as it is."""
    lines = [""]
    for part in re.split(r"(?<=,)", variant):
        if lines[-1] and len(lines[-1]) + len(part) > width:
            lines.append("")
        lines[-1] += part
    return "\n".join(lines)


def style_of(variant: str) -> dict[str, Any]:
    """A scheme's colour and marker, the same in every plot of every run. The colour is `colour_key`'s: a
    registered scheme by its place among the registered names (the strong colours first: 18 of them
    before the pale ones), another (a layout, a plugin) by a checksum of its key. The marker is the whole
    spec's, so two forms of one scheme in one panel still differ."""
    names = positions.names()
    base = colour_key(variant)
    index = names.index(base) if base in names else len(names) + zlib.crc32(base.encode())
    return {"color": PALETTE[index % len(PALETTE)], "marker": MARKERS[zlib.crc32(variant.encode()) % len(MARKERS)]}


def grid(n: int, width: float = 3.5, height: float = 3.0, columns: int = 4, **kwargs):
    """A figure of n panels in rows of at most `columns` (rows = ceil(n / columns)), each panel
    `width` x `height` inches; the unused trailing slots hidden. kwargs go to plt.subplots
    (sharex, sharey). With a shared x, matplotlib labels the ticks of the bottom row only: a panel
    with a hidden slot below it keeps its own tick labels. Returns the figure and the n axes."""
    cols = max(1, min(columns, n))
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False, layout="constrained",
                             **kwargs)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    for ax in flat[max(0, n - cols):n]:  # nothing visible below these
        ax.xaxis.set_tick_params(which="both", labelbottom=True)
    return fig, flat[:n]
