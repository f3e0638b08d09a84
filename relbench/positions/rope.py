"""Rotary position embeddings (Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary
Position Embedding"): rotate pairs of query and key channels by an angle proportional to the
position, so that q_i . k_j depends on positions only through i - j."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from relbench.errors import UsageError
from relbench.positions.base import PositionEncoding, register


def rope_frequencies(head_dim: int, base: float = 10000.0, device=None) -> Tensor:
    """(head_dim // 2,) float32 rotation frequencies theta_i = base^(-2i/head_dim), i = 0 .. D/2 - 1."""
    return base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)


def rope_angles(positions: Tensor, head_dim: int, base: float = 10000.0,
                inv_freq: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """cos and sin, each (len(positions), head_dim // 2), of theta_p,i = p * base^(-2i/head_dim), or
    p * inv_freq[i] when the frequencies are given. Computed in float32 whatever the model's dtype
    (large p * theta loses precision in bf16)."""
    if inv_freq is None:
        inv_freq = rope_frequencies(head_dim, base, positions.device)
    angle = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # (L, D/2)
    return angle.cos(), angle.sin()


def positional_angles(positions: Tensor, head_dim: int, inv_freq: Tensor) -> tuple[Tensor, Tensor]:
    """rope_angles at `positions` (L,) -> (L, D/2) each, or (B, L) -> (B, 1, L, D/2): one set of
    positions per sequence, broadcast over the heads."""
    cos, sin = rope_angles(positions.reshape(-1), head_dim, inv_freq=inv_freq)
    if positions.dim() == 1:
        return cos, sin
    shape = (positions.shape[0], 1, positions.shape[1], -1)
    return cos.view(shape), sin.view(shape)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x (..., L, D) channel pairs (i, i + D/2) (the GPT-NeoX layout) by the angles."""
    x_f = x.float()
    half = x_f.shape[-1] // 2
    x1, x2 = x_f[..., :half], x_f[..., half:]                          # (..., L, D/2) each
    rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (..., L, D)
    return rotated.type_as(x)


@register("rope")
class Rotary(PositionEncoding):
    """RoPE on queries and keys, base 10000, all channels of each head rotated."""

    family = "rotary"
    formula = "q_i, k_j rotated by angle p * 10000^(-2c/d)  =>  q_i.k_j depends on i - j"
    relative = True
    rotates = True
    takes_positions = True

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int, base: float = 10000.0):
        super().__init__(n_heads, head_dim, d_model, train_length)
        if head_dim % 2:
            raise UsageError(f"rope rotates channel pairs and needs an even head dimension, got {head_dim}")
        self.base = base
        self.rotary_dim = head_dim      # the channels that rotate (partial_rope: fewer); the forms read it

    def frequencies(self, length: int, device=None) -> Tensor:
        """(D/2,) float32 frequencies for a sequence of `length`: base^(-2i/D), or what an evaluation
        form (positions/rope_forms.py: PI, NTK, YaRN, p-RoPE) makes of them at that length."""
        inv_freq = rope_frequencies(self.head_dim, self.base, device)
        return inv_freq if self.form is None else self.form.frequencies(self, inv_freq, length)

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        q_len, k_len = q.shape[-2], k.shape[-2]
        if positions is None:
            positions = torch.arange(k_len, device=k.device)
        cos, sin = positional_angles(positions, self.head_dim, self.frequencies(k_len, k.device))  # (Lk or B,1,Lk, D/2)
        q_rot = apply_rotary(q, cos[..., k_len - q_len:, :], sin[..., k_len - q_len:, :])  # queries: last q_len positions
        return q_rot, apply_rotary(k, cos, sin)

    def extra_repr(self) -> str:
        return f"base={self.base:g}"


@register("hope")
class HighFrequencyRotary(Rotary):
    """HoPE (Chen et al. 2024, "HoPE: A Novel Positional Encoding Without Long-Term Decay for Enhanced
    Context Awareness and Extrapolation", arXiv 2410.21216): RoPE whose low-frequency components are made
    position-independent. A channel pair whose angle turns less than `cycles` full turns over the
    training length (theta_c * L < 2 pi * cycles) is left unrotated: its part of q.k is content only,
    with no long-term decay and no angle unseen in training at any length; the pairs that turn faster
    rotate as RoPE's. The paper's threshold is one full turn; its official code was not reachable
    offline, so `cycles` is an option (docs/variants.md)."""

    formula = "RoPE, but pairs with theta_c * L_train < 2 pi left unrotated (position-independent)"

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int, base: float = 10000.0,
                 cycles: float = 1.0):
        super().__init__(n_heads, head_dim, d_model, train_length, base)
        if not cycles > 0:
            raise UsageError(f"hope's cycles (full turns over the training length that keep a pair rotary) "
                             f"must be positive, got {cycles}")
        self.cycles = cycles

    def kept(self, device=None) -> Tensor:
        """(D/2,) bool: the channel pairs that stay rotary, theta_c * train_length >= 2 pi * cycles."""
        inv_freq = rope_frequencies(self.head_dim, self.base, device)
        return inv_freq * self.train_length >= 2 * math.pi * self.cycles

    def frequencies(self, length: int, device=None) -> Tensor:
        inv_freq = super().frequencies(length, device)
        return torch.where(self.kept(device), inv_freq, torch.zeros_like(inv_freq))

    def extra_repr(self) -> str:
        kept = int(self.kept().sum())
        return f"base={self.base:g}, cycles={self.cycles:g}, rotary pairs={kept} of {self.head_dim // 2}"


@register("partial_rope")
class PartialRotary(Rotary):
    """Partial RoPE: the first `fraction` of each head's channels rotate, with RoPE's frequency ladder
    over those channels alone, and the rest carry content only, unrotated. As GPT-NeoX does
    (transformers models/gpt_neox/modeling_gpt_neox.py: rotary_ndims = int(head_size * rotary_pct), the
    rotary embedding built over rotary_ndims channels; configuration_gpt_neox.py: rotary_pct 0.25, the
    default here) and x-transformers' default RoPE (rotary_emb_dim = max(dim_head // 2, 32)). Not
    p-RoPE (the `prope` evaluation form): that keeps the whole ladder and removes its lowest frequencies."""

    formula = "first r = fraction * d channels rotated by p * base^(-2c/r); the other d - r unrotated"

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int, base: float = 10000.0,
                 fraction: float = 0.25):
        super().__init__(n_heads, head_dim, d_model, train_length, base)
        self.rotary_dim = int(head_dim * fraction) // 2 * 2      # whole channel pairs
        if not 0 < fraction <= 1 or self.rotary_dim < 2:
            raise UsageError(f"partial_rope's fraction={fraction:g} of {head_dim} channels rotates "
                             f"{self.rotary_dim}: give a fraction in (0, 1] that rotates at least one pair")
        self.fraction = fraction

    def frequencies(self, length: int, device=None) -> Tensor:
        inv_freq = rope_frequencies(self.rotary_dim, self.base, device)
        return inv_freq if self.form is None else self.form.frequencies(self, inv_freq, length)

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        r = self.rotary_dim
        q_rot, k_rot = super().rotate(q[..., :r], k[..., :r], positions)
        return torch.cat([q_rot, q[..., r:]], dim=-1), torch.cat([k_rot, k[..., r:]], dim=-1)

    def extra_repr(self) -> str:
        return f"base={self.base:g}, rotated channels={self.rotary_dim} of {self.head_dim}"
