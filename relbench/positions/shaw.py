"""Relative position representations (Shaw, Uszkoreit and Vaswani 2018, "Self-Attention with
Relative Position Representations"): a learned vector a_K per clipped relative distance that
the query meets, e_ij = q_i . (k_j + a_K[clip(j - i, k)]) / sqrt(d)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from relbench.errors import UsageError
from relbench.positions.base import PositionEncoding, register


@register("shaw")
class Shaw(PositionEncoding):
    """Key-side relative vectors a_K of shape (2k+1, head_dim), one set per layer, shared by the
    heads of a layer as in the paper (sec. 3.3). The paper's value-side vectors a_V are left out:
    its ablation (Table 3) found the key term carries the gain. Default clip k = 16."""

    family = "relative vector"
    formula = "e_ij += q_i . a_K[clamp(j-i, -k, k)] / sqrt(d), a_K learned (2k+1, d), k = 16"
    shared_across_layers = False
    relative = True

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int, k: int = 16):
        super().__init__(n_heads, head_dim, d_model, train_length)
        if k < 0:
            raise UsageError(f"shaw needs a clip distance k >= 0, got k={k}")
        self.k = k
        self.vectors = nn.Parameter(torch.zeros(2 * k + 1, head_dim))  # (2k+1, D): row clamp(j-i)+k

    def query_bias(self, q: Tensor, k_len: int) -> Tensor:
        q_len = q.shape[-2]
        qa = torch.matmul(q, self.vectors.t().to(q.dtype)) / math.sqrt(self.head_dim)  # (B, H, Lq, 2k+1)
        query_pos = self.query_positions(q_len, k_len, q.device)
        offset = torch.arange(k_len, device=q.device)[None, :] - query_pos[:, None]   # (Lq, Lk): j - i
        index = (offset.clamp(-self.k, self.k) + self.k).expand(*qa.shape[:-1], k_len)
        return torch.gather(qa, -1, index)  # (B, H, Lq, Lk)

    def reset_parameters(self, generator: torch.Generator) -> None:
        with torch.no_grad():
            self.vectors.copy_(torch.randn(self.vectors.shape, generator=generator) * 0.02)

    def extra_repr(self) -> str:
        return f"k={self.k}, head_dim={self.head_dim}"
