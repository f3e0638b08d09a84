"""Transformer-XL relative attention, faithfully (Dai et al. 2019, "Transformer-XL: Attentive
Language Models Beyond a Fixed-Length Context", sec. 3.3). The logit of query i and key j is

    (a) q_i . k_j  +  (b) q_i . W_R R_(i-j)  +  (c) u . k_j  +  (d) v . W_R R_(i-j)

with R the sinusoidal encoding of the distance (not learned), W_R a learned projection per layer,
and u, v learned vectors per head (one pair per layer, the official code's default "untied"
setting). Terms (a) and (c) are computed together as (q_i + u) . k_j, terms (b) and (d) as
(q_i + v) . W_R R_(i-j). relbench's `xl` keeps only a learned scalar per clipped distance
instead of (b) and (d), and has no (c).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from relbench.errors import UsageError
from relbench.positions.absolute import sinusoid_table
from relbench.positions.base import PositionEncoding, register
from relbench.positions.plan import BiasPlan, distance_grid


class TransformerXLPlan(BiasPlan):
    """(q_i + v) . W_R R_(i-j) / sqrt(d): the position terms, computed block by block from the
    queries and the projected encodings of the distances the block needs."""

    def __init__(self, query: Tensor, projected: Tensor, q_len: int, k_len: int):
        super().__init__(query.shape[1], q_len, k_len)
        self.query = query            # (B, H, Lq, D): q + v
        self.projected = projected    # (H, k_len, D): W_R R_d for d = 0 .. k_len - 1
        self.offset = k_len - q_len
        self._reversed: Tensor | None = None   # the encodings in reverse distance order, for causal_block

    def block(self, q_start: int, q_end: int, k_start: int, k_end: int) -> Tensor:
        distance = distance_grid(q_start, q_end, k_start, k_end, self.query.device).clamp(min=0)  # future keys: masked
        low, high = max(0, q_start - (k_end - 1)), max(0, q_end - 1 - k_start)                  # its min and max
        rows = self.query[..., q_start - self.offset: q_end - self.offset, :]                    # (B, H, bq, D)
        scores = rows @ self.projected[:, low: high + 1].transpose(-2, -1)                        # (B, H, bq, span)
        index = (distance - low).expand(*scores.shape[:-1], distance.shape[-1])
        return torch.gather(scores, -1, index) / math.sqrt(rows.shape[-1])                       # (B, H, bq, bk)

    def causal_block(self, q_start: int, q_end: int, k_end: int) -> Tensor:
        """Without gradients, Transformer-XL's "relative shift": one product of the block's queries
        with the encodings of distances q_end-1 .. 0 (in that order) gives R[a, x] = the term at
        distance q_end-1-x; query q_start+a against key j reads x = (q_end-1-q_start) - a + j, so the
        mask is R viewed with strides (row - 1, 1), no gather. Columns past the last distance are
        -inf: they are exactly the future keys."""
        if torch.is_grad_enabled() and self.requires_grad:
            return super().causal_block(q_start, q_end, k_end)
        rows = self.query[..., q_start - self.offset: q_end - self.offset, :] / math.sqrt(self.query.shape[-1])
        pad = max(1, k_end - q_start)
        if self._reversed is None or self._reversed.shape[1] < self.k_len + pad:   # distances k_len-1 .. 0, zeros
            self._reversed = torch.cat([self.projected.flip(1), self.projected.new_zeros(
                self.projected.shape[0], max(pad, 1024), self.projected.shape[2])], dim=1)
        operand = self._reversed[:, self.k_len - q_end: self.k_len + pad]               # distances q_end-1 .. 0, pad
        padded = rows @ operand.transpose(-2, -1)                                          # (B, H, bq, q_end + pad)
        padded[..., q_end:] = float("-inf")
        width = padded.shape[-1]
        return padded.as_strided((*padded.shape[:-2], q_end - q_start, k_end),
                                 (*padded.stride()[:-2], width - 1, 1), padded.storage_offset() + q_end - 1 - q_start)

    @property
    def requires_grad(self) -> bool:
        return self.query.requires_grad or self.projected.requires_grad


@register("transformer-xl")
class TransformerXL(PositionEncoding):
    """The full Transformer-XL relative position terms (no segment recurrence: one window)."""

    family = "relative vector"
    formula = "e_ij = (q_i+u).k_j + (q_i+v).W_R R(i-j), R sinusoidal, W_R, u, v learned"
    shared_across_layers = False
    relative = True
    adds_bias = True
    rotates = True              # adds u to the queries of the content term
    content_dependent = True

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int):
        super().__init__(n_heads, head_dim, d_model, train_length)
        if d_model % 2:
            raise UsageError(f"transformer-xl's sinusoidal encoding needs an even d_model, got {d_model}")
        self.W_R = nn.Linear(d_model, n_heads * head_dim, bias=False)
        self.u = nn.Parameter(torch.zeros(n_heads, head_dim))
        self.v = nn.Parameter(torch.zeros(n_heads, head_dim))

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return q + self.u[:, None, :].to(q.dtype), k      # (a) + (c): (q + u) . k

    def plan(self, q_len: int, k_len: int, q: Tensor | None = None, k: Tensor | None = None,
             x: Tensor | None = None) -> TransformerXLPlan:
        """(b) + (d) from the projected queries q (before `rotate` adds u, as for every scheme)."""
        if q is None:
            raise UsageError("transformer-xl's position terms depend on the queries: build its plan with q")
        encodings = sinusoid_table(k_len, self.d_model, device=q.device).to(self.W_R.weight.dtype)   # (Lk, d_model)
        projected = self.W_R(encodings).view(k_len, self.n_heads, self.head_dim).transpose(0, 1)    # (H, Lk, D)
        query = q + self.v[:, None, :].to(q.dtype)                                                 # q + v
        return TransformerXLPlan(query, projected.to(q.dtype), q_len, k_len)

    def reset_parameters(self, generator: torch.Generator) -> None:
        with torch.no_grad():
            self.W_R.weight.copy_(torch.randn(self.W_R.weight.shape, generator=generator) * 0.02)
            self.u.zero_()
            self.v.zero_()

    def extra_repr(self) -> str:
        return f"heads={self.n_heads}, head_dim={self.head_dim}"
