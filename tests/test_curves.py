"""The answer's figure (reporting/curves.py): each learned seed's accuracy against length, panels in the
tier table's order, and a scheme's colour that is the same in every plot (reporting/style.style_of)."""

from __future__ import annotations

import math

import matplotlib.image
import numpy as np
import pandas as pd
import pytest
from test_decisions import SPEC, panel
from test_reach import passkey_rows

from relbench import positions
from relbench.evaluation import decisions
from relbench.evaluation.reach import Competence, reach_of
from relbench.reporting import curves, style


def decided_panel():
    rows, competence = panel(SPEC)
    found = reach_of(rows, "trials", {}, competence)
    return decisions.decide(found, "passkey", 128), found


def test_seed_lines_are_the_learned_seeds_accuracies_by_length():
    _decided, found = decided_panel()
    lines = curves.seed_lines(found["shaw"], [128, 512, 2048])
    assert sorted(lines) == [0, 1, 3, 4, 5]                               # seed 2 did not learn: not drawn
    assert lines[3] == pytest.approx([1.0, 0.9, 0.6])
    assert curves.seed_lines(found["none"], [128, 512]) == {}
    missing = curves.seed_lines(found["xl"], [128, 512, 8192])            # never evaluated at 8192
    assert all(math.isnan(line[2]) for line in missing.values())


def test_a_scheme_that_cannot_run_longer_is_drawn_at_zero_there():
    rows = pd.DataFrame(passkey_rows("learned", 0, {128: 1.0}) + passkey_rows("alibi", 0, {128: 1.0, 512: 0.8}))
    rows = pd.concat([rows, pd.DataFrame([{"variant": "learned", "seed": 0, "length": 512, "depth": 0.0,
                                           "trials": 10, "status": "unsupported", "correct": 0,
                                           "accuracy": math.nan, "train_length": 128}])], ignore_index=True)
    found = reach_of(rows, "trials", {}, {(v, 0): Competence(True, 500, 600) for v in ("learned", "alibi")})
    assert curves.seed_lines(found["learned"], [128, 512]) == {0: [1.0, 0.0]}


def test_the_figure_is_written_one_panel_per_scheme_and_fits_a_laptop_screen(tmp_path):
    decided, found = decided_panel()
    path = curves.draw(decided, found, tmp_path / "passkey_curves.png")
    image = matplotlib.image.imread(path)
    height, width = image.shape[:2]
    assert width <= 1600 and height < width                  # 5 schemes: one row of six panels
    assert np.std(image[..., :3]) > 0.05                      # something drawn, not a blank page


def test_no_figure_when_no_scheme_learned(tmp_path):
    rows, competence = panel({"none": dict.fromkeys(range(3))})
    found = reach_of(rows, "trials", {}, competence)
    decided = decisions.decide(found, "passkey", 128)
    assert curves.draw(decided, found, tmp_path / "x.png") is None
    assert not (tmp_path / "x.png").exists()


def test_a_scheme_keeps_its_colour_whatever_else_is_in_the_run():
    names = positions.names()
    colours = [style.style_of(name)["color"] for name in names]
    assert len(set(colours)) == len(names)                    # every registered scheme its own colour
    assert style.style_of("fox:bias_init=5")["color"] == style.style_of("fox")["color"]
    assert style.style_of("alibi@logn")["color"] == style.style_of("alibi")["color"]
    assert style.style_of("mybias")["color"] == style.style_of("mybias:k=3")["color"]   # a plugin, stable too
    assert style.style_of("rope:window=64")["color"] == style.style_of("rope+ft512")["color"] == colours[names.index("rope")]
    # a layout is its own: apart from its first layer's scheme and from another layout of the same schemes
    layouts = ["rope*1,none", "rope:window=32*1,none", "rope:chunk=128*1,none"]
    assert [style.colour_key(v) for v in layouts] == layouts
    assert style.colour_key("rope:window=32*1,none+ft512") == "rope:window=32*1,none"
    assert len({style.style_of(v)["color"] for v in layouts}) == 3
    assert style.style_of("rope:window=32*1,none")["color"] != style.style_of("rope")["color"]
    # the strong colours go to the registered schemes first: none of the 18 first is a pale tab20 shade
    pale = set(style.PALETTE[18:])
    assert not pale & set(colours[:18])


def test_a_long_spec_is_titled_on_lines_broken_after_its_commas():
    gpt_oss = "rope:base=150000,window=8,sinks=true*1,rope:base=150000,sinks=true"
    assert style.label(gpt_oss) == "rope:base=150000,window=8,\nsinks=true*1,rope:base=150000,\nsinks=true"
    assert style.label("rope:window=32*1,none") == "rope:window=32*1,none"      # short: as it is
    assert style.label("alibi") == "alibi"
    assert style.label("a" * 40 + ",b", width=10) == "a" * 40 + ",\nb"         # a long part keeps its own line
    for spec in (gpt_oss, "rope:window=32*3,rope:base=1000000", "x,y,z"):
        lines = style.label(spec, width=12).split("\n")
        assert "".join(lines) == spec                                          # nothing lost or added
        assert all(len(line) <= 12 or "," not in line[:-1] for line in lines)
