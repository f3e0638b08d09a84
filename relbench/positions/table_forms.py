"""Evaluation forms of the seed's clipped bias table (`xl`): its tips for long sequences, applied to
a table trained with clip k, without retraining.

Trained, distance d >= 0 reads row clamp(d, 0, k) of the table (per direction): every distance from
k on shares the edge row. The forms read the same learned rows for longer distances:

- logidx: log-scaled distance indices. Distances below c keep their own row; distances c .. R (R,
  the reach, defaults to L - 1, the longest distance of the sequence) are spread logarithmically
  over the rows c .. k:  row(d) = c + round((k - c) ln(d / c) / ln(R / c)), so row(c) = c and
  row(R) = k. A model trained with clip k thus sees distances up to R with the rows it learned
  (the seed's log-scaled buckets, xl's training option log_from, moved to evaluation). When R <= k
  every distance already has its own row and the form is the identity.
- extend: linear extrapolation of the table beyond the last trained distance e = min(k, L_train - 1):
  per head, the least-squares line through the last `fit` rows T[e - fit + 1 .. e] against their
  distances gives a slope a, and b(d) = T[e] + a (d - e) for d > e; distances up to e read the
  table as trained.

Future keys (d < 0) are masked in a causal model and read the table as trained. Both forms need a
plain clipped table (not one trained with log_from).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from relbench.errors import UsageError
from relbench.positions.base import PositionEncoding
from relbench.positions.forms import Form, register_form, replaced
from relbench.positions.xl import ClippedTable, clipped_index


class _TableForm(Form):
    applies_to = ClippedTable

    def check(self, enc: PositionEncoding) -> None:
        if enc.log_from:
            raise UsageError(f'evaluation form "{self.name}" reads a plain clipped table; this xl was trained '
                             f"with log_from={enc.log_from}")

    def rows(self, enc: ClippedTable, index: Tensor, shape: torch.Size) -> Tensor:
        """(H, *shape) values of the table at rows `index` (as ClippedTable.distance_bias)."""
        return enc.table[index].movedim(-1, 0).expand(enc.n_heads, *shape)


def log_index(distance: Tensor, k: int, log_from: int, reach: int) -> Tensor:
    """Row of the (2k+1)-row table for distance d when c = log_from <= |d| <= reach are spread
    logarithmically over rows c .. k (sign keeps the direction); see the module doc."""
    magnitude = distance.abs()
    if reach <= k:
        return clipped_index(distance, k)
    spread = torch.log(magnitude.clamp(min=log_from).double() / log_from) / math.log(reach / log_from)
    far = (log_from + torch.round((k - log_from) * spread).long()).clamp(max=k)
    row = torch.where(magnitude < log_from, magnitude, far)
    return torch.sign(distance) * row + k


@register_form("logidx")
class LogIndex(_TableForm):
    """Log-scaled distance indices into the trained table (module doc). `log_from` c (0: k // 2,
    at least 1); `reach` R (0: L - 1, the longest distance evaluated)."""

    formula = "row(d) = c + round((k-c) ln(d/c) / ln(R/c)) for d >= c, R = L-1; rows below c as trained"

    def __init__(self, log_from: int = 0, reach: int = 0):
        if log_from < 0 or reach < 0:
            raise UsageError(f'log_from and reach of form "logidx" must be positive (0: the default); got '
                             f"log_from={log_from}, reach={reach}")
        self.log_from, self.reach = log_from, reach

    def start(self, enc: ClippedTable) -> int:
        c = self.log_from or max(1, enc.k // 2)
        if not 1 <= c < enc.k:
            raise UsageError(f'log_from={c} of form "logidx" must lie between 1 and the clip k={enc.k} (excluded)')
        return c

    def check(self, enc: PositionEncoding) -> None:
        super().check(enc)
        self.start(enc)

    def pinned(self, enc: PositionEncoding, length: int) -> Form:
        return self if self.reach else replaced(self, reach=length - 1)

    def distance_bias(self, enc: PositionEncoding, distance: Tensor, length: int) -> Tensor:
        reach = self.reach or length - 1
        return self.rows(enc, log_index(distance, enc.k, self.start(enc), reach), distance.shape)

    def horizon(self, enc: PositionEncoding, length: int) -> int | None:
        reach = self.reach or length - 1
        return enc.horizon() if reach <= enc.k else reach   # from R on, every distance reads row k


def table_slope(values: Tensor, last: int, fit: int) -> Tensor:
    """(H,) least-squares slope of rows last - fit + 1 .. last of `values` (rows, H) against their
    row numbers."""
    rows = values[last - fit + 1: last + 1].double()                   # (fit, H)
    x = torch.arange(fit, dtype=torch.float64, device=values.device)
    x = x - x.mean()
    return (x[:, None] * (rows - rows.mean(0))).sum(0) / (x * x).sum()


@register_form("extend")
class ExtendTable(_TableForm):
    """The table extended linearly beyond its last trained distance (module doc); `fit` rows (at
    least 2) give the slope."""

    formula = "b(d) = T[e] + a (d - e) for d > e = min(k, L_train - 1), a the slope of the last fit rows"

    def __init__(self, fit: int = 8):
        if fit < 2:
            raise UsageError(f'fit={fit} of form "extend" must be at least 2 (a slope needs two rows)')
        self.fit = fit

    def last(self, enc: ClippedTable) -> int:
        return min(enc.k, enc.train_length - 1)

    def check(self, enc: PositionEncoding) -> None:
        super().check(enc)
        if self.last(enc) + 1 < self.fit:
            raise UsageError(f'form "extend" fits its slope on fit={self.fit} rows; this xl trained only '
                             f"{self.last(enc) + 1} (k={enc.k}, training length {enc.train_length})")

    def distance_bias(self, enc: PositionEncoding, distance: Tensor, length: int) -> Tensor:
        e = self.last(enc)
        trained = self.rows(enc, clipped_index(distance.clamp(max=e), enc.k), distance.shape)   # (H, *shape)
        edge = enc.table[e + enc.k]                                                             # row of distance e
        slope = table_slope(enc.table[enc.k:], e, self.fit).to(enc.table.dtype)                 # (H or 1,)
        beyond = (distance - e).clamp(min=0).to(enc.table.dtype)
        line = (edge[:, None] + slope[:, None] * beyond.reshape(1, -1)).reshape(-1, *distance.shape)
        return torch.where(distance > e, line.expand_as(trained), trained)

    def horizon(self, enc: PositionEncoding, length: int) -> int | None:
        return None      # the bias keeps changing with distance
