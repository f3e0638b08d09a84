"""`relbench bench --against`: a user's variant trained under a panel's protocol and seeds, placed among
the panel's schemes without retraining them; every kind of protocol mismatch refused in one line;
the shipped panels equal the committed results they come from."""

from pathlib import Path

import pandas as pd
import pytest
from test_cli import assert_one_line_error, run

from relbench.runs import panels, results

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    """A tiny retrieval run evaluated on passkey (tiny-retrieval learns nothing in its 6 steps, so its
    models are evaluated with --not-learned, as a panel of older runs would hold rows)."""
    folder = tmp_path_factory.mktemp("panel")
    assert run("train", "--preset", "tiny-retrieval", "--variants", "alibi", "xl", "--seeds", 0, 1,
               "--run-dir", folder).exit_code == 0
    done = run("extrapolate", "--run-dir", folder, "--task", "passkey", "--not-learned")
    assert done.exit_code == 0, done.output
    return folder


def test_bench_against_trains_only_the_new_variant_under_the_panels_seeds(panel, tmp_path):
    before = {name: (panel / name).read_bytes() for name in ("passkey.csv", "train.csv", "config.json")}
    out = tmp_path / "mine"
    done = run("bench", "--against", panel, "--variants", "t5", "--run-dir", out, "--jobs", "1")
    assert done.exit_code == 0, done.output
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["t5-seed0", "t5-seed1"]
    config = results.read_json(out / results.CONFIG)
    assert config["against"]["panel"] == str(panel) and config["against"]["variants"] == ["alibi", "xl"]
    assert config["variants"] == ["alibi", "xl", "t5"] and config["seeds"] == [0, 1]
    curves = results.read_csv(out / "train.csv")
    assert set(curves["variant"]) == {"alibi", "xl", "t5"}
    mine = results.read_csv(out / "passkey.csv")
    theirs = results.read_csv(panel / "passkey.csv")
    pd.testing.assert_frame_equal(mine[mine["variant"] != "t5"].reset_index(drop=True), theirs)
    assert "t5: not learned in any seed" in done.output
    assert "t5" in (out / "report.md").read_text()
    assert {name: (panel / name).read_bytes() for name in before} == before     # the panel is never written
    again = run("bench", "--against", panel, "--variants", "t5", "--run-dir", out, "--jobs", "1")
    assert again.exit_code == 0 and "already trained" in again.output


def test_against_trains_the_panels_first_seeds_and_compares_over_the_seeds_both_have(panel, tmp_path, monkeypatch):
    """A panel may hold more seeds of its own schemes than a user's scheme trains (AGAINST_SEEDS, the
    budget): here one of the panel's two; the panel's rows of both seeds stay, and t5 is counted over
    the seed it trained."""
    monkeypatch.setattr(panels, "AGAINST_SEEDS", 1)
    out = tmp_path / "one"
    done = run("bench", "--against", panel, "--variants", "t5", "--run-dir", out, "--jobs", "1")
    assert done.exit_code == 0, done.output
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["t5-seed0"]
    config = results.read_json(out / results.CONFIG)
    assert config["seeds"] == [0, 1] and config["against"]["seeds"] == [0, 1]
    curves = results.read_csv(out / "train.csv")
    assert sorted(set(curves[curves["variant"] == "t5"]["seed"])) == [0]
    assert sorted(set(curves[curves["variant"] == "alibi"]["seed"])) == [0, 1]
    assert "t5: not learned in any seed, so it has no place on the lengths beyond training" in done.output


@pytest.mark.parametrize("options,difference", [
    (["--preset", "tiny"], "model.train_length"),               # another preset
    (["--tokenizer", "bpe:300"], "data.tokenizer"),             # another tokenizer
    (["--config", "FEWER"], "eval.trials"),                     # fewer trials
    (["--position-lr-scale", "3"], "train.position_lr_scale"),  # a training option
])
def test_a_protocol_that_differs_from_the_panels_is_refused_naming_the_difference(panel, tmp_path, options, difference):
    if "FEWER" in options:
        fewer = tmp_path / "fewer.toml"
        fewer.write_text('preset = "tiny-retrieval"\n[eval]\ntrials = 2\n')
        options = [str(fewer) if o == "FEWER" else o for o in options]
    done = run("bench", "--against", panel, "--variants", "t5", "--run-dir", tmp_path / "r", *options)
    assert_one_line_error(done, 2, "the protocol differs from the panel's", difference)
    assert not (tmp_path / "r").exists()


def test_against_refuses_a_panel_scheme_an_unknown_panel_and_options_that_change_the_protocol(panel, tmp_path):
    assert_one_line_error(run("bench", "--against", panel, "--variants", "xl", "--run-dir", tmp_path / "r"), 2,
                          "xl is one of the panel's schemes already")
    assert_one_line_error(run("bench", "--against", "retrieveal", "--variants", "t5"), 2,
                          'unknown panel "retrieveal"', 'did you mean "retrieval"')
    assert_one_line_error(run("bench", "--against", panel, "--variants", "t5", "--lengths", 256), 2, "--lengths")
    assert_one_line_error(run("bench", "--against", panel, "--variants", "t5", "--track", "lm"), 2, "--track")
    assert_one_line_error(run("bench", "--against", panel, "--run-dir", tmp_path / "r"), 2, "needs --variants")
    other = tmp_path / "other"
    assert run("train", "--preset", "tiny-retrieval", "--variants", "xl", "--run-dir", other).exit_code == 0
    assert_one_line_error(run("bench", "--against", panel, "--variants", "t5", "--run-dir", other), 2,
                          "holds another run than one against the panel")


def test_shipped_panels_are_the_committed_results_byte_for_byte():
    shipped = panels.shipped()
    assert "retrieval" in shipped
    for name, folder in shipped.items():
        source = ROOT / "results" / name
        for file in panels.files_of(results.read_json(source / results.CONFIG)):
            assert (folder / file).read_bytes() == (source / file).read_bytes(), \
                f"relbench/panels/{name}/{file} differs from results/{name}: run python scripts/ship_panels.py {name}"
