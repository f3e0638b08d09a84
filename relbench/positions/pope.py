"""PoPE, polar coordinate position embeddings (Gopalakrishnan et al. 2025, "Decoupling the 'What' and
'Where' With Polar Coordinate Positional Embeddings", arXiv 2509.10534): each query and key channel
becomes a complex number whose magnitude is the content, softplus of the channel, and whose phase is
the position alone, so that

    q'_i . k'_j = sum_c softplus(q_ic) softplus(k_jc) cos((i - j) theta_c - delta_hc)

depends on positions only through i - j, and content cannot shift the phase (in RoPE a channel pair's
content sets its angle too). Checked against x-transformers (lucidrains/x-transformers,
x_transformers.py: `PolarEmbedding` and `apply_polar_pos_emb`; `polar_pos_emb=True`): one frequency
per channel, theta_c = base^(-c/d) for c < d (RoPE has d/2), base 10000; a learned phase delta per head
and channel added to the keys' angles, initialised to 0 (`bias_uniform_init=False`; true: uniform in
[-2 pi, 0]) and clamped to [-2 pi, 0]; one module for every layer; the product's scale 1/sqrt(d) of the
head dimension before doubling (x-transformers keeps dim_head ** -0.5), so relbench multiplies q' by
sqrt(2) against the attention paths' 1/sqrt(2d).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from relbench.positions.base import PositionEncoding, register


def polar_frequencies(head_dim: int, base: float = 10000.0, device=None) -> Tensor:
    """(head_dim,) theta_c = base^(-c/d): one frequency per channel."""
    return base ** (-torch.arange(head_dim, dtype=torch.float32, device=device) / head_dim)


@register("pope")
class PolarRotary(PositionEncoding):
    family = "rotary"
    formula = "q', k' = softplus(x) e^(i p theta_c), keys' phase + delta_hc, theta_c = 10000^(-c/d): magnitude what, phase where"
    relative = True
    rotates = True
    takes_positions = True
    qk_width = 2                    # each channel a complex number: [m cos phi, m sin phi]
    shared_across_layers = True     # x-transformers builds one PolarEmbedding for the whole stack

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int, base: float = 10000.0,
                 bias_uniform_init: bool = False):
        super().__init__(n_heads, head_dim, d_model, train_length)
        self.base, self.bias_uniform_init = base, bias_uniform_init
        self.phase = nn.Parameter(torch.zeros(n_heads, head_dim))      # delta_hc, the keys' learned phase

    def reset_parameters(self, generator: torch.Generator) -> None:
        with torch.no_grad():
            if self.bias_uniform_init:
                self.phase.copy_(-2 * math.pi * torch.rand(self.phase.shape, generator=generator))
            else:
                self.phase.zero_()

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """q (B, H, Lq, D), k (B, H, Lk, D) -> (B, H, L, 2D): [m cos phi, m sin phi], m = softplus."""
        q_len, k_len = q.shape[-2], k.shape[-2]
        if positions is None:
            positions = torch.arange(k_len, device=k.device)
        angle = positions.to(torch.float32)[..., None] * polar_frequencies(self.head_dim, self.base, k.device)
        if angle.dim() == 3:                                             # (B, Lk, D): one set per sequence
            angle = angle[:, None]
        delta = self.phase.clamp(-2 * math.pi, 0.0)[:, None, :]          # (H, 1, D)
        q_angle = angle[..., k_len - q_len:, :]                           # the queries: the last q_len positions
        return polar(q, q_angle, math.sqrt(2)), polar(k, angle + delta, 1.0)

    def extra_repr(self) -> str:
        return f"heads={self.n_heads}, base={self.base:g}"


def polar(x: Tensor, angle: Tensor, scale: float) -> Tensor:
    """[m cos angle, m sin angle] * scale, m = softplus(x), in float32 whatever x's dtype."""
    magnitude = F.softplus(x.float())
    return (torch.cat((magnitude * angle.cos(), magnitude * angle.sin()), dim=-1) * scale).type_as(x)
