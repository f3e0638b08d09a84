"""No position information, and absolute position embeddings added to the token embeddings."""

from __future__ import annotations

import torch
from torch import Tensor, nn

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

    Vaswani et al. multiply the token embeddings by sqrt(d_model) (initialised with std d^-1/2,
    so at an RMS of about 1) and add sinusoids of RMS 1/sqrt(2). relbench's token embedding is tied
    to the output layer, unscaled, and starts at std 0.02 (GPT-2); it grows fast in training (RMS
    0.02 -> 0.11 in the quick preset's 400 steps), so no fixed multiple of the sinusoids keeps
    Vaswani's ratio throughout. `scale` (default d_model^-1/2: 3.1x the tokens' RMS at
    initialisation, about 0.6x at the end of training) was chosen by validation loss at the training
    length over 0.02, 0.044, 0.088 and 0.177 on the quick preset (fp32, seed 0: 2.340, 2.301,
    2.201, 2.484 nats): at 0.02, the ratio of Vaswani et al. at initialisation only, the model
    ignored its positions and trained to exactly the loss of `none` (results/reference/README.md)."""

    family = "absolute"
    formula = "x_p += d^-1/2 [sin(p/10000^(2i/d)), cos(p/10000^(2i/d))]"
    takes_positions = True

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int, base: float = 10000.0,
                 scale: float | None = None):
        super().__init__(n_heads, head_dim, d_model, train_length)
        self.base, self.scale = base, d_model ** -0.5 if scale is None else scale
        self.register_buffer("_anchor", torch.zeros(0), persistent=False)  # follows .to(device)

    def embed(self, length: int, positions: Tensor | None = None) -> Tensor:
        if positions is not None:   # (B, L) chosen positions -> (B, L, D): the rows of a table reaching them
            table = sinusoid_table(int(positions.max()) + 1, self.d_model, self.base, device=self._anchor.device)
            return table[positions] * self.scale
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


