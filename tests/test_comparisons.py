"""Deciding between schemes (relbench/comparisons.py): Student's t against closed forms and tables,
the paired test and Holm's step-down against hand-computed values, the equivalence margin, the
seeds that would separate a difference, and the letter display on constructed cases."""

import math

import pytest

from relbench import comparisons as cmp


@pytest.mark.parametrize("t", [-7.0, -1.3, -0.2, 0.0, 0.4, 1.0, 2.5, 12.706])
def test_t_cdf_matches_the_closed_forms_of_one_and_two_degrees_of_freedom(t):
    assert cmp.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)     # Cauchy
    assert cmp.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)


@pytest.mark.parametrize("df,t", [(1, 12.706), (3, 3.182), (5, 2.571), (10, 2.228), (30, 2.042)])
def test_t_quantiles_match_the_statistical_table(df, t):
    assert cmp.t_cdf(t, df) == pytest.approx(0.975, abs=2e-5)
    assert cmp.t_quantile(0.975, df) == pytest.approx(t, abs=1e-3)
    assert cmp.t_quantile(0.025, df) == pytest.approx(-t, abs=1e-3)


def test_the_paired_test_by_hand():
    # differences 0.4, 0.2, 0.4: mean 1/3, sd sqrt(1/75) = 0.11547, t = 5 with 2 df,
    # p = 2 (1 - (0.5 + 5 / (2 sqrt 27))) = 0.037750
    a = {0: 0.9, 1: 0.8, 2: 0.7, 5: 0.1}
    b = {0: 0.5, 1: 0.6, 2: 0.3, 7: 0.9}          # seeds 5 and 7 are not shared: left out
    test = cmp.paired_test(a, b)
    assert test.n == 3 and test.mean == pytest.approx(1 / 3) and test.std == pytest.approx(math.sqrt(1 / 75))
    assert test.p == pytest.approx(2 * (0.5 - 5 / (2 * math.sqrt(27))), abs=1e-9)
    assert test.low == pytest.approx(1 / 3 - 4.303 * math.sqrt(1 / 75) / math.sqrt(3))
    assert cmp.paired_test({0: 1.0, 1: 0.5}, {0: 0.0, 2: 0.5}) is None           # one shared seed
    assert cmp.paired_test({0: 1.0, 1: 0.5}, {0: 0.5, 1: 0.0}).p == 0.0          # the same gap in every seed
    assert cmp.paired_test({0: 0.0, 1: 0.0}, {0: 0.0, 1: 0.0}).p == 1.0


def test_holm_steps_down_and_stops_at_the_first_failure():
    adjusted, rejected = cmp.holm({"A": 0.01, "B": 0.04, "C": 0.03})
    # 0.01 <= 0.05/3: rejected; 0.03 > 0.05/2: stop, so B (0.04 <= 0.05 alone) is kept too
    assert rejected == {"A": True, "B": False, "C": False}
    assert adjusted == pytest.approx({"A": 0.03, "C": 0.06, "B": 0.06})
    adjusted, rejected = cmp.holm({"A": 0.01, "B": 0.02, "C": 0.04})
    assert all(rejected.values())                 # Bonferroni (0.05/3 each) would reject A only
    assert adjusted == pytest.approx({"A": 0.03, "B": 0.04, "C": 0.04})


def test_a_pair_is_different_equivalent_or_not_separated():
    values = {
        "high": {0: 0.95, 1: 0.97, 2: 0.96, 3: 0.94, 4: 0.96, 5: 0.95},
        "near": {0: 0.93, 1: 0.96, 2: 0.97, 3: 0.93, 4: 0.95, 5: 0.96},   # within a point or two of high
        "low": {0: 0.10, 1: 0.12, 2: 0.08, 3: 0.11, 4: 0.09, 5: 0.10},
        "noisy": {0: 0.9, 1: 0.2, 2: 0.7, 3: 0.1, 4: 0.8, 5: 0.3},
        "one": {0: 0.5},
    }
    decided = {frozenset((c.a, c.b)): c for c in cmp.compare_all(values)}
    assert decided[frozenset(("high", "near"))].decision == cmp.EQUIVALENT
    assert decided[frozenset(("high", "low"))].decision == cmp.DIFFERENT
    assert decided[frozenset(("high", "noisy"))].decision == cmp.NOT_SEPARATED
    assert decided[frozenset(("one", "high"))].decision == cmp.UNTESTED
    # a wider margin does not make a different pair equivalent; a narrow one undoes the equivalence
    narrow = {frozenset((c.a, c.b)): c for c in cmp.compare_all(values, margin=0.01)}
    assert narrow[frozenset(("high", "near"))].decision == cmp.NOT_SEPARATED
    assert narrow[frozenset(("high", "low"))].decision == cmp.DIFFERENT
    # decided: high-near, high-low, near-low; the noisy pairs are not separated, the four of "one" untested
    assert decided[frozenset(("low", "noisy"))].decision == cmp.NOT_SEPARATED
    assert cmp.decided_fraction(list(decided.values())) == pytest.approx(3 / 10)


def test_seeds_to_separate_an_observed_difference():
    # effect 1 (mean 0.1, sd 0.1) at 5%: sqrt(6) = 2.449 < t(0.975, 5) = 2.571, sqrt(7) = 2.646 > 2.447
    test = cmp.PairedTest(3, 0.1, 0.1, 0.0, 0.0, 0.2)
    assert cmp.seeds_to_separate(test, 0.05) == 7
    assert cmp.seeds_to_separate(test, 0.05 / 10) > 7
    assert cmp.seeds_to_separate(cmp.PairedTest(3, 0.0, 0.1, 0.0, 0.0, 1.0), 0.05) is None
    assert cmp.seeds_to_separate(cmp.PairedTest(3, 0.001, 0.5, 0.0, 0.0, 1.0), 0.05, limit=50) is None


def test_letters_on_three_schemes_two_of_which_overlap():
    means = {"A": 0.9, "B": 0.6, "C": 0.3}
    assert cmp.letters(means, {frozenset(("A", "C"))}) == {"A": "a", "B": "ab", "C": "b"}
    assert cmp.letters(means, set()) == {"A": "a", "B": "a", "C": "a"}
    everything = {frozenset(p) for p in (("A", "B"), ("A", "C"), ("B", "C"))}
    assert cmp.letters(means, everything) == {"A": "a", "B": "b", "C": "c"}


def test_letters_keep_every_different_pair_apart_and_every_other_pair_together():
    means = dict(zip("ABCDE", (0.9, 0.8, 0.6, 0.4, 0.1)))
    different = {frozenset(p) for p in (("A", "D"), ("A", "E"), ("B", "E"), ("C", "E"), ("A", "C"))}
    shown = cmp.letters(means, different)
    for x in means:
        for y in means:
            if x < y:
                assert bool(set(shown[x]) & set(shown[y])) == (frozenset((x, y)) not in different), (x, y, shown)
    assert shown["A"].startswith("a")


def test_tiers_and_spread_from_values():
    values = {"A": {0: 1.0, 1: 0.9}, "B": {0: 0.1, 1: 0.0}, "C": {0: 0.5}}
    comparisons = cmp.compare_all(values)
    shown = cmp.tiers(values, comparisons)
    assert shown == {"A": "a", "B": "b"}          # C has one seed: no tier
    within, between = cmp.spread(values)
    assert within == pytest.approx(math.sqrt(0.005))   # each of A, B: deviations 0.05, 0.05 over 1 df
    assert between == pytest.approx(0.9 / math.sqrt(2))   # means 0.95 and 0.05


def test_one_scheme_against_a_panel_is_its_own_family():
    """A at 0.8-1.0 against B, C, D near 0.5 (which no test tells apart). By hand, with two degrees of
    freedom (p = 1 - |t| / sqrt(t^2 + 2)): A - B = 0.3, 0.4, 0.5 gives t = 0.4 / (0.1 / sqrt 3) = 6.928,
    p = 0.0202; A - C = 0.35, 0.40, 0.45 gives t = 13.856, p = 0.0052; A - D = 0.4 each time, p = 0.
    Over all six pairs Holm compares A - B, third smallest, with 0.05 / 4 = 0.0125: not separated. Over
    A's three pairs it meets 0.05 / 1: different."""
    values = {"A": {0: 0.8, 1: 0.9, 2: 1.0}, "B": {0: 0.5, 1: 0.5, 2: 0.5},
              "C": {0: 0.45, 1: 0.5, 2: 0.55}, "D": {0: 0.4, 1: 0.5, 2: 0.6}}
    everything = {frozenset((c.a, c.b)): c for c in cmp.compare_all(values, margin=0.0)}
    assert everything[frozenset("AB")].test.p == pytest.approx(1 - 6.928203 / math.sqrt(48 + 2), abs=1e-6)
    assert everything[frozenset("AC")].test.p == pytest.approx(1 - 13.856406 / math.sqrt(192 + 2), abs=1e-6)
    assert everything[frozenset("AB")].decision == cmp.NOT_SEPARATED
    assert everything[frozenset("AC")].decision == cmp.DIFFERENT
    mine = cmp.compare_one(values, "A", margin=0.0)
    assert [(c.a, c.b) for c in mine] == [("A", "B"), ("A", "C"), ("A", "D")]
    assert [c.decision for c in mine] == [cmp.DIFFERENT] * 3
    assert mine[0].p_adjusted == pytest.approx(everything[frozenset("AB")].test.p)   # the last step: p itself
    assert mine[1].p_adjusted == pytest.approx(2 * everything[frozenset("AC")].test.p)
