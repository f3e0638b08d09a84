"""KERPLE: kernelized relative positional embedding (Chi, Fan, Ramadge and Rudnicky 2022, "KERPLE:
Kernelized Relative Positional Embedding for Length Extrapolation"): biases from conditionally
positive definite kernels of the distance, with two positive parameters learned per head.

Trained as the official code trains them (chijames/KERPLE, megatron/mpu/layers.py): one kernel
module shared by every layer; uniform initialisations; and the constraints enforced on the stored
values, which are clamped in place (p, a >= 0.01, the power's exponent <= 2) so that a step that
pushes a parameter past its bound leaves it on the bound (projected gradient descent)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from relbench.positions.base import RelativeBias, register

EPS = 1e-2  # the official code keeps every parameter at least this far from zero


class _Kerple(RelativeBias):
    shared_across_layers = True   # the official code builds one kernel module and hands it to every layer
    r1_init_high = 2.0            # r1 ~ U(0, r1_init_high), r2 ~ U(0, r2_init_high)
    r2_init_high = 1.0
    r2_max: float | None = None   # upper bound of r2, if any

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int):
        super().__init__(n_heads, head_dim, d_model, train_length)
        self.r1 = nn.Parameter(torch.ones(n_heads))   # (H,) scale, > 0
        self.r2 = nn.Parameter(torch.ones(n_heads))   # (H,) shape, > 0

    def reset_parameters(self, generator: torch.Generator) -> None:
        with torch.no_grad():
            self.r1.copy_(self.r1_init_high * torch.rand(self.r1.shape, generator=generator))
            self.r2.copy_(self.r2_init_high * torch.rand(self.r2.shape, generator=generator))
        self.project_parameters()

    @torch.no_grad()
    def project_parameters(self) -> None:
        self.r1.clamp_(min=EPS)
        self.r2.clamp_(min=EPS, max=self.r2_max)

    @staticmethod
    def _per_head(values: Tensor, distance: Tensor) -> Tensor:
        return values.view((-1,) + (1,) * distance.dim())


@register("kerple-log")
class KerpleLog(_Kerple):
    """bias = -r1 * log(1 + r2 * |i - j|), with r1, r2 > 0 learned per head: KERPLE's logarithmic
    variant, the stronger of the two in the paper. Official initialisation: r1 ~ U(0, 2) (its p),
    r2 ~ U(0, 1) (its a)."""

    formula = "b = -r1_h * log(1 + r2_h * |i-j|), r1, r2 > 0 learned per head"

    def distance_bias(self, distance: Tensor) -> Tensor:
        d = distance.abs().float()
        return -self._per_head(self.r1, d) * torch.log1p(self._per_head(self.r2, d) * d)      # (H, *shape)


@register("kerple-power")
class KerplePower(_Kerple):
    """bias = -r1 * |i - j| ** r2, with r1 > 0 and 0 < r2 <= 2 learned per head: KERPLE's power
    variant. Official initialisation: the scale r1 ~ U(0, 1) (its a), the exponent r2 ~ U(0, 2)
    (its p)."""

    formula = "b = -r1_h * |i-j|^r2_h, r1 > 0, 0 < r2 <= 2 learned per head"
    r1_init_high = 1.0
    r2_init_high = 2.0
    r2_max = 2.0

    def distance_bias(self, distance: Tensor) -> Tensor:
        d = distance.abs().float()
        return -self._per_head(self.r1, d) * d.pow(self._per_head(self.r2, d))               # (H, *shape)
