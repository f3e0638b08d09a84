"""Bias plans: a position scheme's bias for one (q_len, k_len), in its compact form.

A plan is what a scheme hands to the attention backends. Instead of an (H, Lq, Lk) tensor it
holds what the bias is made of (for a relative bias, one value per head and distance: (H, Lq+Lk-1)),
and each backend asks it for the piece it needs: the whole matrix (reference), a block of rows
(chunked), a band near the diagonal plus the constant it takes beyond a horizon (split), or a
FlexAttention score_mod. Building a plan is O(L); materialising is left to the backend, so it is
charged to the attention that needs it.

Positions are absolute: queries are the LAST q_len of k_len positions, so query row a sits at
position k_len - q_len + a. `block(q_start, q_end, k_start, k_end)` takes absolute positions.
"""

from __future__ import annotations

import abc
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor


def distance_grid(q_start: int, q_end: int, k_start: int, k_end: int, device=None) -> Tensor:
    """(q, k) integer distances i - j of query positions [q_start, q_end) and keys [k_start, k_end)."""
    return (torch.arange(q_start, q_end, device=device)[:, None]
            - torch.arange(k_start, k_end, device=device)[None, :])


def causal_mask(q_len: int, k_len: int, device=None) -> Tensor:
    """(Lq, Lk) boolean, True where the key lies after the query (masked)."""
    return distance_grid(k_len - q_len, k_len, 0, k_len, device) < 0


class _ToeplitzGather(torch.autograd.Function):
    """values[..., index] for a Toeplitz index (constant along diagonals), with a backward that
    sums the gradient along diagonals instead of scatter-adding L^2 single elements."""

    @staticmethod
    def forward(ctx, values: Tensor, first: int, q: int, k: int) -> Tensor:
        # index[a, b] = first + a - b: the value for row a, column b
        index = first + torch.arange(q, device=values.device)[:, None] - torch.arange(k, device=values.device)[None, :]
        ctx.shape = (values.shape[-1], first, q, k)
        return values[..., index]                                      # (..., q, k)

    @staticmethod
    def backward(ctx, grad: Tensor):
        n, first, q, k = ctx.shape
        # Row-flip turns diagonals (a - b const) into anti-diagonals (a' + b const); the skew trick
        # (pad each row by q, flatten, re-view with one fewer column) lines anti-diagonals up in columns.
        flipped = grad.flip(-2)                                            # (..., q, k): row a' = q-1-a
        padded = F.pad(flipped, (0, q))                                   # (..., q, k + q)
        flat = padded.flatten(-2)[..., : q * (k + q - 1)]
        skewed = flat.view(*grad.shape[:-2], q, k + q - 1)                 # column c = a' + b
        sums = skewed.sum(-2)                                              # (..., k + q - 1)
        # column c = (q - 1 - a) + b  <=>  a - b = q - 1 - c  <=>  index first + q - 1 - c
        out = grad.new_zeros(*grad.shape[:-2], n)
        low = first + q - 1 - (k + q - 2)                                  # index of the last column
        out[..., low: first + q] = sums.flip(-1)
        return out, None, None, None


def toeplitz(values: Tensor, first: int, q: int, k: int) -> Tensor:
    """(..., q, k) matrix M[a, b] = values[..., first + a - b], differentiable in `values`."""
    return _ToeplitzGather.apply(values, first, q, k)


class BiasPlan(abc.ABC):
    """The interface every backend uses. Subclasses say what they can: a horizon beyond which the
    bias is constant along each query row, a purely linear distance bias, a score_mod."""

    horizon: int | None = None          # for i - j >= horizon, every key of a query row gets tail()
    linear_slopes: Tensor | None = None  # bias == -slope_h * (i - j) for all i >= j (ALiBi)
    distance_only: bool = False          # block() depends on i - j only (the same tile for every block)
    separable: bool = False              # causal bias = r(i) + c(j): key_terms() gives c (ALiBi, FoX)
    flex_trains: bool = True             # FlexAttention's backward compiles for this score_mod (auto uses it)

    def __init__(self, n_heads: int, q_len: int, k_len: int):
        self.n_heads, self.q_len, self.k_len = n_heads, q_len, k_len

    @abc.abstractmethod
    def block(self, q_start: int, q_end: int, k_start: int, k_end: int) -> Tensor:
        """(H, q, k) or (B, H, q, k) bias for absolute positions [q_start, q_end) x [k_start, k_end)."""

    def full(self) -> Tensor:
        return self.block(self.k_len - self.q_len, self.k_len, 0, self.k_len)

    def causal_block(self, q_start: int, q_end: int, k_end: int) -> Tensor:
        """block(q_start, q_end, 0, k_end) with -inf on the keys after each query: the float mask the
        chunked path hands to the fused kernel. Plans with a cheaper exact form override it."""
        bias = self.block(q_start, q_end, 0, k_end)
        return bias.masked_fill(distance_grid(q_start, q_end, 0, k_end, bias.device) < 0, float("-inf"))

    def band(self, q_start: int, q_end: int, horizon: int) -> Tensor:
        """(H or B,H, q, horizon): each query's bias on the `horizon` keys up to it, the farthest first:
        R[a, e] = bias(query q_start + a, key q_start + a - (horizon - 1) + e), for queries whose band
        keys all exist (q_start >= horizon - 1). Gathered from blocks here; plans that hold their
        band directly override it (the split path reads it for content-dependent biases)."""
        parts = []
        for start in range(q_start, q_end, 256):
            stop = min(q_end, start + 256)
            bias = self.block(start, stop, start - horizon + 1, stop)             # (..., rows, rows + horizon - 1)
            index = torch.arange(stop - start, device=bias.device)[:, None] + torch.arange(horizon, device=bias.device)
            parts.append(torch.gather(bias, -1, index.expand(*bias.shape[:-1], horizon)))
        return torch.cat(parts, dim=-2)

    def tail(self, q_start: int, q_end: int) -> Tensor | None:
        """The constant beyond the horizon for query rows [q_start, q_end), broadcastable to
        (B, H, q); None when the plan has no horizon."""
        return None

    def score_mod(self) -> Callable | None:
        """The same bias as a FlexAttention score_mod(score, b, h, q_idx, kv_idx), or None."""
        return None

    @property
    def has_score_mod(self) -> bool:
        """Whether this kind of plan has a score_mod: declared by overriding `score_mod`."""
        return type(self).score_mod is not BiasPlan.score_mod

    @property
    @abc.abstractmethod
    def requires_grad(self) -> bool:
        """Whether gradients flow into the plan (learned parameters, or queries for Shaw)."""

    def key_terms(self, anchor: int, k_end: int) -> Tensor:
        """(H or B,H, k_end): c(j) - c(anchor) for keys j < k_end, where a separable plan's causal bias
        is r(i) + c(j) (ALiBi, FoX): bias(i, j) - bias(i, anchor) for every query i at or after both.
        Only for plans that declare `separable` (the split-linear path reads it)."""
        raise TypeError(f"{type(self).__name__} is not separable: its causal bias has no per-key form")

    def scaled(self, factor: float) -> BiasPlan:
        """The same plan with every bias value multiplied by `factor` > 0 (an evaluation form's logit
        temperature, positions/forms.py)."""
        return ScaledPlan(self, factor)


def log_keys(q_start: int, q_end: int, device=None) -> Tensor:
    """(q,) log n for the query positions [q_start, q_end): n = p + 1, the keys a causal query at p sees."""
    return torch.arange(q_start + 1, q_end + 1, device=device, dtype=torch.float32).log()


class RowScaledPlan(BiasPlan):
    """Scalable-Softmax's factor on another plan's bias: row i (absolute position p) times s_h log(p + 1),
    `scales` the (H,) s_h, learned. The horizon survives (a constant row stays constant); distance-only,
    linear and separable do not (the factor depends on the query), so the toeplitz and split-linear
    paths give way to split or chunked. The score_mod adds s_h log n times the inner bias to a score that
    the caller has scaled already (q times the factor)."""

    def __init__(self, inner: BiasPlan, scales: Tensor):
        super().__init__(inner.n_heads, inner.q_len, inner.k_len)
        self.inner, self.scales = inner, scales                          # (H,)
        self.horizon = inner.horizon
        self.flex_trains = inner.flex_trains

    def factor(self, q_start: int, q_end: int) -> Tensor:
        """(H, q, 1): s_h log n of the query rows [q_start, q_end)."""
        return (self.scales[:, None] * log_keys(q_start, q_end, self.scales.device))[..., None]

    def block(self, q_start: int, q_end: int, k_start: int, k_end: int) -> Tensor:
        return self.inner.block(q_start, q_end, k_start, k_end) * self.factor(q_start, q_end)

    def causal_block(self, q_start: int, q_end: int, k_end: int) -> Tensor:
        # factor 0 at position 0 (log 1) would make 0 * -inf a NaN: mask after scaling
        scaled = self.block(q_start, q_end, 0, k_end)
        return scaled.masked_fill(distance_grid(q_start, q_end, 0, k_end, scaled.device) < 0, float("-inf"))

    def band(self, q_start: int, q_end: int, horizon: int) -> Tensor:
        return self.inner.band(q_start, q_end, horizon) * self.factor(q_start, q_end)

    def tail(self, q_start: int, q_end: int) -> Tensor | None:
        constant = self.inner.tail(q_start, q_end)
        return None if constant is None else constant * self.factor(q_start, q_end)[..., 0]

    @property
    def has_score_mod(self) -> bool:
        return self.inner.has_score_mod

    def score_mod(self) -> Callable | None:
        inner, scales, first = self.inner.score_mod(), self.scales, self.k_len - self.q_len
        if inner is None:
            return None

        def row_scaled_score(score, b, h, q_idx, kv_idx):
            factor = scales[h] * torch.log((q_idx + first + 1).to(torch.float32))
            return score + factor * (inner(score, b, h, q_idx, kv_idx) - score)

        return row_scaled_score

    @property
    def requires_grad(self) -> bool:
        return self.inner.requires_grad or self.scales.requires_grad


class DistancePlan(BiasPlan):
    """A bias that depends on i - j alone: `values[h, d - first_distance]` for distance d, over every
    distance the (q_len, k_len) grid contains, 1 - q_len .. k_len - 1."""

    distance_only = True

    def __init__(self, values: Tensor, q_len: int, k_len: int, horizon: int | None = None,
                 linear_slopes: Tensor | None = None):
        super().__init__(values.shape[0], q_len, k_len)
        self.values = values                          # (H, q_len + k_len - 1)
        self.first_distance = 1 - q_len
        self.horizon = horizon if horizon is not None and horizon < k_len else None
        self.linear_slopes = linear_slopes
        self.separable = linear_slopes is not None

    def key_terms(self, anchor: int, k_end: int) -> Tensor:
        """-m (i - j) = m (j - anchor) - m (i - anchor): c(j) - c(anchor) = m (j - anchor)."""
        offsets = torch.arange(k_end, device=self.linear_slopes.device, dtype=self.linear_slopes.dtype) - anchor
        return self.linear_slopes[:, None] * offsets                          # (H, k_end)

    @staticmethod
    def distances(q_len: int, k_len: int, device=None) -> Tensor:
        return torch.arange(1 - q_len, k_len, device=device)          # (q_len + k_len - 1,)

    def block(self, q_start: int, q_end: int, k_start: int, k_end: int) -> Tensor:
        first = q_start - k_start - self.first_distance
        return toeplitz(self.values, first, q_end - q_start, k_end - k_start)   # (H, q, k)

    def tail(self, q_start: int, q_end: int) -> Tensor:
        return self.values[:, self.horizon - self.first_distance, None]          # (H, 1)

    @property
    def requires_grad(self) -> bool:
        return self.values.requires_grad

    def scaled(self, factor: float) -> DistancePlan:
        slopes = None if self.linear_slopes is None else self.linear_slopes * factor
        return DistancePlan(self.values * factor, self.q_len, self.k_len, self.horizon, slopes)

    def score_mod(self) -> Callable:
        values, shift = self.values, (self.k_len - self.q_len) - self.first_distance

        def add_distance_bias(score, b, h, q_idx, kv_idx):
            return score + values[h, q_idx - kv_idx + shift]

        return add_distance_bias


class DensePlan(BiasPlan):
    """A bias given whole, (B, H, q_len, k_len) or (H, q_len, k_len): what a relative scheme makes of
    positions that are not 0 .. L - 1 (randomized positions: p_i - p_j differs per sequence and is no
    function of i - j). Every block is a slice of it; it has no horizon, no score_mod, and runs on the
    chunked (or reference) path."""

    def __init__(self, bias: Tensor, q_len: int, k_len: int):
        super().__init__(bias.shape[-3], q_len, k_len)
        self.bias = bias
        self.offset = k_len - q_len                      # absolute position of query row 0

    def block(self, q_start: int, q_end: int, k_start: int, k_end: int) -> Tensor:
        return self.bias[..., q_start - self.offset: q_end - self.offset, k_start:k_end]

    @property
    def requires_grad(self) -> bool:
        return self.bias.requires_grad


class ScaledPlan(BiasPlan):
    """`factor` x another plan's bias, for every piece a backend asks for. -inf (masked keys) stays
    -inf since factor > 0. The score_mod rescales the score around the inner one: factor * (score /
    factor + bias) = score + factor * bias."""

    def __init__(self, inner: BiasPlan, factor: float):
        if not factor > 0:
            raise ValueError(f"a plan's bias can only be scaled by a positive factor, got {factor}")
        super().__init__(inner.n_heads, inner.q_len, inner.k_len)
        self.inner, self.factor = inner, factor
        self.horizon = inner.horizon
        self.linear_slopes = None if inner.linear_slopes is None else inner.linear_slopes * factor
        self.separable = inner.separable
        self.distance_only = False     # the toeplitz path reads a DistancePlan's values: it scales itself
        self.flex_trains = inner.flex_trains

    def block(self, q_start: int, q_end: int, k_start: int, k_end: int) -> Tensor:
        return self.inner.block(q_start, q_end, k_start, k_end) * self.factor

    def causal_block(self, q_start: int, q_end: int, k_end: int) -> Tensor:
        return self.inner.causal_block(q_start, q_end, k_end) * self.factor

    def key_terms(self, anchor: int, k_end: int) -> Tensor:
        return self.inner.key_terms(anchor, k_end) * self.factor

    def tail(self, q_start: int, q_end: int) -> Tensor | None:
        tail = self.inner.tail(q_start, q_end)
        return None if tail is None else tail * self.factor

    @property
    def has_score_mod(self) -> bool:
        return self.inner.has_score_mod

    def score_mod(self) -> Callable | None:
        inner, factor = self.inner.score_mod(), self.factor
        if inner is None:
            return None

        def scaled_score(score, b, h, q_idx, kv_idx):
            return inner(score / factor, b, h, q_idx, kv_idx) * factor

        return scaled_score

    @property
    def requires_grad(self) -> bool:
        return self.inner.requires_grad
