"""Evaluation forms of rotary schemes (rope, and xpos's rotation): the frequencies a trained model
rotates with, changed at evaluation to reach past its training length without retraining.

`factor` s: 0 (the default) means the evaluation length over the training length, at least 1, so
the form follows the length evaluated (the "dynamic" variants of PI, NTK and YaRN); a given factor
is used as given, at every length. theta_i = base^(-2i/d), i = 0 .. d/2 - 1, are the trained
frequencies, d the rotated head dimension, L_train the training length.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from relbench.errors import UsageError
from relbench.positions.base import PositionEncoding
from relbench.positions.forms import Form, default_factor, positive, register_form, replaced
from relbench.positions.rope import Rotary, rope_frequencies


class _Scaled(Form):
    """A rotary form with a scale factor s (see the module doc)."""

    applies_to = Rotary

    def __init__(self, factor: float = 0.0):
        positive("factor", factor, self.name)
        if 0 < factor < 1:
            raise UsageError(f'factor={factor:g} of form "{self.name}" extends a context and must be at least 1 '
                             f"(0: evaluation length / training length)")
        self.factor = factor

    def scale(self, enc: PositionEncoding, length: int) -> float:
        return default_factor(self.factor, enc, length)

    def pinned(self, enc: PositionEncoding, length: int) -> Form:
        return self if self.factor else replaced(self, factor=self.scale(enc, length))


@register_form("pi")
class PositionInterpolation(_Scaled):
    """Position interpolation (Chen et al. 2023, "Extending Context Window of Large Language Models
    via Positional Interpolation"): position m is rotated as m / s, i.e. every frequency theta_i / s,
    so L positions fall within the L / s the model was trained on."""

    formula = "theta_i -> theta_i / s  (position m rotated as m / s)"

    def frequencies(self, enc: PositionEncoding, inv_freq: Tensor, length: int) -> Tensor:
        return inv_freq / self.scale(enc, length)


def ntk_base(base: float, factor: float, dim: int) -> float:
    """NTK-aware scaled base b * s^(d / (d - 2)) (bloc97 2023, "NTK-Aware Scaled RoPE", reddit
    r/LocalLLaMA): the lowest frequency is interpolated by exactly s, the highest kept."""
    return base * factor ** (dim / (dim - 2))


@register_form("ntk")
class NTKAware(_Scaled):
    """NTK-aware scaling (bloc97 2023): the base is multiplied by s^(d/(d-2)), so theta_(d/2-1),
    the lowest frequency, becomes theta_(d/2-1) / s while theta_0 = 1 is unchanged."""

    formula = "base -> base * s^(d/(d-2))"

    def frequencies(self, enc: PositionEncoding, inv_freq: Tensor, length: int) -> Tensor:
        if enc.rotary_dim <= 2:
            raise UsageError(f"ntk scaling needs a rotated head dimension above 2, got {enc.rotary_dim}")
        return rope_frequencies(enc.rotary_dim, ntk_base(enc.base, self.scale(enc, length), enc.rotary_dim),
                                inv_freq.device)


def yarn_ramp(inv_freq: Tensor, train_length: int, alpha: float = 1.0, beta: float = 32.0) -> Tensor:
    """YaRN's gamma per frequency, the paper's formula (Peng et al. 2023, eq. 18-19): r_i = L_train /
    lambda_i with wavelength lambda_i = 2 pi / theta_i; gamma = 0 for r < alpha (interpolate),
    1 for r > beta (keep), (r - alpha) / (beta - alpha) between."""
    ratio = train_length * inv_freq.double() / (2 * math.pi)                  # r_i: turns within L_train
    return ((ratio - alpha) / (beta - alpha)).clamp(0, 1)


def yarn_ramp_code(inv_freq: Tensor, train_length: int, base: float, alpha: float = 1.0,
                   beta: float = 32.0) -> Tensor:
    """gamma as YaRN's official code computes it (jquesnelle/yarn, `_yarn_find_correction_range`,
    `_yarn_linear_ramp_mask`): linear in the pair index i between floor(i(beta)) and ceil(i(alpha)),
    i(n) = d log(L_train / (2 pi n)) / (2 log base) the index of a frequency of n turns in L_train."""
    dim = 2 * inv_freq.shape[0]

    def index(turns: float) -> float:
        return dim * math.log(train_length / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(index(beta)), 0), min(math.ceil(index(alpha)), dim - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(dim // 2, dtype=torch.float64, device=inv_freq.device) - low) / (high - low)).clamp(0, 1)
    return 1 - ramp


def yarn_attention_factor(factor: float) -> float:
    """YaRN's sqrt(1/t) = 0.1 ln(s) + 1 (Peng et al. 2023, eq. 22; 1 for s <= 1 as in its code): q
    and k are each multiplied by it, so the logits by its square, 1/t."""
    return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


@register_form("yarn")
class YaRN(_Scaled):
    """YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language Models"):
    "NTK-by-parts" frequencies h(theta_i) = (1 - gamma_i) theta_i / s + gamma_i theta_i, with gamma
    the ramp of `yarn_ramp` (alpha = 1, beta = 32: frequencies of fewer than 1 turn in L_train are
    interpolated, of more than 32 kept), plus the attention temperature: logits x (0.1 ln s + 1)^2.
    `ramp=code` takes gamma as the official code does (`yarn_ramp_code`): linear in the index
    between rounded bounds instead of linear in r; the two agree outside the ramp."""

    formula = "theta_i -> (1-g_i) theta_i/s + g_i theta_i, g ramp of L_train/lambda_i over [1, 32]; logits x (0.1 ln s + 1)^2"

    def __init__(self, factor: float = 0.0, alpha: float = 1.0, beta: float = 32.0, ramp: str = "paper"):
        super().__init__(factor)
        if not 0 < alpha < beta:
            raise UsageError(f'form "yarn" needs 0 < alpha < beta, got alpha={alpha:g}, beta={beta:g}')
        if ramp not in ("paper", "code"):
            raise UsageError(f'ramp={ramp} of form "yarn" is not one of: paper, code')
        self.alpha, self.beta, self.ramp = alpha, beta, ramp

    def gamma(self, enc: PositionEncoding, inv_freq: Tensor) -> Tensor:
        if self.ramp == "code":
            return yarn_ramp_code(inv_freq, enc.train_length, enc.base, self.alpha, self.beta)
        return yarn_ramp(inv_freq, enc.train_length, self.alpha, self.beta)

    def frequencies(self, enc: PositionEncoding, inv_freq: Tensor, length: int) -> Tensor:
        s, gamma = self.scale(enc, length), self.gamma(enc, inv_freq)
        theta = inv_freq.double()
        return ((1 - gamma) * theta / s + gamma * theta).to(inv_freq.dtype)

    def logit_scale(self, enc: PositionEncoding, length: int) -> float:
        return yarn_attention_factor(self.scale(enc, length)) ** 2


@register_form("prope")
class PartialRoPE(Form):
    """p-RoPE (Barbero et al. 2024, "Round and Round We Go! What makes Rotary Positional Encodings
    useful?"): only the highest fraction p of the frequencies rotate; the lowest are set to 0 (those
    channels carry no position). Their code keeps int(p * d // 2) of the d/2 frequencies. The paper
    trains with it; here it is applied to a model trained with full RoPE, without retraining."""

    applies_to = Rotary
    formula = "theta_i -> 0 for i >= int(p d / 2): the lowest 1 - p of the frequencies removed"

    def __init__(self, p: float = 0.75):
        if not 0 <= p <= 1:
            raise UsageError(f'p={p:g} of form "prope" is the fraction of frequencies kept: between 0 and 1')
        self.p = p

    def frequencies(self, enc: PositionEncoding, inv_freq: Tensor, length: int) -> Tensor:
        kept = int(self.p * enc.rotary_dim // 2)
        out = inv_freq.clone()
        out[kept:] = 0.0
        return out
