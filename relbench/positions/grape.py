"""GRAPE-A, the additive form of GRAPE (Zhang et al. 2026, "GRAPE: Group Representational Position
Encoding", ICLR 2026, arXiv 2512.07805), key-gated: ALiBi's linear distance penalty with a slope that
each key sets for itself,

    b(i, j) = -(i - j) * omega_h * softplus(u_h . k_j / sqrt(d)),     omega_h = softplus(w_h) * m_h,

m_h ALiBi's head slope. Checked against the official code (model-architectures/GRAPE,
model/llama-mha-grape-a-keygated.py `KeyGatedAdditiveBias`, with the defaults of
config/train_llama_mha_grape_a_keygated_medium_adam_80g8.py): omega starts at 1 x the ALiBi slope
(softplus(w) = 1, `keygated_omega_init = None`), u is drawn normal with std 1/sqrt(d) and L2-normalised
in the forward pass (`keygated_u_l2_norm = True`, eps 1e-6), one module per layer, the gate read from
the keys as the layer projects them. The official model also normalises q and k (QK RMSNorm); relbench's
GPT has no QK-norm, so the gate reads the raw keys. The query-gated and query-key-gated forms of the
repository are not here.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from relbench.errors import UsageError
from relbench.positions.alibi import slopes
from relbench.positions.base import PositionEncoding, register
from relbench.positions.plan import BiasPlan, distance_grid


class KeyGatedPlan(BiasPlan):
    """-(i - j) omega_h g_j on the causal keys (0 on the others, as the official code clamps), from the
    per-key gates g (B, H, k_len) and the head rates omega (H,)."""

    def __init__(self, gate: Tensor, omega: Tensor, q_len: int, k_len: int):
        super().__init__(gate.shape[1], q_len, k_len)
        self.gate, self.omega = gate, omega

    def block(self, q_start: int, q_end: int, k_start: int, k_end: int) -> Tensor:
        distance = distance_grid(q_start, q_end, k_start, k_end, self.gate.device).clamp_min(0).to(self.gate.dtype)
        return -distance * self.omega[:, None, None] * self.gate[..., None, k_start:k_end]   # (B, H, bq, bk)

    @property
    def requires_grad(self) -> bool:
        return self.gate.requires_grad or self.omega.requires_grad


def softplus_inverse(y: float) -> float:
    """x with softplus(x) = y > 0."""
    return math.log(math.expm1(y))


@register("grape-a")
class KeyGatedAdditive(PositionEncoding):
    """GRAPE-A: ALiBi's distance penalty, its slope per key softplus(u_h . k_j / sqrt(d)) times a learned rate."""

    family = "relative bias (content-gated)"
    formula = "e_ij += -(i - j) * omega_h * softplus(u_h . k_j / sqrt(d)), omega_h from the ALiBi slope (GRAPE-A)"
    shared_across_layers = False
    adds_bias = True
    key_dependent = True

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int, omega_init: float = 1.0):
        super().__init__(n_heads, head_dim, d_model, train_length)
        if not omega_init > 0:
            raise UsageError(f"grape-a's omega_init={omega_init:g} multiplies the ALiBi slopes: give a positive one")
        self.omega_init = omega_init
        self.rate = nn.Parameter(torch.zeros(n_heads))            # w_h: omega_h = softplus(w_h) * m_h
        self.u = nn.Parameter(torch.zeros(n_heads, head_dim))
        self.register_buffer("alibi", slopes(n_heads), persistent=False)

    def reset_parameters(self, generator: torch.Generator) -> None:
        with torch.no_grad():
            self.rate.fill_(softplus_inverse(self.omega_init))
            self.u.copy_(torch.randn(self.u.shape, generator=generator) / math.sqrt(self.head_dim))

    def plan(self, q_len: int, k_len: int, q: Tensor | None = None, k: Tensor | None = None,
             x: Tensor | None = None) -> KeyGatedPlan:
        if k is None:
            raise UsageError("grape-a's slopes are read from the keys: build its plan with k")
        u = F.normalize(self.u.float(), dim=-1, eps=1e-6)
        gate = F.softplus((k.float() * u[:, None, :]).sum(-1) / math.sqrt(self.head_dim))     # (B, H, k_len)
        return KeyGatedPlan(gate, F.softplus(self.rate) * self.alibi.to(gate.device), q_len, k_len)

    def extra_repr(self) -> str:
        return f"heads={self.n_heads}, omega_init={self.omega_init:g}"
