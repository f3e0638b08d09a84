"""BAM, the Bayesian Attention Mechanism (Bianchessi, Aguirre, Barros, Rosa, Dalmolin and Ferreira 2026,
"Bayesian Attention Mechanism: A Probabilistic Framework for Positional Encoding and Context Length
Extrapolation", ICLR 2026, arXiv 2505.22842): the bias is the log of a generalized Gaussian prior over
the distance from query to key, with a scale, a shape and a location per head,

    b(i, j) = -exp(theta_alpha_h) * (|(i - j) - mu_h| + eps) ** theta_beta_h.

theta_beta = 1, mu = 0 is ALiBi with slope exp(theta_alpha) (up to eps); theta_beta = 2 a Gaussian
window, theta_beta -> 0 a constant (NoPE). Both shape and scale are learned.

Defaults, checked against the official code (ArthurSBianchessi/BAM, models/bam.py, `AttentionPrior`
and `BATModelArgs`): one prior shared by every layer (`global_positional_encoding = True`), the scale
starting at the ALiBi slopes (`scale_init = 'slope'`, stored as its log), the shape at 1
(`shape_init = 1`), both trained, the location frozen at 0 (`train_loc = False`), eps = 1e-5. The
official code writes the location as 2 sinh(loc) on the signed offset j - i; here `mu` is the
location on the distance i - j itself (mu = -2 sinh(loc)), the form of the paper's prior. Its
`shape_init = 'linear'` (0 to 1 over the heads) and the 'sampled' initialisations are options."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from relbench.errors import UsageError
from relbench.positions.alibi import slopes
from relbench.positions.base import RelativeBias, register

SCALE_INITS = ("slope", "sampled")     # or a number: every head's scale starts there
SHAPE_INITS = ("linear", "sampled")    # or a number: every head's shape starts there


def _init_value(text: str, named: tuple[str, ...], option: str) -> str | float:
    if text in named:
        return text
    try:
        return float(text)
    except ValueError:
        raise UsageError(f'bam\'s {option} must be {", ".join(named)} or a number, got "{text}"') from None


@register("bam")
class BayesianAttention(RelativeBias):
    """A generalized-Gaussian log-prior on distance per head: -exp(theta_alpha) * (|d - mu| + eps)^theta_beta."""

    formula = ("b = -exp(a_h) * (|i-j - mu_h| + eps)^beta_h, a_h, beta_h learned per head, mu_h = 0, "
               "one prior for all layers (Bianchessi et al. 2026, BAM)")
    shared_across_layers = True   # the official default; `shared=false` builds one prior per layer

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int,
                 scale_init: str = "slope", shape_init: str = "1", mu_init: float = 0.0,
                 train_scale: bool = True, train_shape: bool = True, train_mu: bool = False,
                 eps: float = 1e-5, shared: bool = True):
        super().__init__(n_heads, head_dim, d_model, train_length)
        self.scale_init = _init_value(scale_init, SCALE_INITS, "scale_init")
        self.shape_init = _init_value(shape_init, SHAPE_INITS, "shape_init")
        if isinstance(self.scale_init, float) and not self.scale_init > 0:
            raise UsageError(f"bam's scale_init must be positive (it is stored as its log), got {self.scale_init:g}")
        if not eps > 0:
            raise UsageError(f"bam's eps must be positive, got {eps:g}")
        self.mu_init, self.eps = mu_init, eps
        self.shared_across_layers = shared              # read per instance; the model asks `layers_share`
        for name, trained in (("theta_alpha", train_scale), ("theta_beta", train_shape), ("mu", train_mu)):
            if trained:
                setattr(self, name, nn.Parameter(torch.zeros(n_heads)))
            else:                                          # frozen: saved with the model, not optimised
                self.register_buffer(name, torch.zeros(n_heads))

    @classmethod
    def layers_share(cls, options: dict) -> bool:
        return bool(options.get("shared", True))

    def reset_parameters(self, generator: torch.Generator) -> None:
        h = self.n_heads
        with torch.no_grad():
            if self.scale_init == "slope":
                self.theta_alpha.copy_(slopes(h).log())
            elif self.scale_init == "sampled":                # the official code: log scale ~ N(0, 1)
                self.theta_alpha.copy_(torch.randn(h, generator=generator))
            else:
                self.theta_alpha.fill_(float(torch.tensor(self.scale_init).log()))
            if self.shape_init == "linear":
                self.theta_beta.copy_(torch.linspace(0.0, 1.0, h))
            elif self.shape_init == "sampled":
                self.theta_beta.copy_(torch.randn(h, generator=generator))
            else:
                self.theta_beta.fill_(self.shape_init)
            self.mu.fill_(self.mu_init)

    def distance_bias(self, distance: Tensor) -> Tensor:
        d = distance.float()
        shape = (-1,) + (1,) * d.dim()
        offset = (d - self.mu.view(shape)).abs() + self.eps                           # (H, *shape)
        return -self.theta_alpha.view(shape).exp() * offset.pow(self.theta_beta.view(shape))

    def extra_repr(self) -> str:
        return (f"heads={self.n_heads}, scale_init={self.scale_init}, shape_init={self.shape_init}, "
                f"mu={self.mu_init:g}, eps={self.eps:g}, shared={self.shared_across_layers}")
