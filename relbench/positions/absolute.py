"""No position information, and absolute position embeddings added to the token embeddings."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from relbench.config import INIT_STD
from relbench.positions.base import PositionEncoding, register


@register("none")
class NoPosition(PositionEncoding):
    """NoPE: no explicit position information; a causal model can still infer order from the mask
    (Haviv et al. 2022, "Transformer Language Models without Positional Encodings Still Learn
    Positional Information")."""

    family = "none"
    formula = "nothing added; order only from the causal mask"
    relative = True  # trivially: nothing depends on absolute position


def sinusoid_table(length: int, d_model: int, base: float = 10000.0, device=None) -> Tensor:
    """(length, d_model) sinusoids of Vaswani et al. 2017, "Attention Is All You Need", sec. 3.5:
    PE[p, 2i] = sin(p / base^(2i/d)), PE[p, 2i+1] = cos(p / base^(2i/d))."""
    position = torch.arange(length, dtype=torch.float32, device=device)[:, None]            # (L, 1)
    inv_freq = base ** (-torch.arange(0, d_model, 2, dtype=torch.float32, device=device) / d_model)  # (D/2,)
    angle = position * inv_freq                                                             # (L, D/2)
    table = torch.zeros(length, d_model, device=device)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table


@register("sinusoidal")
class Sinusoidal(PositionEncoding):
    """Fixed sinusoidal absolute embeddings added to the token embeddings (Vaswani et al. 2017).

    Vaswani et al. multiply the token embeddings by sqrt(d_model), which puts them at an RMS of
    about 1 (tensor2tensor initialises them with std d^-1/2), and add sinusoids of RMS 1/sqrt(2):
    position signal at 0.71 of the token signal. relbench's token embedding is tied to the output
    layer and starts at std 0.02 (GPT-2), so instead of rescaling it the table is multiplied by
    `scale` = 0.02, the same ratio at initialisation. (Dividing the table by sqrt(d_model)
    instead, as relbench did before, put positions at 3.1x the tokens' RMS at d_model = 128 and
    cost the baseline 0.45 nats of validation loss at the training length.)"""

    family = "absolute"
    formula = "x_p += 0.02 [sin(p/10000^(2i/d)), cos(p/10000^(2i/d))]"

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int, base: float = 10000.0,
                 scale: float = INIT_STD):
        super().__init__(n_heads, head_dim, d_model, train_length)
        self.base, self.scale = base, scale
        self.register_buffer("_anchor", torch.zeros(0), persistent=False)  # follows .to(device)

    def embed(self, length: int) -> Tensor:
        table = sinusoid_table(length, self.d_model, self.base, device=self._anchor.device)  # (L, D)
        return table * self.scale

    def extra_repr(self) -> str:
        return f"base={self.base:g}, scale={self.scale:g}"


@register("learned")
class Learned(PositionEncoding):
    """Learned absolute embeddings, one vector per position below the training length (GPT-2).

    Beyond the training length there is no embedding: `max_length` says so, and evaluation
    records those lengths as unsupported rather than clamping positions."""

    family = "absolute"
    formula = "x_p += E[p], E learned for p < train length"

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int):
        super().__init__(n_heads, head_dim, d_model, train_length)
        self.table = nn.Parameter(torch.zeros(train_length, d_model))  # (L_train, D)

    @property
    def max_length(self) -> int:
        return self.train_length

    def embed(self, length: int) -> Tensor:
        self.check_length(length)
        return self.table[:length]  # (L, D)

    def reset_parameters(self, generator: torch.Generator) -> None:
        with torch.no_grad():
            self.table.copy_(torch.randn(self.table.shape, generator=generator) * 0.02)

    def extra_repr(self) -> str:
        return f"positions={self.train_length}, d_model={self.d_model}"


