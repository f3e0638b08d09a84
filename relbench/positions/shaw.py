"""Relative position representations (Shaw, Uszkoreit and Vaswani 2018, "Self-Attention with
Relative Position Representations"): a learned vector a_K per clipped relative distance that
the query meets, e_ij = q_i . (k_j + a_K[clip(j - i, k)]) / sqrt(d)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from relbench.errors import UsageError
from relbench.positions.base import PositionEncoding, register
from relbench.positions.plan import BiasPlan, distance_grid


class ShawPlan(BiasPlan):
    """The query-dependent bias q_i . a_K[clamp(j - i, -k, k) + k] / sqrt(d), held as the (B, H,
    Lq, 2k+1) products of every query with every relative vector; blocks gather from them."""

    def __init__(self, products: Tensor, k: int, q_len: int, k_len: int):
        super().__init__(products.shape[1], q_len, k_len)
        self.products = products                          # (B, H, Lq, 2k+1)
        self.k = k
        self.offset = k_len - q_len                       # position of query row 0
        self.horizon = max(1, k) if k < k_len else None   # j - i <= -k all read row 0

    def block(self, q_start: int, q_end: int, k_start: int, k_end: int) -> Tensor:
        rows = self.products[..., q_start - self.offset: q_end - self.offset, :]       # (B, H, bq, 2k+1)
        index = (-distance_grid(q_start, q_end, k_start, k_end, rows.device)).clamp(-self.k, self.k) + self.k
        return torch.gather(rows, -1, index.expand(*rows.shape[:-1], k_end - k_start))  # (B, H, bq, bk)

    def band(self, q_start: int, q_end: int, horizon: int) -> Tensor:
        """Key e of the band sits at j - i = e - (horizon - 1), the product column e + k - horizon + 1:
        a slice, nothing gathered."""
        first = self.k - horizon + 1
        return self.products[..., q_start - self.offset: q_end - self.offset, first: first + horizon]

    def tail(self, q_start: int, q_end: int) -> Tensor:
        return self.products[..., q_start - self.offset: q_end - self.offset, 0]       # (B, H, bq)

    @property
    def requires_grad(self) -> bool:
        return self.products.requires_grad

    def score_mod(self) -> Callable:
        products, k, offset = self.products, self.k, self.offset

        def add_shaw_term(score, b, h, q_idx, kv_idx):
            rel = torch.clamp(kv_idx - q_idx - offset, -k, k) + k
            return score + products[b, h, q_idx, rel]

        return add_shaw_term


@register("shaw")
class Shaw(PositionEncoding):
    """Key-side relative vectors a_K of shape (2k+1, head_dim), one set per layer, shared by the
    heads of a layer as in the paper (sec. 3.3). The paper's value-side vectors a_V are left out:
    its ablation (Table 3) found the key term carries the gain. Default clip k = 16."""

    family = "relative vector"
    formula = "e_ij += q_i . a_K[clamp(j-i, -k, k)] / sqrt(d), a_K learned (2k+1, d), k = 16"
    shared_across_layers = False
    relative = True
    adds_bias = True
    content_dependent = True
    has_horizon = True          # keys beyond the clip distance all read the edge vector
    has_score_mod = True

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int, k: int = 16):
        super().__init__(n_heads, head_dim, d_model, train_length)
        if k < 0:
            raise UsageError(f"shaw needs a clip distance k >= 0, got k={k}")
        self.k = k
        self.vectors = nn.Parameter(torch.zeros(2 * k + 1, head_dim))  # (2k+1, D): row clamp(j-i)+k

    def plan(self, q_len: int, k_len: int, q: Tensor | None = None, k: Tensor | None = None,
             x: Tensor | None = None) -> ShawPlan:
        if q is None:
            raise UsageError("shaw's bias depends on the queries: build its plan with q")
        products = torch.matmul(q, self.vectors.t().to(q.dtype)) / math.sqrt(self.head_dim)  # (B, H, Lq, 2k+1)
        return ShawPlan(products, self.k, q_len, k_len)

    def reset_parameters(self, generator: torch.Generator) -> None:
        with torch.no_grad():
            self.vectors.copy_(torch.randn(self.vectors.shape, generator=generator) * 0.02)

    def extra_repr(self) -> str:
        return f"k={self.k}, head_dim={self.head_dim}"
