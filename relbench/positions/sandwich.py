"""Sandwich (Chi, Fan, Rudnicky and Ramadge 2023, "Dissecting Transformer Length Extrapolation
via the Lens of Receptive Field Analysis"): the bias is the inner product of the sinusoidal
position embeddings of the query and the key, which depends on i - j alone,

    p_i . p_j = sum_k cos((i - j) w_k),   w_k = 10000^(-2k / d),  k = 1 .. d/2,

shifted so that it is 0 at distance 0 and divided per head by the ALiBi-like compression ratio
8h / H (h = 1 .. H), so that heads see different effective ranges. No learned parameters."""

from __future__ import annotations

import torch
from torch import Tensor

from relbench.errors import UsageError
from relbench.positions.base import RelativeBias, register


def sandwich_bias(distance: Tensor, n_heads: int, dim: int = 128) -> Tensor:
    """(H, *distance.shape): (sum_k cos(d w_k) - d_bar/2) / (8h/H) for the d_bar = `dim` sinusoid."""
    frequencies = 10000.0 ** (-2.0 * torch.arange(1, dim // 2 + 1, dtype=torch.float64) / dim)  # (dim/2,)
    angles = distance.double()[..., None] * frequencies.to(distance.device)                   # (*shape, dim/2)
    inner = torch.cos(angles).sum(-1) - dim / 2                                                # (*shape,) 0 at d=0
    ratio = 8.0 * torch.arange(1, n_heads + 1, dtype=torch.float64, device=distance.device) / n_heads  # (H,)
    return (inner[None] / ratio.view((-1,) + (1,) * distance.dim())).float()


@register("sandwich")
class Sandwich(RelativeBias):
    """Parameter-free bias from the inner product of sinusoidal embeddings (d_bar = `dim`, 128 by
    default, as in the paper), compressed per head by 8h/H."""

    formula = "b = (sum_k cos((i-j) 10000^(-2k/d)) - d/2) / (8h/H), d = 128"
    shared_across_layers = True

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int, dim: int = 128):
        super().__init__(n_heads, head_dim, d_model, train_length)
        if dim < 2 or dim % 2:
            raise UsageError(f"sandwich needs an even sinusoid dimension dim >= 2, got {dim}")
        self.dim = dim
        self.register_buffer("_anchor", torch.zeros(0), persistent=False)  # gives the scheme a device

    def distance_bias(self, distance: Tensor) -> Tensor:
        return sandwich_bias(distance, self.n_heads, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.n_heads}"
