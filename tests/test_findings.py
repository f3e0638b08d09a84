"""What `relbench bench` says at its end (relbench/reporting/findings.py): a fresh run's retrieval
seeds set beside the shipped panel's by a prediction interval for one more seed, computed by hand
here; the main job's default panel; a run's expected end (training/jobs.py)."""

import json
import math
import time
from pathlib import Path

import pandas as pd
import pytest

from relbench.cli.bench import MAIN_PANEL, bench_variants
from relbench.errors import UsageError
from relbench.reporting import findings
from relbench.runs import panels, results
from relbench.training.jobs import expected_end

PANEL_CONFIG = json.loads((panels.locate(findings.PANEL)[1] / "config.json").read_text())
LENGTHS = (128, 512, 2048, 8192)


def test_prediction_interval_by_hand():
    # mean 0.6, sd sqrt(0.005), n 5: t(0.975, 4) = 2.776445, half = t * sqrt(0.005 * (1 + 1/5))
    low, high = findings.prediction_interval([0.5, 0.6, 0.7, 0.6, 0.6])
    half = 2.776445 * math.sqrt(0.005 * 1.2)
    assert low == pytest.approx(0.6 - half, abs=1e-5) and high == pytest.approx(0.6 + half, abs=1e-5)
    # the new seed's own trial variance widens it: sqrt(0.006 + 0.004) = 0.1
    low, high = findings.prediction_interval([0.5, 0.6, 0.7, 0.6, 0.6], 0.004)
    assert (low, high) == pytest.approx((0.6 - 0.2776445, 0.6 + 0.2776445), abs=1e-5)
    assert findings.prediction_interval([0.1, 0.9]) == (0.0, 1.0)      # clipped to what accuracy can be
    assert findings.prediction_interval([0.5]) is None                  # one seed has no spread


def write_run(folder: Path, accuracy: dict[tuple[str, int], dict[int, float]], trials: int = 100,
              **model) -> Path:
    """A retrieval run directory: the panel's config (its protocol) with these variants and seeds, and a
    passkey.csv with one depth per length holding `accuracy` of `trials`."""
    folder.mkdir(parents=True)
    config = json.loads(json.dumps(PANEL_CONFIG))
    config["variants"] = list(dict.fromkeys(v for v, _ in accuracy))
    config["seeds"] = sorted({s for _, s in accuracy})
    config["model"].update(model)
    results.write_json(folder / "config.json", config)
    rows = [{"variant": v, "form": "", "seed": s, "train_length": 128, "length": n, "depth": 0.5, "trials": trials,
             "status": "ok", "correct": round(a * trials), "accuracy": a}
            for (v, s), by_length in accuracy.items() for n, a in by_length.items()]
    results.write_csv(folder / "passkey.csv", pd.DataFrame(rows))
    return folder


def flat(at_1x: float, beyond: float) -> dict[int, float]:
    return {128: at_1x, **dict.fromkeys(LENGTHS[1:], beyond)}


def test_a_fresh_seed_beside_the_panel(tmp_path):
    panel = write_run(tmp_path / "panel", {
        **{("alibi", s): flat(1.0, a) for s, a in enumerate([0.5, 0.6, 0.7, 0.6, 0.6])},
        **{("rope", s): flat(1.0, 0.0) for s in range(5)},
        **{("none", s): flat(0.2, 0.0) for s in range(3)}})          # never learned: 20% at 1x
    # alibi here: 90%, 60%, 36% at 4x, 16x, 64x: the summary number is their mean, 62%
    run = write_run(tmp_path / "run", {("alibi", 9): {128: 1.0, 512: 0.9, 2048: 0.6, 8192: 0.36},
                                       ("rope", 9): flat(1.0, 0.40),
                                       ("none", 9): flat(0.1, 0.0)})
    checks, decided = findings.panel_checks(run, panel)
    by = {c.variant: c for c in checks}
    assert decided.beyond == [512, 2048, 8192]
    assert by["alibi"].here == {9: pytest.approx(0.62)} and by["alibi"].verdict(9) == "within"
    # rope's panel seeds all read 0%: a fresh 40% is outside even with its 300 trials' noise
    assert by["rope"].verdict(9) == "above"
    # the trial noise of a seed at 40% (Wilson, 100 trials a length, 3 lengths) sets rope's band
    low, high = by["rope"].interval(9)
    assert low == 0.0 and 0.02 < high < 0.2
    assert by["none"].here == {} and by["none"].row()[1] == "not learned (0/1)" and by["none"].row()[-1] == "-"
    assert by["alibi"].tier and by["rope"].tier and by["alibi"].tier != by["rope"].tier   # the panel decides them
    line = findings.panel_line(checks, "retrieval")
    assert "1 of this run's 2 learned seed(s) fall within" in line and "rope (above)" in line
    tiers = line[line.index("tiers "):]
    assert tiers.index("alibi") < tiers.index("rope")        # listed by the panel's mean, highest first


def test_findings_refuse_a_run_of_another_protocol(tmp_path):
    panel = write_run(tmp_path / "panel", {("alibi", s): flat(1.0, 0.5) for s in range(2)})
    other = write_run(tmp_path / "run", {("alibi", 0): flat(1.0, 0.5)}, d_model=32)
    assert findings.comparable(other, panel) == "model.d_model: panel 64, this run 32"
    same = write_run(tmp_path / "same", {("alibi", 0): flat(1.0, 0.5)})
    assert findings.comparable(same, panel) is None


def test_the_lm_line_reads_the_ratio_at_16x(tmp_path):
    """Each scheme's number is the mean over its seeds of ppl(16x) / ppl(1x), lowest first; a scheme that
    cannot run at 16x is left out."""
    ppl = {("rope", 0): (20.0, 60.0), ("rope", 1): (22.0, 88.0), ("alibi", 0): (21.0, 21.0),
           ("alibi", 1): (20.0, 18.0), ("learned", 0): (19.0, None)}
    rows = [{"variant": v, "seed": s, "length": n, "mode": "nonoverlap", "status": "ok" if p else "unsupported",
             "ppl": p} for (v, s), pair in ppl.items() for n, p in zip((64, 1024), pair)]
    results.write_csv(tmp_path / "extrapolation.csv", pd.DataFrame(rows))
    results.write_json(tmp_path / "config.json", {"preset": "quick", "seeds": [0, 1], "model": {"train_length": 64},
                                                  "variants": ["rope", "alibi", "learned"]})
    line = findings.lm_line(tmp_path)
    # alibi: (21/21 + 18/20) / 2 = 0.95; rope: (60/20 + 88/22) / 2 = 3.5
    assert line == ("Language models (quick, 2 seed(s)): perplexity at 1024 (16x) over 64, lowest first: "
                    "alibi x0.95, rope x3.50.")


def test_the_main_job_trains_the_default_panel(tmp_path):
    assert bench_variants(None, None) == list(MAIN_PANEL)
    assert bench_variants(["all"], None) is None                  # the preset's whole list
    assert bench_variants(["xl", "t5"], None) == ["xl", "t5"]
    with pytest.raises(UsageError):
        bench_variants(["all", "xl"], None)
    (tmp_path / "e.toml").write_text('variants = ["alibi"]\n')
    assert bench_variants(None, tmp_path / "e.toml") is None      # the file's list
    # every scheme of the default panel is in the shipped panel, where it learned in every seed
    _, folder = panels.locate(findings.PANEL)
    trained = json.loads((folder / "config.json").read_text())["variants"]
    assert set(MAIN_PANEL) <= set(trained)


def test_expected_end():
    now = time.mktime((2026, 12, 6, 14, 0, 0, 0, 0, -1))
    # 100 of 1,000 steps in 50 s: 450 s more, at 14:07:30
    assert expected_end(100, 1000, 50.0, False, now) == "; ends about 14:07 (8 min more)"
    assert expected_end(100, 5000, 50.0, True, now).startswith("; ends by 14:40 at the latest (its 5,000-step cap")
    assert expected_end(0, 1000, 0.0, False, now) == "" and expected_end(1000, 1000, 9.0, False, now) == ""
