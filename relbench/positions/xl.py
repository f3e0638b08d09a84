"""The seed design: a learned, clipped relative-distance bias table (a Transformer-XL-style
simplification in which the position term is a learned scalar per distance instead of
q . W_R . R_(i-j); Dai et al. 2019, Shaw et al. 2018)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from relbench.errors import UsageError
from relbench.positions.base import RelativeBias, register, table_rows


def clipped_index(distance: Tensor, k: int) -> Tensor:
    """Row of the (2k+1)-row table for distance i - j: clamp(i - j, -k, k) + k."""
    return distance.clamp(-k, k) + k


def log_clipped_index(distance: Tensor, k: int, log_from: int, log_buckets: int) -> Tensor:
    """Row for distance i - j when distances of `log_from` and more are log-scaled: |d| < log_from
    has its own row; log_from <= |d| < k falls in one of `log_buckets` log-spaced rows; |d| >= k in
    the edge row. Rows per direction: log_from + log_buckets + 1; the sign picks the direction."""
    magnitude = distance.abs()
    scaled = torch.log(magnitude.clamp(min=log_from).double() / log_from) / math.log(k / log_from)
    far = log_from + (scaled * log_buckets).long().clamp(max=log_buckets - 1)
    row = torch.where(magnitude < log_from, magnitude, far)
    row = torch.where(magnitude >= k, torch.full_like(row, log_from + log_buckets), row)
    half = log_from + log_buckets
    return half + torch.sign(distance) * row


@register("xl")
class ClippedTable(RelativeBias):
    """bias[h, i, j] = table[clamp(i - j, -k, k) + k, h]; a table of shape (2k+1, H) per layer.

    Distances beyond k share the edge row, so any length works. `shared_heads=true` keeps one
    scalar per distance for all heads (table (2k+1, 1)). `log_from=c` (0: off) log-scales the
    distances from c to k into `log_buckets` rows, as the seed suggests for very long sequences:
    the table then has 2(c + log_buckets) + 1 rows instead of 2k + 1. Initialised from a normal
    distribution with std 0.02 truncated at two standard deviations."""

    formula = "b = T[clamp(i-j, -k, k) + k, h], T learned (2k+1, H), k = 128"
    shared_across_layers = False
    has_horizon = True

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int,
                 k: int = 128, shared_heads: bool = False, log_from: int = 0, log_buckets: int = 16):
        super().__init__(n_heads, head_dim, d_model, train_length)
        if k < 0:
            raise UsageError(f"xl needs a clip distance k >= 0, got k={k}")
        if log_from and not (0 < log_from < k and log_buckets >= 1):
            raise UsageError(f"xl's log_from must lie between 0 and k={k} with log_buckets >= 1; "
                             f"got log_from={log_from}, log_buckets={log_buckets}")
        self.k = k
        self.shared_heads = shared_heads
        self.log_from, self.log_buckets = log_from, log_buckets
        rows = 2 * (log_from + log_buckets) + 1 if log_from else 2 * k + 1
        self.table = nn.Parameter(torch.zeros(rows, 1 if shared_heads else n_heads))  # (rows, H or 1)

    def index(self, distance: Tensor) -> Tensor:
        if self.log_from:
            return log_clipped_index(distance, self.k, self.log_from, self.log_buckets)
        return clipped_index(distance, self.k)

    def distance_bias(self, distance: Tensor) -> Tensor:
        values = table_rows(self.table, self.index(distance))          # (*shape, H or 1)
        values = values.movedim(-1, 0)                                # (H or 1, *shape)
        return values.expand(self.n_heads, *distance.shape)          # (H, *shape)

    def horizon(self) -> int:
        return self.k  # every distance >= k reads the edge row 2k

    def reset_parameters(self, generator: torch.Generator) -> None:
        std = 0.02
        with torch.no_grad():
            values = torch.randn(self.table.shape, generator=generator) * std
            while (outside := values.abs() > 2 * std).any():  # truncated normal by resampling
                values[outside] = torch.randn(int(outside.sum()), generator=generator) * std
            self.table.copy_(values)

    def extra_repr(self) -> str:
        log = f", log_from={self.log_from}, log_buckets={self.log_buckets}" if self.log_from else ""
        return f"k={self.k}, heads={1 if self.shared_heads else self.n_heads}{log}"
