"""Seed aggregation and the markers of unresolved differences, on hand-made rows."""

import itertools
import math

import pandas as pd
import pytest

from relbench.reporting.report import aggregate, perplexity_table

CONFIG = {"model": {"train_length": 16}, "variants": ["a", "b", "c"]}


def rows(values):
    """values: {variant: {length: [ppl per seed]}} -> tidy extrapolation rows."""
    out = []
    for variant, by_length in values.items():
        for length, ppls in by_length.items():
            for seed, ppl in enumerate(ppls):
                out.append({"variant": variant, "seed": seed, "length": length, "mode": "nonoverlap",
                            "status": "ok", "ppl": ppl, "message": ""})
    return pd.DataFrame(out)


def test_aggregate_statistics_and_resolution():
    table = rows({
        "a": {16: [4.0, 4.2, 4.1], 64: [4.0, 4.1, 4.2]},   # best at 64
        "b": {16: [4.1, 4.1, 4.1], 64: [4.2, 4.0, 4.3]},   # paired differences 0.2, -0.1, 0.1: unresolved
        "c": {16: [5.0, 5.1, 5.2], 64: [9.0, 9.2, 9.1]},   # clearly worse
    })
    summary = aggregate(table, CONFIG).set_index(["variant", "length"])
    a64 = summary.loc[("a", 64)]
    assert a64["best"] and a64["n_seeds"] == 3
    assert a64["ppl_mean"] == pytest.approx(4.1) and a64["ppl_std"] == pytest.approx(0.1)
    assert a64["ppl_ci95"] == pytest.approx(4.303 * 0.1 / math.sqrt(3))
    assert a64["ratio_mean"] == pytest.approx((4.0 / 4.0 + 4.1 / 4.2 + 4.2 / 4.1) / 3)
    assert summary.loc[("b", 64), "unresolved_vs_best"] is True
    assert summary.loc[("c", 64), "unresolved_vs_best"] is False
    _header, body = perplexity_table(summary.reset_index(), "nonoverlap")
    cells = {r[0]: r for r in body}
    assert cells["b"][2].endswith("~") and not cells["c"][2].endswith("~")
    assert "±" in cells["a"][2]


def test_statuses_other_than_ok_are_shown():
    table = rows({"a": {16: [4.0]}, "b": {16: [4.5]}})
    extra = pd.DataFrame([{"variant": "b", "seed": 0, "length": 64, "mode": "nonoverlap", "status": "unsupported",
                           "ppl": float("nan"), "message": ""},
                          {"variant": "a", "seed": 0, "length": 64, "mode": "nonoverlap", "status": "ok",
                           "ppl": 4.4, "message": ""}])
    summary = aggregate(pd.concat([table, extra]), CONFIG)
    header, body = perplexity_table(summary, "nonoverlap")
    assert header == ["variant", "L=16", "L=64"]
    assert {r[0]: r[2] for r in body} == {"a": "4.400 (x1.10)", "b": "unsupported"}


# --- plots: many variants in a grid of at most four columns -------------------------------------------

def _png_size(path):
    """(width, height) in pixels, from the PNG header (IHDR)."""
    import struct

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def _capture_figures(monkeypatch):
    """The figures the plotting functions save (they close them, but the axes stay inspectable)."""
    from relbench.reporting import plots

    figures, save = [], plots.save
    monkeypatch.setattr(plots, "save", lambda fig, path: (figures.append(fig), save(fig, path))[1])
    return figures


def _check_grid(path, figure, n_panels):
    """At most four columns, ceil(n / 4) rows, one visible axes per panel, a sensible aspect."""
    rows, cols = -(-n_panels // 4), min(4, n_panels)
    visible = [ax for ax in figure.axes if ax.get_visible()]
    assert len(visible) == n_panels
    assert {ax.get_subplotspec().get_geometry()[:2] for ax in figure.axes} == {(rows, cols)}
    width, height = _png_size(path)
    # a panel is about 3.5 x 3.0 inches: the image is about cols panels wide and rows panels tall,
    # not one row of n panels (the old 16-variant attention_cost.png was 6237 x 414 px), and it fits
    # a laptop screen at 100% (the 4.2-inch panels made 1,860 px)
    assert width / height == pytest.approx((cols * 3.5) / (rows * 3.0), rel=0.3)
    assert width <= 1600
    return visible


def overlapping_texts(figure) -> list[tuple[str, str]]:
    """Pairs of visible, non-empty texts of a saved figure whose boxes intersect: titles, axis and
    figure labels, tick labels, legends' texts and annotations, as drawn."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    canvas = FigureCanvasAgg(figure)       # the figure was saved and closed: draw it again as it was saved
    canvas.draw()
    renderer = canvas.get_renderer()

    drawn_ticks = {id(label) for ax in figure.axes if ax.get_visible() for axis in (ax.xaxis, ax.yaxis)
                   for tick in axis._update_ticks() for label in (tick.label1, tick.label2)}   # ticks in view
    tick_labels = {id(label) for ax in figure.axes for axis in (ax.xaxis, ax.yaxis)
                   for tick in axis.get_major_ticks() + axis.get_minor_ticks() for label in (tick.label1, tick.label2)}
    texts = [t for t in figure.findobj(Text) if t.get_visible() and t.get_text().strip()
             and (t.axes is None or t.axes.get_visible()) and (id(t) not in tick_labels or id(t) in drawn_ticks)]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    out = []
    for i, (a, box_a) in enumerate(boxes):
        for b, box_b in boxes[i + 1:]:
            inter_w = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
            inter_h = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
            if inter_w > 1 and inter_h > 1:     # more than a pixel each way: touching is not overlapping
                out.append((a, b))
    return out


def test_overlapping_texts_finds_text_drawn_over_text():
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6, 5), layout="constrained")
    top.set_xlabel("a label under the top panel")
    bottom.set_title("a title over the bottom panel")
    assert overlapping_texts(fig) == []                  # laid out: apart
    top.annotate("text drawn on the label", xy=(0.5, 0), xycoords=top.xaxis.label, ha="center", va="bottom")
    assert [set(pair) for pair in overlapping_texts(fig)] == [{"a label under the top panel", "text drawn on the label"}]
    plt.close(fig)


def _profile_rows(n_variants):
    """profile.csv-like rows: two backends at four lengths for each variant, plus a failed row."""
    out = [{"variant": f"v{i}", "backend": backend, "length": length, "batch": 1, "heads": 4, "head_dim": 16,
            "device": "cpu", "status": "ok", "bias_ms": 0.01 * length / 64,
            "attention_ms": 0.1 * (length / 64) ** 2 * (1 + i / 10) * (2 if backend == "reference" else 1)}
           for i in range(n_variants) for backend in ("reference", "split") for length in (64, 256, 1024, 4096)]
    out.append({**out[0], "length": 1 << 20, "status": "oom", "bias_ms": float("nan"), "attention_ms": float("nan")})
    return pd.DataFrame(out)


@pytest.mark.parametrize("n_variants", [10, 16])
def test_attention_cost_panels_in_rows_of_four(tmp_path, monkeypatch, n_variants):
    from relbench.reporting.plots import attention_cost

    figures = _capture_figures(monkeypatch)
    path = attention_cost(_profile_rows(n_variants), tmp_path / "attention_cost.png")
    assert path.name == "attention_cost.png" and len(figures) == 1
    panels = _check_grid(path, figures[0], n_variants)
    assert [ax.get_title() for ax in panels] == [f"v{i}" for i in range(n_variants)]
    for ax in panels:  # time against length on the same log axes everywhere
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        assert ax.get_shared_x_axes().joined(panels[0], ax) and ax.get_shared_y_axes().joined(panels[0], ax)
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["reference", "split"]
        if ax.get_subplotspec().is_first_col():
            assert ax.get_ylabel() == "bias + attention forward (ms)"
    # the last panel of each column carries the length ticks, also above a hidden slot of the last row
    for ax in panels[-4:]:
        assert ax.xaxis.get_tick_params()["labelbottom"]


def _learned_bias_run(run_dir, variants):
    """Finished tiny two-layer checkpoints: untrained weights are enough to draw the bias curves."""
    from relbench.model import GPT, ModelConfig
    from relbench.runs import checkpoints, rundir

    for variant in variants:
        model = {"vocab_size": 256, "d_model": 32, "n_layers": 2, "n_heads": 4, "train_length": 16, "position": variant}
        checkpoints.save_checkpoint(rundir.checkpoint_dir(run_dir, variant, 0), GPT(ModelConfig(**model), seed=0),
                                    {"finished": True, "variant": variant, "seed": 0, "model": model})
    return {"seeds": [0], "variants": variants, "model": {"train_length": 16}}


def test_learned_bias_panels_in_rows_of_four(tmp_path, monkeypatch):
    from relbench.reporting.plots import learned_bias

    # xl and dynamic have a bias per layer (two panels: layer 0 and the last), the others one shared
    # bias; alibi has nothing learned and is left out: 2 + 2 + 1 + 1 + 1 + 1 + 2 = 10 panels
    variants = ["xl", "dynamic", "t5", "t5-log2", "kerple-log", "kerple-power", "alibi", "xl:position_lr_scale=2"]
    config = _learned_bias_run(tmp_path, variants)
    figures = _capture_figures(monkeypatch)
    path = learned_bias(tmp_path, config, tmp_path / "learned_bias.png")
    assert path.name == "learned_bias.png" and len(figures) == 1
    panels = _check_grid(path, figures[0], 10)
    assert panels[0].get_title() == "xl, layer 0" and panels[-1].get_title() == "xl:position_lr_scale=2, layer 1"
    for ax in panels:  # the same distances everywhere; each panel keeps its own bias scale
        assert ax.get_shared_x_axes().joined(panels[0], ax)
        assert ax is panels[0] or not ax.get_shared_y_axes().joined(panels[0], ax)
    assert figures[0].get_supxlabel().startswith("distance i - j") and "bias at distance 0" in figures[0].get_supylabel()
    assert overlapping_texts(figures[0]) == []
    assert panels[0].get_legend().get_title().get_text() == "dashed: ALiBi"
    for ax in panels[-4:]:
        assert ax.xaxis.get_tick_params()["labelbottom"]


@pytest.mark.parametrize(("low", "high", "minor"), [(5, 13, {"5", "6", "7", "8", "9"}), (12, 150, {"20", "50"}),
                                                     (0.1, 1000, set())])
def test_log_axes_minor_labels_thin_out_over_decades(low, high, minor):
    import matplotlib.pyplot as plt

    from relbench.reporting.plots import log_axes

    fig, ax = plt.subplots()
    ax.plot([16, 256], [low, high])
    log_axes(ax, [16, 256])
    fig.canvas.draw()
    shown = {t.get_text() for t in ax.get_yticklabels(minor=True)
             if t.get_text() and low <= float(t.get_text()) <= high}
    plt.close(fig)
    assert shown == minor


def test_retrieval_heatmaps_only_for_seeds_that_learned(tmp_path):
    from relbench.reporting.plots import retrieval_heatmaps
    from relbench.tasks import TASKS

    rows = pd.DataFrame([{"variant": v, "seed": 0, "length": n, "depth": d, "status": "ok", "correct": c,
                          "trials": 4} for v, c in (("alibi", 4), ("xl", 0)) for n in (128, 512) for d in (0.0, 0.5)])
    assert retrieval_heatmaps(rows, 128, tmp_path / "none.png", set(), TASKS["passkey"]) is None       # no seed learned: no plot
    assert not (tmp_path / "none.png").exists()
    path = retrieval_heatmaps(rows, 128, tmp_path / "one.png", {("alibi", 0)}, TASKS["passkey"])
    assert path == tmp_path / "one.png" and path.is_file()


def test_loss_by_position_draws_every_bin(tmp_path, monkeypatch):
    """Each line has a point per position bin (bins hold more tokens the farther they are: filtering
    on the largest count had left only the last bin)."""
    from relbench.reporting.plots import loss_by_position

    figures = _capture_figures(monkeypatch)
    edges = [0, 1, 2, 4, 8, 16, 32, 64]
    rows = pd.DataFrame([{"variant": v, "seed": 0, "length": 64, "mode": "nonoverlap", "stride": 64, "segment": 64,
                          "bin_start": a, "bin_end": b, "n_tokens": 8 * (b - a), "loss_sum": 8 * (b - a) * loss,
                          "loss": loss} for v, loss in (("alibi", 2.0), ("xl", 1.5)) for a, b in itertools.pairwise(edges)])
    loss_by_position(rows, 32, tmp_path / "lbp.png")
    lines = {line.get_label(): line for line in figures[0].axes[0].get_lines()}
    assert len(lines["alibi"].get_xdata()) == len(edges) - 1 and list(lines["xl"].get_ydata()) == [1.5] * 7


def test_a_line_that_stops_early_says_where(tmp_path, monkeypatch):
    """`learned` has no positions past its training length: its panel's title says so; the flat scheme's
    panel comes first, each titled with its own ratio at its longest length."""
    from relbench.reporting.plots import perplexity_vs_length

    figures = _capture_figures(monkeypatch)
    summary = pd.DataFrame([{"variant": v, "protocol": "nonoverlap", "status": "ok", "length": n, "ratio_mean": r,
                             "ratio_ci95": float("nan")}
                            for v, points in (("learned", [(256, 1.0)]), ("sinusoidal", [(256, 1.0), (1024, 1.5)]))
                            for n, r in points])
    perplexity_vs_length(summary, 256, tmp_path / "ppl.png")
    titles = [ax.get_title() for ax in figures[0].axes if ax.get_visible()]
    assert titles == ["learned\n×1.00 (to 256 only)", "sinusoidal\n×1.50 at 1024"]


def test_the_perplexity_figure_of_23_schemes_fits_a_screen_and_no_text_overlaps(tmp_path, monkeypatch):
    from relbench.reporting.plots import perplexity_vs_length

    figures = _capture_figures(monkeypatch)
    summary = pd.DataFrame([{"variant": f"scheme-{i}", "protocol": protocol, "status": "ok", "length": n,
                             "ratio_mean": 1 + i * 0.1 * (n / 256 - 1) / 15, "ratio_ci95": 0.05}
                            for i in range(23) for protocol in ("nonoverlap, 32,768 tokens", "sliding, stride 512")
                            for n in (256, 512, 1024, 2048, 4096)])
    path = perplexity_vs_length(summary, 256, tmp_path / "ppl.png")
    width, _height = _png_size(path)
    assert width <= 1600 and sum(ax.get_visible() for ax in figures[0].axes) == 23
    assert overlapping_texts(figures[0]) == []
