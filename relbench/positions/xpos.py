"""xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer"): rotary embeddings whose query and
key are also scaled exponentially with position, q_n * zeta^(n / gamma) and k_m * zeta^(-m / gamma),
so that q_n . k_m carries a factor zeta^((n - m) / gamma) that decays with distance. Per channel
pair c of D/2: zeta_c = (2c / D + 0.4) / 1.4; scale base gamma = 512."""

from __future__ import annotations

import torch
from torch import Tensor

from relbench.positions.base import register
from relbench.positions.rope import Rotary, apply_rotary, positional_angles, rope_angles


def xpos_scale(positions: Tensor, head_dim: int, scale_base: float = 512.0, gamma: float = 0.4) -> Tensor:
    """(len(positions), head_dim) factors zeta_c ** (p / scale_base), channel pairs (c, c + D/2)."""
    zeta = (torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim + gamma) / (1 + gamma)
    power = positions.double()[:, None] / scale_base                                   # (L, 1)
    half = torch.exp(power * torch.log(zeta)[None, :])                                 # (L, D/2)
    return torch.cat((half, half), dim=-1).float()                                     # (L, D)


@register("xpos")
class XPos(Rotary):
    """RoPE (base 10000) with xPos's exponential scale (base 512, zeta offset 0.4). Positions are
    measured from the middle of the keys: only n - m matters, and centring keeps the factors of
    long sequences within float32 range."""

    formula = "q_n, k_m rotated as RoPE and scaled by zeta^(+-n/512): q.k ~ zeta^((n-m)/512)"

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int, base: float = 10000.0,
                 scale_base: float = 512.0):
        super().__init__(n_heads, head_dim, d_model, train_length, base)
        self.scale_base = scale_base

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        q_len, k_len = q.shape[-2], k.shape[-2]
        offset = k_len - q_len
        if positions is None:
            positions = torch.arange(k_len, device=k.device)
            cos, sin = rope_angles(positions, self.head_dim, inv_freq=self.frequencies(k_len, k.device))  # (Lk, D/2)
            scale = xpos_scale(positions - k_len // 2, self.head_dim, self.scale_base)     # (Lk, D)
        else:   # one set of positions per sequence (B, Lk), centred on each sequence's middle key
            cos, sin = positional_angles(positions, self.head_dim, self.frequencies(k_len, k.device))  # (B, 1, Lk, D/2)
            centred = positions - positions[:, k_len // 2, None]
            scale = xpos_scale(centred.reshape(-1), self.head_dim, self.scale_base).view(*cos.shape[:-1], -1)
        q_rot = apply_rotary(q, cos[..., offset:, :], sin[..., offset:, :]) * scale[..., offset:, :].to(q.dtype)
        k_rot = apply_rotary(k, cos, sin) / scale.to(k.dtype)
        return q_rot, k_rot

    def extra_repr(self) -> str:
        return f"base={self.base:g}, scale_base={self.scale_base:g}"
