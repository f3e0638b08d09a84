"""Seed aggregation and the markers of unresolved differences, on hand-made rows."""

import math

import pandas as pd
import pytest

from relbench.report import aggregate, perplexity_table

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
    header, body = perplexity_table(summary.reset_index(), "nonoverlap")
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
    assert dict((r[0], r[2]) for r in body) == {"a": "4.400 (x1.10)", "b": "unsupported"}
