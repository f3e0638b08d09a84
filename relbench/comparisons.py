"""Deciding between schemes over seeds: paired t-tests, Holm's step-down, equivalence, tiers.

DESIGN.md, "Decide, do not sort": two schemes measured on the same seeds (the same initialisation of
every shared parameter, the same batches) are compared by the differences of their per-seed values.
A pair is *different* when its paired t-test (two-sided) survives Holm's correction over every pair
of the family (Holm 1979, "A simple sequentially rejective multiple test procedure"); *equivalent*
when the 95% interval of the mean difference lies inside +-margin; otherwise *not separated*, with
the number of seeds at which the observed difference, with its observed spread, would pass the
test. Tiers are a compact letter display (Piepho 2004, "An algorithm for a letter-based
representation of all-pairwise comparisons", insert-and-absorb): schemes that share a letter are
not shown different.

Student's t distribution is computed here (no SciPy): its CDF through the regularized incomplete
beta function, evaluated by the continued fraction of Numerical Recipes (Press et al., 3rd ed.,
section 6.4) with the modified Lentz method.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

from relbench.stats import summarize, t975

ALPHA = 0.05          # family-wise error rate of the "different" decisions, per family (one length, one task)
MARGIN = 0.10         # equivalence margin on the accuracy scale (10 points)
DIFFERENT, EQUIVALENT, NOT_SEPARATED, UNTESTED = "different", "equivalent", "not separated", "untested"


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < eps:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if not 0 <= x <= 1:
        raise ValueError(f"x must be in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1 - front * _beta_fraction(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (bisection on t_cdf, to 1e-10)."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p}")
    low, high = -1.0, 1.0
    while t_cdf(low, df) > p:
        low *= 2
    while t_cdf(high, df) < p:
        high *= 2
    while high - low > 1e-10 * max(1.0, abs(high)):
        middle = (low + high) / 2
        low, high = (middle, high) if t_cdf(middle, df) < p else (low, middle)
    return (low + high) / 2


@dataclass(frozen=True)
class PairedTest:
    """A paired comparison of a and b over the seeds both have: mean and sd of a - b, its 95%
    interval, the two-sided p-value of the paired t-test."""
    n: int
    mean: float
    std: float
    low: float
    high: float
    p: float


def paired_test(a: dict[int, float], b: dict[int, float], noise: dict[int, float] | None = None) -> PairedTest | None:
    """a - b paired by seed; None when fewer than two seeds are shared.

    `noise`: per seed, the variance with which a - b is measured (the trials behind each value). The
    spread of the differences over seeds contains it, so the sd used is never below its mean's square
    root: where every seed reads 1 trial in 70 against 0, the differences agree to the last digit and
    their sample sd is 0, yet the trials cannot tell 1% from 0%. Without noise, identical differences
    give p = 1 when they are 0 and p = 0 otherwise."""
    common = sorted(s for s in set(a) & set(b) if not (math.isnan(a[s]) or math.isnan(b[s])))
    if len(common) < 2:
        return None
    summary = summarize([a[s] - b[s] for s in common])
    floor = math.sqrt(sum((noise or {}).get(s, 0.0) for s in common) / len(common))
    std = max(summary.std, floor)
    if std == 0:
        return PairedTest(summary.n, summary.mean, 0.0, summary.mean, summary.mean, 1.0 if summary.mean == 0 else 0.0)
    half = summary.half_width * std / summary.std if summary.std > 0 else t975(summary.n - 1) * std / math.sqrt(summary.n)
    t = summary.mean / (std / math.sqrt(summary.n))
    p = min(1.0, 2 * t_cdf(-abs(t), summary.n - 1))
    return PairedTest(summary.n, summary.mean, std, summary.mean - half, summary.mean + half, p)


def unresolved(a: dict[int, float], b: dict[int, float]) -> bool | None:
    """Whether seeds cannot tell a from b: the 95% interval of the mean paired difference (paired_test,
    no trial noise, no correction for other pairs) contains 0. None when fewer than two seeds are shared."""
    test = paired_test(a, b)
    return None if test is None else test.low <= 0 <= test.high


def holm(p_values: dict, alpha: float = ALPHA) -> tuple[dict, dict]:
    """Holm's step-down over a family: (adjusted p-values, rejected) by key. The i-th smallest of m
    is compared with alpha / (m - i + 1); the first that fails stops the rejections. The adjusted
    value is max over j <= i of min(1, (m - j + 1) p_(j))."""
    order = sorted(p_values, key=lambda key: p_values[key])
    m = len(order)
    adjusted, rejected, running, stopped = {}, {}, 0.0, False
    for i, key in enumerate(order):
        running = max(running, min(1.0, (m - i) * p_values[key]))
        adjusted[key] = running
        stopped = stopped or p_values[key] > alpha / (m - i)
        rejected[key] = not stopped
    return adjusted, rejected


def seeds_to_separate(test: PairedTest, alpha: float, limit: int = 1000) -> int | None:
    """The fewest seeds at which a mean difference and spread as observed would pass a two-sided
    paired t-test at `alpha` (the level a pair must meet: ALPHA over the family's size, Bonferroni,
    the strictest step of Holm's); None when the observed difference is 0 or more than `limit` are
    needed."""
    if test.mean == 0:
        return None
    if test.std == 0:
        return 2
    effect = abs(test.mean) / test.std

    def separates(n: int) -> bool:   # monotone in n: sqrt(n) grows, the t quantile falls with its degrees of freedom
        return effect * math.sqrt(n) >= t_quantile(1 - alpha / 2, n - 1)

    if not separates(limit):
        return None
    low, high = 2, limit             # the fewest n that separates lies in [low, high]
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if separates(middle) else (middle + 1, high)
    return low


@dataclass(frozen=True)
class Comparison:
    """The decision on one pair of schemes in a family."""
    a: str
    b: str
    test: PairedTest | None
    p_adjusted: float
    decision: str            # DIFFERENT, EQUIVALENT, NOT_SEPARATED or UNTESTED (fewer than 2 shared seeds)
    seeds_needed: int | None  # not separated: the seeds that would separate the observed difference

    @property
    def decided(self) -> bool:
        return self.decision in (DIFFERENT, EQUIVALENT)


def compare_all(values: dict[str, dict[int, float]], margin: float = MARGIN, alpha: float = ALPHA,
                noise: dict[str, dict[int, float]] | None = None) -> list[Comparison]:
    """Every pair of schemes in `values` (scheme -> seed -> value), decided as one family: Holm over
    the pairs that can be tested (two shared seeds or more); a pair that cannot is untested. `noise`:
    scheme -> seed -> the variance with which that value was measured (paired_test)."""
    return decide_family(list(combinations(values, 2)), values, margin, alpha, noise)


def compare_one(values: dict[str, dict[int, float]], subject: str, margin: float = MARGIN, alpha: float = ALPHA,
                noise: dict[str, dict[int, float]] | None = None) -> list[Comparison]:
    """`subject` against every other scheme of `values`, those pairs alone one family (Holm over them): the
    question of someone who brings one scheme to a panel makes as many claims as the panel has schemes,
    not as many as the panel has pairs, whose own pairs its report has decided already."""
    return decide_family([(subject, other) for other in values if other != subject], values, margin, alpha, noise)


def decide_family(pairs: list[tuple[str, str]], values: dict[str, dict[int, float]], margin: float, alpha: float,
                  noise: dict[str, dict[int, float]] | None) -> list[Comparison]:
    """Decide `pairs` as one family: paired tests, Holm's step-down over the testable ones, the equivalence
    margin for the rest, and for a pair not separated the seeds that would separate it at the family's
    strictest level."""
    noise = noise or {}

    def joint(a: str, b: str) -> dict[int, float]:
        return {s: noise.get(a, {}).get(s, 0.0) + noise.get(b, {}).get(s, 0.0) for s in values[a]}

    tests = {(a, b): paired_test(values[a], values[b], joint(a, b)) for a, b in pairs}
    testable = {pair: test.p for pair, test in tests.items() if test is not None}
    adjusted, rejected = holm(testable, alpha)
    out = []
    for (a, b), test in tests.items():
        if test is None:
            out.append(Comparison(a, b, None, math.nan, UNTESTED, None))
            continue
        if rejected[(a, b)]:
            decision = DIFFERENT
        elif -margin <= test.low and test.high <= margin:
            decision = EQUIVALENT
        else:
            decision = NOT_SEPARATED
        needed = seeds_to_separate(test, alpha / max(1, len(testable))) if decision == NOT_SEPARATED else None
        out.append(Comparison(a, b, test, adjusted[(a, b)], decision, needed))
    return out


def decided_fraction(comparisons: list[Comparison]) -> float:
    """The share of pairs decided (different or equivalent); nan for no pair."""
    return sum(c.decided for c in comparisons) / len(comparisons) if comparisons else math.nan


def letters(means: dict[str, float], different: set[frozenset[str]]) -> dict[str, str]:
    """A compact letter display (insert and absorb, Piepho 2004): schemes that share a letter are not
    in `different` (pairs shown different); every different pair shares none. Letters go in the order
    the groups are met reading the schemes by mean, highest first: "a" holds the highest."""
    names = list(means)
    groups: list[set[str]] = [set(names)] if names else []
    for pair in different:
        i, j = tuple(pair)
        split = []
        for group in groups:
            if i in group and j in group:
                split += [group - {i}, group - {j}]
            else:
                split.append(group)
        groups = [g for k, g in enumerate(split)               # absorb: drop a group inside another
                  if g and not any(k != m and (g < h or (g == h and m < k)) for m, h in enumerate(split))]
    rank = {n: i for i, n in enumerate(sorted(names, key=lambda n: (-means[n], names.index(n))))}
    groups.sort(key=lambda g: sorted(rank[n] for n in g))   # read down the table by mean: letters in order
    alphabet = "abcdefghijklmnopqrstuvwxyz"
    out = dict.fromkeys(names, "")
    for k, group in enumerate(groups):
        letter = alphabet[k] if k < len(alphabet) else f"[{k}]"
        for n in group:
            out[n] += letter
    return out


def tiers(values: dict[str, dict[int, float]], comparisons: list[Comparison]) -> dict[str, str]:
    """The letters of the schemes in `values` with two seeds or more, from their comparisons."""
    tested = {n: v for n, v in values.items() if len([x for x in v.values() if not math.isnan(x)]) >= 2}
    means = {n: summarize(list(v.values())).mean for n, v in tested.items()}
    different = {frozenset((c.a, c.b)) for c in comparisons
                 if c.decision == DIFFERENT and c.a in tested and c.b in tested}
    return letters(means, different)


def spread(values: dict[str, dict[int, float]]) -> tuple[float, float]:
    """(within, between): the pooled standard deviation over seeds inside each scheme, and the
    standard deviation of the schemes' means, over the schemes with two seeds or more."""
    groups = [[x for x in v.values() if not math.isnan(x)] for v in values.values()]
    groups = [g for g in groups if len(g) >= 2]
    if len(groups) < 2:
        return math.nan, math.nan
    within = sum(sum((x - sum(g) / len(g)) ** 2 for x in g) for g in groups) / sum(len(g) - 1 for g in groups)
    return math.sqrt(within), summarize([sum(g) / len(g) for g in groups]).std

