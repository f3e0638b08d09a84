"""FIRE: functional interpolation for relative positions (Li et al. 2023, "Functional
Interpolation for Relative Positions Improves Long Context Transformers"):

    b(i, j) = f( psi(i - j) / psi(max(L, i)) ),   psi(x) = log(c x + 1),

with f a small MLP (1 -> 32 -> H, ReLU), c and the threshold L learned. Dividing by the query's
own position maps every distance into [0, 1] whatever the length: "progressive interpolation".
The paper's initialisation: c = 0.1 and L = 512 (a learned multiplier of a fixed 512) for models
trained at length 2048, so L starts at a quarter of the training length and most training queries
lie beyond it, where the normaliser grows with the query. relbench keeps that ratio rather than
the absolute 512: at a training length of 256 a threshold of 512 would exceed every training query,
max(L, i) would be the constant L, and the interpolation the paper is about would never be
trained. `threshold_ratio` changes the ratio. Because the normaliser depends on the query position
i, the bias is not a function of i - j alone.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from relbench.errors import UsageError
from relbench.positions.base import PositionEncoding, register
from relbench.positions.plan import BiasPlan, distance_grid

INIT_C, EPS = 0.1, 1e-6
PAPER_THRESHOLD_RATIO = 512 / 2048   # the paper's initial L over its training length


class FirePlan(BiasPlan):
    def __init__(self, fire: "Fire", q_len: int, k_len: int):
        super().__init__(fire.n_heads, q_len, k_len)
        self.fire = fire

    def block(self, q_start: int, q_end: int, k_start: int, k_end: int) -> Tensor:
        fire = self.fire
        device = fire.c.device
        distance = distance_grid(q_start, q_end, k_start, k_end, device).abs().float()          # (bq, bk)
        query = torch.arange(q_start, q_end, device=device, dtype=torch.float32)[:, None]      # (bq, 1)
        normalised = fire.psi(distance) / (fire.psi(torch.maximum(query, fire.threshold())) + EPS)
        if torch.is_grad_enabled() and self.requires_grad:  # training: the MLP's backward is dense products
            return fire.mlp(normalised[..., None]).permute(2, 0, 1)                             # (H, bq, bk)
        return fire.curve(normalised)                                                           # (H, bq, bk)

    @property
    def requires_grad(self) -> bool:
        return self.fire.c.requires_grad

    def score_mod(self) -> Callable:
        fire, offset = self.fire, self.k_len - self.q_len
        w1, b1 = fire.mlp[0].weight[:, 0], fire.mlp[0].bias       # (W,), (W,)
        w2, b2 = fire.mlp[2].weight, fire.mlp[2].bias             # (H, W), (H,)
        c, threshold = fire.c, fire.threshold()

        def add_fire_bias(score, b, h, q_idx, kv_idx):
            i = (q_idx + offset).to(torch.float32)
            d = torch.abs(i - kv_idx.to(torch.float32))
            x = torch.log(torch.abs(c * d) + 1) / (torch.log(torch.abs(c * torch.maximum(i, threshold)) + 1) + EPS)
            out = b2[h]
            for unit in range(w1.shape[0]):  # the MLP, unrolled over its hidden units
                out = out + w2[h, unit] * torch.relu(w1[unit] * x + b1[unit])
            return score + out

        return add_fire_bias


@register("fire")
class Fire(PositionEncoding):
    """FIRE with the paper's MLP (1 -> `width` -> H, ReLU) and initialisation (the threshold at
    `threshold_ratio` x the training length, the paper's 512 / 2048); one per layer."""

    family = "relative bias (position-normalised)"
    formula = "b = MLP(psi(i-j) / psi(max(L, i))), psi(x) = log(c x + 1), c, L, MLP learned"
    shared_across_layers = False
    adds_bias = True
    has_score_mod = True

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int, width: int = 32,
                 threshold_ratio: float = PAPER_THRESHOLD_RATIO):
        super().__init__(n_heads, head_dim, d_model, train_length)
        if width < 1 or not threshold_ratio > 0:
            raise UsageError(f"fire needs width >= 1 and threshold_ratio > 0, got width={width}, "
                             f"threshold_ratio={threshold_ratio}")
        self.mlp = nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, n_heads))
        self.c = nn.Parameter(torch.tensor(INIT_C))
        self.L_multiplier = nn.Parameter(torch.tensor(1.0))
        self.register_buffer("init_L", torch.tensor(threshold_ratio * train_length))  # L = multiplier x this

    def psi(self, x: Tensor) -> Tensor:
        return torch.log(torch.abs(self.c * x) + 1)

    def threshold(self) -> Tensor:
        return torch.abs(self.L_multiplier * self.init_L)

    def curve(self, x: Tensor) -> Tensor:
        """The MLP f applied to every element of x: (...) -> (H, ...), exactly, but as what it is.

        f(x) = b2 + sum_u w2[:, u] relu(w1[u] x + b1[u]) of a scalar x is piecewise linear, with a
        kink where a hidden unit switches (x = -b1[u] / w1[u]). Between kinks f is slope * x +
        intercept, so each element costs a bucket search and one multiply-add per head instead of
        the (1 + H) x width products of the MLP: about 2x faster on a (512, 4096) block on CPU, and
        the chunked forward at 4096 (B=1, H=8, d=64) went from 1667 to 1304 ms. Slopes and intercepts
        are differentiable in the MLP's weights and f in x, as the MLP is, but that backward scatters
        every element's gradient into K + 1 pieces, slower than the MLP's (a quick training step took
        108 ms against 94), so plans use the curve only where no gradient is needed."""
        first, second = self.mlp[0], self.mlp[2]
        w1, b1, w2, b2 = first.weight[:, 0], first.bias, second.weight, second.bias       # (W,) (W,) (H, W) (H,)
        moving = w1 != 0
        kinks = torch.sort((-b1[moving] / w1[moving]).detach()).values                     # (K,)
        if kinks.numel():   # one point inside each of the K + 1 pieces tells which units are on there
            inside = torch.cat([kinks[:1] - 1, (kinks[1:] + kinks[:-1]) / 2, kinks[-1:] + 1])
        else:
            inside = torch.zeros(1, dtype=w1.dtype, device=w1.device)
        on = ((w1.detach() * inside[:, None] + b1.detach()) > 0).to(w1.dtype)                # (K + 1, W)
        slope = (on * w1) @ w2.t()                                                           # (K + 1, H)
        intercept = (on * b1) @ w2.t() + b2                                                  # (K + 1, H)
        piece = torch.bucketize(x.detach().to(kinks.dtype), kinks).flatten()                 # (N,) in 0..K
        shape = (w2.shape[0], *x.shape)
        return torch.addcmul(intercept.t().index_select(1, piece).view(shape),
                             slope.t().index_select(1, piece).view(shape), x.to(w1.dtype))

    def plan(self, q_len: int, k_len: int, q: Tensor | None = None) -> FirePlan:
        return FirePlan(self, q_len, k_len)

    def reset_parameters(self, generator: torch.Generator) -> None:
        with torch.no_grad():
            for layer in (self.mlp[0], self.mlp[2]):  # PyTorch's default Linear init, from our generator
                bound = layer.in_features ** -0.5
                layer.weight.copy_((torch.rand(layer.weight.shape, generator=generator) * 2 - 1) * bound)
                layer.bias.copy_((torch.rand(layer.bias.shape, generator=generator) * 2 - 1) * bound)
            self.c.fill_(INIT_C)
            self.L_multiplier.fill_(1.0)

    def extra_repr(self) -> str:
        return f"width={self.mlp[0].out_features}, initial threshold={float(self.init_L):g}, heads={self.n_heads}"
