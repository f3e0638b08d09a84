"""KERPLE: kernelized relative positional embedding (Chi, Fan, Ramadge and Rudnicky 2022, "KERPLE:
Kernelized Relative Positional Embedding for Length Extrapolation"): biases from conditionally
positive definite kernels of the distance, with two positive parameters learned per head."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from relbench.positions.base import RelativeBias, register

EPS = 1e-2  # the paper's implementation keeps both parameters at least this far from zero


def kept_in(value: Tensor, low: float, high: float | None = None) -> Tensor:
    """`value` clamped to [low, high] in the forward pass, with the gradient of the identity: the
    projected-gradient behaviour of the paper's code, which clamps the parameters after each step."""
    return value + (value.clamp(min=low, max=high) - value).detach()


class _Kerple(RelativeBias):
    shared_across_layers = False
    r2_init_high = 1.0

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int):
        super().__init__(n_heads, head_dim, d_model, train_length)
        self.r1 = nn.Parameter(torch.ones(n_heads))   # (H,) scale, > 0
        self.r2 = nn.Parameter(torch.ones(n_heads))   # (H,) shape, > 0

    def reset_parameters(self, generator: torch.Generator) -> None:
        # the paper's initialisation: r1 ~ U(0, 2), r2 ~ U(0, 1) (log) or U(0, 2) (power)
        with torch.no_grad():
            self.r1.copy_(2.0 * torch.rand(self.r1.shape, generator=generator))
            self.r2.copy_(self.r2_init_high * torch.rand(self.r2.shape, generator=generator))

    @staticmethod
    def _per_head(values: Tensor, distance: Tensor) -> Tensor:
        return values.view((-1,) + (1,) * distance.dim())


@register("kerple-log")
class KerpleLog(_Kerple):
    """bias = -r1 * log(1 + r2 * |i - j|), with r1, r2 > 0 learned per head and layer: KERPLE's
    logarithmic variant, the stronger of the two in the paper."""

    formula = "b = -r1_h * log(1 + r2_h * |i-j|), r1, r2 > 0 learned per head"

    def distance_bias(self, distance: Tensor) -> Tensor:
        r1, r2 = kept_in(self.r1, EPS), kept_in(self.r2, EPS)
        d = distance.abs().float()
        return -self._per_head(r1, d) * torch.log1p(self._per_head(r2, d) * d)      # (H, *shape)


@register("kerple-power")
class KerplePower(_Kerple):
    """bias = -r1 * |i - j| ** r2, with r1 > 0 and 0 < r2 <= 2 learned per head and layer:
    KERPLE's power variant."""

    formula = "b = -r1_h * |i-j|^r2_h, r1 > 0, 0 < r2 <= 2 learned per head"
    r2_init_high = 2.0

    def distance_bias(self, distance: Tensor) -> Tensor:
        r1, r2 = kept_in(self.r1, EPS), kept_in(self.r2, EPS, 2.0)
        d = distance.abs().float()
        return -self._per_head(r1, d) * d.pow(self._per_head(r2, d))               # (H, *shape)
