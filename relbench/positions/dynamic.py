"""Dynamic position bias: a continuous bias produced by a small MLP from the relative distance,
one output per head (the "dynamic position bias" of CrossFormer, Wang et al. 2021, and the
log-spaced continuous position bias of Swin Transformer V2, Liu et al. 2022). The distance enters
log-scaled by default, sign(d) log(1 + |d|), so that far distances are interpolated gently."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from relbench.errors import UsageError
from relbench.positions.base import RelativeBias, register


@register("dynamic")
class DynamicBias(RelativeBias):
    """MLP (1 -> width -> ... -> H, SiLU) over the (log-scaled) distance, one per layer; `depth`
    hidden layers of `width` units. The last layer starts at zero, so training starts unbiased."""

    formula = "b = MLP(sign(i-j) log(1 + |i-j|)), one output per head"
    shared_across_layers = False

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int, width: int = 32,
                 depth: int = 2, log_distance: bool = True):
        super().__init__(n_heads, head_dim, d_model, train_length)
        if width < 1 or depth < 1:
            raise UsageError(f"dynamic needs width >= 1 and depth >= 1, got width={width}, depth={depth}")
        layers: list[nn.Module] = []
        size = 1
        for _ in range(depth):
            layers += [nn.Linear(size, width), nn.SiLU()]
            size = width
        layers.append(nn.Linear(size, n_heads))
        self.mlp = nn.Sequential(*layers)
        self.log_distance = log_distance
        self.train_length = train_length

    def features(self, distance: Tensor) -> Tensor:
        d = distance.float()
        if self.log_distance:
            return torch.sign(d) * torch.log1p(d.abs())
        return d / self.train_length  # linear distances, scaled so training lengths map to [-1, 1]

    def distance_bias(self, distance: Tensor) -> Tensor:
        out = self.mlp(self.features(distance)[..., None])           # (*shape, H)
        return out.movedim(-1, 0)                                     # (H, *shape)

    def reset_parameters(self, generator: torch.Generator) -> None:
        with torch.no_grad():
            linears = [m for m in self.mlp if isinstance(m, nn.Linear)]
            for layer in linears[:-1]:
                bound = layer.in_features ** -0.5
                layer.weight.copy_((torch.rand(layer.weight.shape, generator=generator) * 2 - 1) * bound)
                layer.bias.copy_((torch.rand(layer.bias.shape, generator=generator) * 2 - 1) * bound)
            linears[-1].weight.zero_()
            linears[-1].bias.zero_()

    def extra_repr(self) -> str:
        return f"log_distance={self.log_distance}, heads={self.n_heads}"
