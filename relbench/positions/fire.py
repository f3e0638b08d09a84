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

import itertools
from collections.abc import Callable

import torch
from torch import Tensor, nn

from relbench.errors import UsageError
from relbench.positions.base import PositionEncoding, register
from relbench.positions.plan import BiasPlan, DensePlan, distance_grid

INIT_C, EPS = 0.1, 1e-6
FIRE_ROWS = 64   # query rows per group of the inference bias (a ramp's bounds span about this many keys)
PAPER_THRESHOLD_RATIO = 512 / 2048   # the paper's initial L over its training length


class FirePlan(BiasPlan):
    # inductor failed to lower the score_mod's backward on a GPU (an unnamed scalar gradient buffer;
    # its forward ran: docs/scaling.md, "On a GPU"), so auto trains FIRE on the chunked path on CUDA
    flex_trains = False

    def __init__(self, fire: Fire, q_len: int, k_len: int):
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

    def causal_block(self, q_start: int, q_end: int, k_end: int) -> Tensor:
        """Without gradients, the bias written segment by segment of keys instead of element by
        element. f = const + slope x + sum_k g_k relu(x - t_k) (Fire.ramps), and x = psi(i - j) /
        N_i rises as the key j moves back from the query, so ramp k is on exactly for keys
        j < J_k(i) = i - (exp(t_k N_i) - 1) / c. For a few query rows, J_k spans at most a few more
        keys than there are rows (its slope in i is between 0 and 1): to its left the ramp is a line,
        to its right zero. Between consecutive such bounds the bias is one line a + b x per head,
        written with one multiply-add over a tile shared by the heads; only keys within a ramp's
        bounds (widened by 2 against rounding) evaluate that ramp. The normalised distances come
        from one O(L) vector of psi read as a strided (Hankel) view over reversed keys."""
        if torch.is_grad_enabled() and self.requires_grad:
            return super().causal_block(q_start, q_end, k_end)
        fire, rows, heads = self.fire, q_end - q_start, self.n_heads
        device = fire.c.device
        # psi(|m - (k_end - 1)|) for m = 0 .. q_end + k_end - 2: row a, reversed key j' reads m = q_start + a + j'
        psi = fire.psi((torch.arange(q_end + k_end - 1, device=device) - (k_end - 1)).abs().float())
        hankel = psi.as_strided((rows, k_end), (1, 1), q_start)
        query = torch.arange(q_start, q_end, device=device, dtype=torch.float64)
        normaliser = fire.psi(torch.maximum(query.float(), fire.threshold())) + EPS                # (bq,): N_i
        x = torch.div(hankel, normaliser[:, None]).flip(-1)                                       # (bq, keys)
        const, slope, t, g = (r.detach() for r in fire.ramps(0.0, 1.0))   # x lies in [0, 1) up to the query
        bound = query[None] - torch.expm1(t.double()[:, None] * normaliser.double()[None]) / fire.c.double().abs()
        out = x.new_empty(heads, rows, k_end)
        thresholds, gains = t.tolist(), [g[:, k].view(heads, 1, 1) for k in range(t.shape[0])]
        for a0 in range(0, rows, FIRE_ROWS):
            a1 = min(rows, a0 + FIRE_ROWS)
            keys = q_start + a1                                       # keys past the last row's query: all future
            lo = (bound[:, a0:a1].amin(1).floor() - 2).clamp(0, keys).long().tolist()
            hi = (bound[:, a0:a1].amax(1).ceil() + 2).clamp(0, keys).long().tolist()
            cuts = sorted({0, keys, *lo, *hi})
            ends = torch.tensor(cuts[1:], dtype=torch.float64, device=device)
            on = (ends[:, None] <= torch.tensor(lo, dtype=torch.float64, device=device)[None]).to(g.dtype)  # (S, K)
            a = (const[None] - on @ (g * t).t()).view(-1, heads, 1, 1)                          # (S, H, 1, 1)
            b = (slope[None] + on @ g.t()).view(-1, heads, 1, 1)
            for s, (c0, c1) in enumerate(itertools.pairwise(cuts)):
                tile, target = x[a0:a1, c0:c1], out[:, a0:a1, c0:c1]
                target.copy_(a[s].expand_as(target)).addcmul_(b[s], tile)   # (out-of-place addcmul is 4x slower)
                for k, threshold in enumerate(thresholds):
                    if lo[k] <= c0 and c1 <= hi[k]:
                        target.addcmul_(gains[k], (tile - threshold).clamp_min_(0))
            out[:, a0:a1, keys:] = float("-inf")
            future = distance_grid(q_start + a0, keys, q_start + a0, keys, device) < 0
            out[:, a0:a1, q_start + a0: keys].masked_fill_(future, float("-inf"))
        return out

    @property
    def requires_grad(self) -> bool:
        return self.fire.c.requires_grad

    def score_mod(self) -> Callable:
        """f as its ramps on [0, 1) (Fire.ramps): const + slope x + sum_k g_k relu(x - t_k) over the kinks that
        can fall inside [0, 1), fewer terms than the MLP's hidden units. FlexAttention cannot
        differentiate a captured tensor indexed more than once, and on a GPU its backward did not
        lower with 0-d captured tensors that need a gradient: every coefficient, c and the
        threshold included, is its own (H,) tensor, indexed once by the head."""
        fire, offset, heads = self.fire, self.k_len - self.q_len, self.n_heads
        const, slope, t, g = fire.ramps(0.0, 1.0)                 # x lies in [0, 1)
        per_head = lambda scalar: scalar.expand(heads).clone()
        terms = [(per_head(t[k]), g[:, k].clone()) for k in range(t.shape[0])]
        c_h, threshold_h = per_head(fire.c), per_head(fire.threshold())

        def add_fire_bias(score, b, h, q_idx, kv_idx):
            c, threshold = c_h[h], threshold_h[h]
            i = (q_idx + offset).to(torch.float32)
            d = torch.abs(i - kv_idx.to(torch.float32))
            x = torch.log(torch.abs(c * d) + 1) / (torch.log(torch.abs(c * torch.maximum(i, threshold)) + 1) + EPS)
            out = const[h] + slope[h] * x
            for t, g in terms:
                out = out + g[h] * torch.relu(x - t[h])
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
    takes_positions = True

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

        Each hidden unit of f(x) = b2 + sum_u w2[:, u] relu(w1[u] x + b1[u]) is a ramp with its kink
        at t_u = -b1[u] / w1[u]: relu(w1 x + b1) = |w1| relu(x - t), plus |w1| (t - x) where w1 < 0,
        and the constant relu(b1) where w1 = 0. So f(x) = a + b x + sum_u g_u relu(x - t_u), and over
        the range of x a ramp whose kink lies below it is a line (folded into a and b) and one whose
        kink lies above it is zero: only the kinks inside the range cost anything. What is left is
        one matrix product, (H, 1 + K) coefficients by (1 + K, N) features [x, relu(x - t_k)] with
        the K kinks inside, in place of the MLP's (1 + H) x width products per element and its
        (N, H) -> (H, N) transpose. Differentiable in x and in the MLP's weights, as the MLP is;
        plans use it where no gradient is needed (the MLP's backward is faster)."""
        w1 = self.mlp[0].weight
        x = x.to(w1.dtype)
        flat = x.reshape(1, -1)                                                            # (1, N)
        low, high = flat.detach().aminmax() if flat.numel() else (0.0, 0.0)
        const, slope, t, g = self.ramps(low, high)                                         # (H,) (H,) (K,) (H, K)
        if torch.is_grad_enabled() and (flat.requires_grad or w1.requires_grad):
            features = torch.cat([torch.ones_like(flat), flat, (flat - t[:, None]).clamp_min(0)])
        else:   # the same, written in place: no concatenation of (K, N) pieces
            features = flat.new_empty(2 + t.shape[0], flat.shape[1])                       # [1, x, ramps]: (2 + K, N)
            features[0] = 1
            features[1] = flat[0]
            torch.sub(flat, t[:, None], out=features[2:]).clamp_min_(0)
        coefficients = torch.cat([const[:, None], slope[:, None], g], dim=1)               # (H, 2 + K)
        return (coefficients @ features).view(g.shape[0], *x.shape)

    def ramps(self, low, high) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """f(x) = const + slope x + sum_k g[:, k] relu(x - t[k]) exactly for x in [low, high]: the
        ramps of the units that move (w1 != 0) whose kink lies inside (low, high), (H,), (H,), (K,),
        (H, K); one with its kink at or below `low` is a line there, folded into const and slope,
        and one at or above `high` is zero. See `curve`."""
        first, second = self.mlp[0], self.mlp[2]
        w1, b1, w2, b2 = first.weight[:, 0], first.bias, second.weight, second.bias       # (W,) (W,) (H, W) (H,)
        moving = (w1 != 0).detach()
        falling = (w1 < 0).to(w1.dtype)
        kinks = -b1 / torch.where(moving, w1, torch.ones_like(w1))                         # (W,)
        gain = w2 * w1.abs()                                                               # (H, W): g_u
        # the constants of units that never move and the lines of falling units
        const = b2 + (w2 * torch.where(moving, falling * w1.abs() * kinks, torch.relu(b1))).sum(-1)   # (H,)
        slope = -(gain * falling).sum(-1)                                                  # (H,)
        flat_on = (~moving & (b1 > 0)).to(w1.dtype)  # a unit with w1 = 0 adds w1 x: zero, but it has a gradient
        slope = slope + (w2 * flat_on * w1).sum(-1)
        line = (moving & (kinks.detach() <= low)).to(w1.dtype)
        inside = moving & (kinks.detach() > low) & (kinks.detach() < high)
        const = const - (gain * line * kinks).sum(-1)
        slope = slope + (gain * line).sum(-1)
        return const, slope, kinks[inside], gain[:, inside]

    def plan(self, q_len: int, k_len: int, q: Tensor | None = None, k: Tensor | None = None,
             x: Tensor | None = None, positions: Tensor | None = None) -> FirePlan | DensePlan:
        if positions is not None:   # FirePlan.block's bias at the sequences' own positions p_i, p_j
            query = positions[:, k_len - q_len:, None].float()                                  # (B, q, 1)
            distance = (query - positions[:, None, :].float()).abs()                            # (B, q, k)
            normalised = self.psi(distance) / (self.psi(torch.maximum(query, self.threshold())) + EPS)
            return DensePlan(self.mlp(normalised[..., None]).permute(0, 3, 1, 2), q_len, k_len)   # (B, H, q, k)
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
