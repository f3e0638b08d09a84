"""ALiBi: attention with linear biases (Press et al. 2022, "Train Short, Test Long: Attention with
Linear Biases Enables Input Length Extrapolation"): a fixed penalty proportional to distance,
with a different slope per head and no learned parameters."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from relbench.positions.base import RelativeBias, register


def _power_of_two_slopes(n: int) -> list[float]:
    start = 2.0 ** (-8.0 / n)                 # geometric sequence from 2^(-8/n) with that ratio
    return [start ** (i + 1) for i in range(n)]


def slopes(n_heads: int) -> Tensor:
    """(H,) head slopes of Press et al. 2022, sec. 3: for H a power of two, the geometric sequence
    2^(-8/H), 2^(-16/H), ..., 2^(-8). Otherwise the slopes of the largest power of two below H,
    followed by every other slope of twice that power, up to H heads."""
    if n_heads < 1:
        raise ValueError(f"n_heads must be positive, got {n_heads}")
    power = 2 ** math.floor(math.log2(n_heads))
    values = _power_of_two_slopes(power)
    if power < n_heads:
        values += _power_of_two_slopes(2 * power)[0::2][: n_heads - power]
    return torch.tensor(values, dtype=torch.float32)


@register("alibi")
class ALiBi(RelativeBias):
    """bias[h, i, j] = -m_h * |i - j| with the paper's fixed slopes m_h; no parameters."""

    formula = "b = -m_h * |i - j|, m_h = 2^(-8h/H)"
    shared_across_layers = True
    linear = True
    separable = True

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int):
        super().__init__(n_heads, head_dim, d_model, train_length)
        self.register_buffer("slopes", slopes(n_heads), persistent=False)  # (H,)

    def distance_bias(self, distance: Tensor) -> Tensor:
        return -self.slopes.view(-1, *([1] * distance.dim())) * distance.abs().float()  # (H, *shape)

    def linear_slopes(self) -> Tensor:
        return self.slopes
