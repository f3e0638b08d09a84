"""What a retrieval result decides (relbench/evaluation/decisions.py): only learned seeds count, the
summary number is each seed's mean over the lengths beyond training, trial noise keeps a pair of
near-zero schemes from reading "different", and the report puts the tiers first and writes every
pair to <task>_comparisons.csv."""

import json
import math

import pandas as pd
import pytest
from rich.console import Console
from test_reach import passkey_rows

from relbench import comparisons as cmp
from relbench.evaluation import decisions
from relbench.evaluation.reach import Competence, reach_of
from relbench.reporting import report
from relbench.runs import results

LENGTHS = (128, 512, 2048)


def learned(step=500):
    return Competence(True, step, step + 100)


def panel(spec):
    """Rows and competence from {variant: {seed: (acc at 512, acc at 2048) or None (not learned)}}."""
    rows, competence = [], {}
    for variant, seeds in spec.items():
        for seed, accs in seeds.items():
            if accs is None or accs[0] == "not learned":      # with rows: evaluated, though it did not learn
                competence[(variant, seed)] = Competence(False, None, 3000)
                if accs is not None:
                    rows += passkey_rows(variant, seed, dict(zip(LENGTHS, (0.5, *accs[1:]))), trials=20)
                continue
            rows += passkey_rows(variant, seed, dict(zip(LENGTHS, (1.0, *accs))), trials=20)
            competence[(variant, seed)] = learned()
    return pd.DataFrame(rows), competence


SPEC = {
    "kerple-log": {s: (1.0 - 0.05 * (s % 2), 0.9 + 0.05 * (s % 3 == 0)) for s in range(6)},
    "xl": {s: (0.1 * (s % 2), 0.0) for s in range(6)},
    "rope": dict.fromkeys(range(6), (0.0, 0.0)),
    "shaw": {0: (1.0, 1.0), 1: (0.0, 0.0), 2: ("not learned", 1.0, 1.0), 3: (0.9, 0.6), 4: (0.2, 0.0), 5: (0.7, 0.1)},
    "none": dict.fromkeys(range(3)),
}


def test_only_learned_seeds_count_and_the_summary_is_the_mean_beyond_training():
    rows, competence = panel(SPEC)
    found = reach_of(rows, "trials", {}, competence)
    decided = decisions.decide(found, "passkey", 128)
    assert decided.beyond == [512, 2048]
    top = decided.summary
    assert set(top.values) == {"kerple-log", "xl", "rope", "shaw"}                   # none: not learned, no values
    assert sorted(top.values["shaw"]) == [0, 1, 3, 4, 5]                        # seed 2 did not learn
    assert top.values["shaw"][3] == pytest.approx((0.9 + 0.6) / 2)
    assert decided.families[512].values["xl"][1] == pytest.approx(0.1)
    assert sorted(decided.families[512].values["shaw"]) == [0, 1, 3, 4, 5]
    assert len(top.comparisons) == 6


def test_trial_noise_keeps_two_schemes_near_zero_from_reading_different():
    rows, competence = panel(SPEC)
    decided = decisions.decide(decisions_input := reach_of(rows, "trials", {}, competence), "passkey", 128)
    pairs = {frozenset((c.a, c.b)): c for c in decided.families[512].comparisons}
    # xl reads 0.1, 0, 0.1, 0, 0.1, 0 at 512 (2 of 20 trials), rope 0 everywhere: the differences vary,
    # they are not separated by 6 seeds and not inside +-10 points either
    assert pairs[frozenset(("xl", "rope"))].decision == cmp.NOT_SEPARATED
    at_2048 = {frozenset((c.a, c.b)): c for c in decided.families[2048].comparisons}
    same = at_2048[frozenset(("xl", "rope"))]
    assert same.test.mean == 0 and same.decision == cmp.EQUIVALENT
    # the interval of rope - xl at 2048 is the trials' (Wilson at 0 of 20 trials), not a point
    low, high = decisions_input["rope"].interval[0][2048]
    noise = 2 * ((high - low) / (2 * decisions.Z95)) ** 2
    assert same.test.std == pytest.approx(math.sqrt(noise))
    assert pairs[frozenset(("kerple-log", "rope"))].decision == cmp.DIFFERENT


def test_a_scheme_that_cannot_run_longer_counts_zero_there():
    rows = pd.DataFrame(passkey_rows("learned", 0, {128: 1.0}) + passkey_rows("learned", 1, {128: 1.0})
                        + passkey_rows("alibi", 0, {128: 1.0, 512: 0.8}) + passkey_rows("alibi", 1, {128: 1.0, 512: 0.6}))
    rows = pd.concat([rows, pd.DataFrame([{"variant": "learned", "seed": s, "length": 512, "depth": 0.0, "trials": 10,
                                           "status": "unsupported", "correct": 0, "accuracy": math.nan,
                                           "train_length": 128} for s in (0, 1)])], ignore_index=True)
    competence = {(v, s): learned() for v in ("learned", "alibi") for s in (0, 1)}
    decided = decisions.decide(reach_of(rows, "trials", {}, competence), "passkey", 128)
    assert decided.summary.values["learned"] == {0: 0.0, 1: 0.0}


def test_the_report_puts_tiers_first_and_writes_every_pair(tmp_path):
    rows, competence = panel(SPEC)
    results.write_csv(tmp_path / "passkey.csv", rows)
    config = {"preset": "retrieval", "variants": list(SPEC), "seeds": list(range(6)),
              "model": {"train_length": 128, "d_model": 64, "n_layers": 2, "n_heads": 4},
              "train": {"task": "passkey", "steps": 3000, "batch_size": 32, "criterion_accuracy": 0.95},
              "data": {"dataset": "sotu", "tokenizer": "bytes"}}
    (tmp_path / results.CONFIG).write_text(json.dumps(config))
    curves = [{"variant": v, "seed": s, "step": step, "val_accuracy": acc, "val_loss": 1.0, "train_loss": 1.0,
               "elapsed_s": 10.0, "tokens": step * 32 * 128}
              for (v, s), c in competence.items()
              for step, acc in ([(100, 0.96), (200, 0.97)] if c.learned else [(3000, 0.5)])]
    results.write_csv(tmp_path / results.TRAIN_CSV, pd.DataFrame(curves))
    written = report.render(tmp_path, Console(file=open(tmp_path / "out.txt", "w"), width=200), plots=False)
    text = (tmp_path / "report.md").read_text()
    sections = [line for line in text.splitlines() if line.startswith("## ")]
    assert sections[0].startswith("## passkey: tiers")
    table = text.split(sections[0])[1].split("## ")[0]
    body = [line.split(" | ") for line in table.strip().splitlines()[2:]]
    assert [r[0].strip("| ") for r in body][:1] == ["kerple-log"] and body[0][1] == "a"
    assert [r[0].strip("| ") for r in body][-1] == "none" and body[-1][1] == "not learned"
    pairs = results.read_csv(written["passkey_comparisons"])
    assert len(pairs) == 3 * 6 and set(pairs["family"]) == {"beyond", "512", "2048"}
    assert (pairs["margin"] == cmp.MARGIN).all()
    assert "what the seeds decide" in text


@pytest.mark.parametrize("margin", ["0", "1.5", "-0.1"])
def test_report_refuses_a_margin_outside_zero_and_one(tmp_path, margin):
    from test_cli import assert_one_line_error, run

    assert_one_line_error(run("report", "--run-dir", tmp_path, "--margin", margin), 2, "--margin must be between 0 and 1")


def test_the_projection_counts_the_pairs_the_observed_differences_would_separate():
    def pair(decision, needed=None):
        return cmp.Comparison("a", "b", None, math.nan, decision, needed)

    family = decisions.Family("beyond", {}, [pair(cmp.DIFFERENT), pair(cmp.EQUIVALENT), pair(cmp.NOT_SEPARATED, 8),
                                             pair(cmp.NOT_SEPARATED, 13), pair(cmp.NOT_SEPARATED), pair(cmp.UNTESTED)], {})
    assert family.projected(6) == pytest.approx(2 / 6)         # decided now
    assert family.projected(8) == pytest.approx(3 / 6)         # + the pair 8 seeds separate
    assert family.projected(20) == pytest.approx(4 / 6)        # never the one no count of seeds separates
    assert math.isnan(decisions.Family("beyond", {}, [], {}).projected(10))


def test_a_scheme_is_placed_with_its_own_pairs_as_the_family():
    rows, competence = panel(SPEC)
    decided = decisions.decide(reach_of(rows, "trials", {}, competence), "passkey", 128)
    line = decisions.placement(decided, "kerple-log")
    assert "(among all 6 pairs)" in line and "against each of the 3 other schemes (Holm over these 3 pairs)" in line
    assert "different from rope (above), xl (above)" in line
    assert decisions.placement(decided, "none").startswith("none: not learned in any seed")
