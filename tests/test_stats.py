"""Seed statistics on known inputs."""

import math

import pytest

from relbench.comparisons import unresolved
from relbench.stats import summarize, t975


def test_t_quantiles_match_tables():
    assert t975(1) == 12.706 and t975(2) == 4.303 and t975(10) == 2.228
    assert 2.060 > t975(27) > 2.042        # between the tabulated 25 and 30
    assert t975(10_000) == pytest.approx(1.96, abs=0.002)


def test_summary_of_known_values():
    s = summarize([1.0, 2.0, 3.0])
    assert (s.n, s.mean, s.std) == (3, 2.0, 1.0)
    assert s.half_width == pytest.approx(4.303 / math.sqrt(3))
    assert (s.low, s.high) == pytest.approx((2 - 2.4843, 2 + 2.4843), abs=1e-4)
    one = summarize([5.0])
    assert one.mean == 5.0 and math.isnan(one.std) and math.isnan(one.half_width)
    assert summarize([float("nan"), 4.0, 6.0]).mean == 5.0


def test_paired_comparison():
    # b is consistently 1.0 worse: the paired differences have no spread, clearly resolved
    assert unresolved({0: 3.0, 1: 4.0, 2: 5.0}, {0: 4.0, 1: 5.0, 2: 6.0}) is False
    # differences -1, +1, 0: the interval contains 0
    assert unresolved({0: 3.0, 1: 5.0, 2: 4.0}, {0: 4.0, 1: 4.0, 2: 4.0}) is True
    assert unresolved({0: 3.0}, {0: 4.0}) is None          # one shared seed: cannot tell
