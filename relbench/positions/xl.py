"""The seed design: a learned, clipped relative-distance bias table (a Transformer-XL-style
simplification in which the position term is a learned scalar per distance instead of
q . W_R . R_(i-j); Dai et al. 2019, Shaw et al. 2018)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from relbench.errors import UsageError
from relbench.positions.base import RelativeBias, register


def clipped_index(distance: Tensor, k: int) -> Tensor:
    """Row of the (2k+1)-row table for distance i - j: clamp(i - j, -k, k) + k."""
    return distance.clamp(-k, k) + k


@register("xl")
class ClippedTable(RelativeBias):
    """bias[h, i, j] = table[clamp(i - j, -k, k) + k, h]; a table of shape (2k+1, H) per layer.

    Distances beyond k share the edge row, so any length works. `shared_heads=true` keeps one
    scalar per distance for all heads (table (2k+1, 1)). Initialised from a normal distribution
    with std 0.02 truncated at two standard deviations."""

    formula = "b = T[clamp(i-j, -k, k) + k, h], T learned (2k+1, H), k = 128"
    shared_across_layers = False

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int,
                 k: int = 128, shared_heads: bool = False):
        super().__init__(n_heads, head_dim, d_model, train_length)
        if k < 0:
            raise UsageError(f"xl needs a clip distance k >= 0, got k={k}")
        self.k = k
        self.shared_heads = shared_heads
        self.table = nn.Parameter(torch.zeros(2 * k + 1, 1 if shared_heads else n_heads))  # (2k+1, H or 1)

    def distance_bias(self, distance: Tensor) -> Tensor:
        values = self.table[clipped_index(distance, self.k)]          # (*shape, H or 1)
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
        return f"k={self.k}, heads={1 if self.shared_heads else self.n_heads}"
