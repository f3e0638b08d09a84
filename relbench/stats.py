"""Statistics across seeds: mean, standard deviation, 95% intervals, and paired comparisons.

Intervals use Student's t with n - 1 degrees of freedom (two-sided 95%). Variants trained with the
same seed share the initialisation of every common parameter and see the same batches, so
comparisons between variants pair the runs by seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# two-sided 95% quantiles t_{0.975, df} (standard statistical tables)
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}
_Z975 = 1.960


def t975(df: int) -> float:
    """t_{0.975, df}; between tabulated degrees of freedom, interpolated linearly in 1/df."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df in _T975:
        return _T975[df]
    keys = sorted(_T975)
    if df > keys[-1]:
        lo, hi, t_lo, t_hi = keys[-1], math.inf, _T975[keys[-1]], _Z975
    else:
        lo = max(k for k in keys if k < df)
        hi = min(k for k in keys if k > df)
        t_lo, t_hi = _T975[lo], _T975[hi]
    weight = (1 / lo - 1 / df) / (1 / lo - (0 if hi == math.inf else 1 / hi))
    return t_lo + weight * (t_hi - t_lo)


@dataclass
class Summary:
    n: int
    mean: float
    std: float          # sample standard deviation (ddof 1); nan for one value
    half_width: float   # of the 95% interval of the mean; nan for one value

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width


def summarize(values: list[float]) -> Summary:
    values = [v for v in values if not math.isnan(v)]
    n = len(values)
    if n == 0:
        return Summary(0, math.nan, math.nan, math.nan)
    mean = sum(values) / n
    if n == 1:
        return Summary(1, mean, math.nan, math.nan)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return Summary(n, mean, std, t975(n - 1) * std / math.sqrt(n))


def wilson(successes: float, trials: int, z: float = _Z975) -> tuple[float, float]:
    """Wilson score interval (two-sided 95% by default) of a proportion `successes / trials`
    (Wilson 1927): unlike the normal approximation it stays inside [0, 1] and is not zero-width at
    0% or 100%. (nan, nan) for no trials."""
    if trials <= 0:
        return math.nan, math.nan
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)
