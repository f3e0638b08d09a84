"""Reach: computed only over the seeds that learned at the training length, with Wilson intervals
and the per-seed values; a variant with no learned seed is "not learned (0/n)", never reach none."""

import pandas as pd
import pytest

from relbench.evaluation.reach import Competence, accuracy_by_length, competence_note, reach_of, reach_table, steps_to_learn
from relbench.stats import wilson

DEPTHS = (0.0, 0.5, 1.0)


def passkey_rows(variant, seed, accuracy_by_len, trials=10):
    """passkey.csv rows: per length, the same correct count at every depth (accuracy * trials)."""
    return [{"variant": variant, "seed": seed, "length": n, "depth": d, "trials": trials, "status": "ok",
             "correct": round(a * trials), "accuracy": round(a * trials) / trials, "train_length": 128}
            for n, a in accuracy_by_len.items() for d in DEPTHS]


def learned(step):
    return Competence(True, step, step + 100)


NOT = Competence(False, None, 3000)


def test_wilson_matches_hand_computed_values():
    # p = 0.9, n = 50, z = 1.96: centre (0.9 + 0.0384) / 1.0768, half 1.96 * sqrt(0.0018 + 0.0000384) / 1.0768
    low, high = wilson(45, 50)
    assert low == pytest.approx(0.78640, abs=1e-4) and high == pytest.approx(0.95652, abs=1e-4)
    assert wilson(50, 50)[1] == 1.0 and wilson(0, 50)[0] == 0.0
    assert wilson(0, 50)[1] == pytest.approx(0.07135, abs=1e-4)
    # 50 trials leave the 90% cell 11 points wide below; 70 (14 per depth) keep it within 10
    assert 0.9 - low > 0.1
    low, high = wilson(63, 70)
    assert max(0.9 - low, high - 0.9) <= 0.1


def test_reach_comes_only_from_learned_seeds():
    rows = pd.DataFrame(passkey_rows("xl", 0, {128: 1.0, 512: 0.9, 2048: 0.5})
                        + passkey_rows("xl", 1, {128: 0.1, 512: 0.0, 2048: 0.0})    # did not learn
                        + passkey_rows("xl", 2, {128: 1.0, 512: 1.0, 2048: 0.8}))
    competence = {("xl", 0): learned(700), ("xl", 1): NOT, ("xl", 2): learned(900)}
    reach = reach_of(rows, "trials", {}, competence)["xl"]
    assert reach.learned_seeds == [0, 2]
    assert reach.accuracy[512] == pytest.approx(0.95) and reach.accuracy[2048] == pytest.approx(0.65)
    assert reach.reach == 512 and reach.seed_reach(0) == 512 and reach.seed_reach(2) == 512
    assert reach.cell() == "512 (2/3; per seed 512, 512)"
    assert steps_to_learn(reach) == "800 (700-900)"
    header, body = reach_table({"xl": reach}, "passkey")
    assert header[:3] == ["variant", "learned", "L=128"] and body[0][1] == "2/3"
    assert body[0][3] == "95% (90%/100%)"            # L=512: the mean, then seed 0 and seed 2
    assert "`xl` seed 1" in competence_note({"xl": reach})


def test_a_variant_with_no_learned_seed_is_not_learned_not_reach_none():
    rows = pd.DataFrame(passkey_rows("t5", 0, {128: 0.2, 512: 0.0}) + passkey_rows("t5", 1, {128: 0.6, 512: 0.0}))
    reach = reach_of(rows, "trials", {}, {("t5", 0): NOT, ("t5", 1): NOT})["t5"]
    assert reach.reach is None and not reach.competent
    assert reach.cell() == "not learned (0/2)"
    assert reach_table({"t5": reach}, "passkey")[1][0][2:4] == ["-", "-"]


def test_without_a_criterion_the_accuracy_at_the_training_length_decides():
    rows = pd.DataFrame(passkey_rows("alibi", 0, {128: 0.94, 512: 0.92}) + passkey_rows("alibi", 1, {128: 0.8, 512: 0.9}))
    lengths = {("alibi", 0): 128, ("alibi", 1): 128}
    reach = reach_of(rows, "trials", lengths, {("alibi", 0): None, ("alibi", 1): None})["alibi"]
    assert reach.learned_seeds == [0] and reach.learned[1].source == "accuracy at 1x"
    assert reach.reach == 512 and steps_to_learn(reach) == "-"


def test_one_learned_seed_shows_the_wilson_interval_of_its_pooled_trials():
    rows = pd.DataFrame(passkey_rows("xl", 0, {128: 1.0, 512: 0.9}) + passkey_rows("xl", 1, {128: 0.1, 512: 0.0}))
    reach = reach_of(rows, "trials", {}, {("xl", 0): learned(700), ("xl", 1): NOT})["xl"]
    low, high = wilson(27, 30)                       # 512: 9 of 10 at each of three depths, seed 0 only
    assert reach.interval[0][512] == pytest.approx((low, high))
    assert reach_table({"xl": reach}, "passkey")[1][0][3] == f"90% [{low:.0%}-{high:.0%}]" == "90% [74%-97%]"


def test_reach_is_the_longest_length_at_90_percent_and_none_below():
    rows = pd.DataFrame(passkey_rows("rope", 0, {128: 0.9, 512: 0.8, 2048: 0.0}))
    assert reach_of(rows, "trials", {}, {("rope", 0): learned(500)})["rope"].reach == 128
    rows = pd.DataFrame(passkey_rows("rope", 0, {128: 0.8, 512: 0.0}))
    weak = reach_of(rows, "trials", {}, {("rope", 0): learned(500)})["rope"]   # learned in training, 80% here
    assert weak.reach is None and weak.cell() == "< 128"


def test_a_reach_at_the_longest_length_evaluated_for_it_says_so():
    rows = pd.DataFrame(passkey_rows("alibi", 0, {128: 1.0, 512: 0.95}) + passkey_rows("rope", 0, {128: 1.0, 512: 0.0,
                                                                                                  2048: 0.0}))
    found = reach_of(rows, "trials", {}, {("alibi", 0): learned(800), ("rope", 0): learned(900)})
    assert found["alibi"].cell() == ">= 512 (longer not evaluated)" and found["rope"].cell() == "128"


def test_accuracy_pools_every_trial_with_its_interval():
    rows = pd.DataFrame([{"variant": "a", "seed": 0, "length": 64, "depth": d, "trials": 10, "status": "ok",
                          "correct": c, "accuracy": c / 10} for d, c in ((0.0, 10), (0.5, 5), (1.0, 0))]
                        + [{"variant": "a", "seed": 0, "length": 256, "depth": 0.0, "trials": 10, "status": "oom",
                            "correct": float("nan"), "accuracy": float("nan")}])
    pooled = accuracy_by_length(rows, "trials")
    assert pooled["length"].tolist() == [64]             # a skipped length has no accuracy
    r = pooled.iloc[0]
    assert (r.correct, r.n, r.accuracy) == (15, 30, 0.5)
    assert (r.low, r.high) == pytest.approx(wilson(15, 30))


def test_seeds_that_did_not_learn_count_without_rows():
    """extrapolate does not evaluate a seed trained to criterion that did not learn: it has no rows,
    yet it is one of the variant's seeds (2/3, not 2/2), and a variant with no learned seed at all
    is still in the table."""
    rows = pd.DataFrame(passkey_rows("xl", 0, {128: 1.0, 512: 0.9}) + passkey_rows("xl", 2, {128: 1.0, 512: 0.9}))
    competence = {("xl", 0): learned(700), ("xl", 1): NOT, ("xl", 2): learned(900), ("fire", 0): NOT,
                  ("t5", 0): None}   # t5: no criterion and no rows: nothing to say about it
    reaches = reach_of(rows, "trials", {}, competence)
    assert reaches["xl"].seeds == [0, 1, 2] and reaches["xl"].cell() == "512 (2/3; per seed 512, 512)"
    assert reaches["fire"].cell() == "not learned (0/1)" and "t5" not in reaches
    assert reach_of(rows.iloc[:0], "trials", {}, {("fire", 0): NOT})["fire"].cell() == "not learned (0/1)"


def test_a_model_that_did_not_learn_its_task_is_not_evaluated_on_it():
    from relbench.evaluation.evaluators import not_learned

    meta = {"train": {"task": "passkey", "criterion_accuracy": 0.95},
            "summary": {"learned": False, "val_accuracy": 0.94, "steps": 5000}}
    assert not_learned(meta, "passkey") == ("passkey not learned at its training length (94% at its last check, "
                                           "5000-step cap): not evaluated")
    assert not_learned(meta, "mqar") is None                                  # not the task it trained on
    assert not_learned({**meta, "summary": {"learned": True}}, "passkey") is None
    assert not_learned({**meta, "train": {"task": "passkey", "criterion_accuracy": 0.0}}, "passkey") is None
    assert not_learned({}, "passkey") is None                                 # no meta: evaluate


def test_a_scheme_that_cannot_run_longer_says_so_not_that_longer_was_not_evaluated():
    rows = pd.DataFrame(passkey_rows("learned", 0, {128: 1.0}) + passkey_rows("alibi", 0, {128: 1.0, 512: 0.95})
                        + [{**r, "status": "unsupported", "correct": 0, "accuracy": 0.0}
                           for r in passkey_rows("learned", 0, {512: 0.0})])
    reaches = reach_of(rows, "trials", {}, {("learned", 0): learned(1300), ("alibi", 0): learned(900)})
    assert reaches["learned"].cell() == "128 (cannot run longer)" and reaches["alibi"].cell() == "512"
