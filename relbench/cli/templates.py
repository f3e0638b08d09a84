"""The files `relbench new-variant` writes: one working, documented position scheme per kind, each
passing `relbench check` as written (tests/test_plugins.py checks every kind)."""

from __future__ import annotations

KINDS = ("bias", "rotary", "data-dependent")

_HEADER = '''"""{name}: a position scheme of your own for relbench (written by `relbench new-variant`).

Use it without touching relbench:

    relbench check {file}                              # the contract, property by property
    relbench bench --plugin {file} --variants {name} --against retrieval   # its tier among the shipped panel
    relbench bench --plugin {file} --variants {name} alibi xl t5           # or beside baselines trained here

The class below is an ordinary relbench PositionEncoding registered under "{name}". Change the
maths where the comments say so, keep the declarations (the class attributes) true to what the
code does, and run `relbench check {file}` after each change: it names any declaration that no
longer holds. A run records this file's sha256; evaluating that run after editing the file is
refused unless you pass --accept-plugin-change.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from relbench.positions import register
'''

_BIAS = '''from relbench.positions import RelativeBias


@register("{name}")
class {cls}(RelativeBias):
    """bias = -softplus(a_h) * log(1 + |i - j|): a learned, per-head logarithmic decay with distance.

    RelativeBias gives a bias that is a function of the distance i - j alone: implement
    distance_bias and every fast attention path (the Toeplitz view, FlexAttention's score_mod, the
    horizon split if you declare a horizon) works with it. It declares distance_only and
    has_score_mod; `relbench check` holds the code to both."""

    formula = "b = -softplus(a_h) * log(1 + |i-j|), a_h learned per head"   # shown by `relbench variants`
    shared_across_layers = True   # one instance serves every layer; False: one per layer

    # options: keyword arguments after train_length, with defaults, become "{name}:scale=2.0"
    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int, scale: float = 1.0):
        super().__init__(n_heads, head_dim, d_model, train_length)
        self.scale = scale
        self.a = nn.Parameter(torch.zeros(n_heads))     # (H,) one learned decay per head

    def reset_parameters(self, generator: torch.Generator) -> None:
        # draw every initial value from `generator` (the model seeds it per run): never torch's global RNG
        with torch.no_grad():
            self.a.copy_(torch.randn(self.a.shape, generator=generator) * 0.5)

    def distance_bias(self, distance: Tensor) -> Tensor:
        # distance: integer i - j of any shape (>= 0 for past keys); return (H, *distance.shape)
        d = distance.abs().float()
        decay = nn.functional.softplus(self.a).view(-1, *([1] * d.dim()))
        return -self.scale * decay * torch.log1p(d)                       # CHANGE: your function of the distance
'''

_ROTARY = '''from relbench.positions import PositionEncoding


@register("{name}")
class {cls}(PositionEncoding):
    """Rotates each pair of channels of q and k by an angle proportional to the position, so that
    q_i . k_j depends on i - j only (RoPE, Su et al. 2021), with a frequency base of your choice.

    A rotary scheme adds no bias: it declares `rotates` and implements rotate(q, k). Queries are
    the LAST q_len of the k_len positions (a chunk of queries at the end of a longer context)."""

    family = "rotary"
    formula = "rotate channel pair m of q_i, k_j by i * base^(-2m/D)"
    rotates = True
    relative = True   # q_i . k_j depends on i - j only: `relbench check` measures it

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int, base: float = 10000.0):
        super().__init__(n_heads, head_dim, d_model, train_length)
        if head_dim % 2:
            raise ValueError("a rotary scheme needs an even head_dim")
        self.base = base

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        q_len, k_len = q.shape[-2], k.shape[-2]
        half = self.head_dim // 2
        inv_freq = self.base ** (-torch.arange(half, device=k.device, dtype=torch.float32) / half)   # CHANGE
        angle = torch.arange(k_len, device=k.device, dtype=torch.float32)[:, None] * inv_freq         # (Lk, D/2)
        cos, sin = angle.cos(), angle.sin()

        def turn(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
            x1, x2 = x[..., :half], x[..., half:]
            return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)

        return turn(q, cos[k_len - q_len:], sin[k_len - q_len:]), turn(k, cos, sin)

    def extra_repr(self) -> str:
        return f"base={{self.base:g}}, heads={{self.n_heads}}"
'''

_DATA = '''from relbench.positions import PositionEncoding
from relbench.positions.plan import BiasPlan


class {cls}Plan(BiasPlan):
    """bias(i, j) = -softplus(w_h . k_j) * (i - j): each key sets how fast it fades with distance.
    A plan computes any block of the bias on demand; the attention paths ask only for the blocks
    they need, so no (L, L) tensor exists on the fast paths."""

    def __init__(self, rate: Tensor, q_len: int, k_len: int):
        super().__init__(rate.shape[1], q_len, k_len)
        self.rate = rate                                                    # (B, H, k_len), > 0

    def block(self, q_start: int, q_end: int, k_start: int, k_end: int) -> Tensor:
        # absolute positions: queries [q_start, q_end), keys [k_start, k_end); return (B, H, q, k)
        i = torch.arange(q_start, q_end, device=self.rate.device)[:, None]
        j = torch.arange(k_start, k_end, device=self.rate.device)[None, :]
        distance = (i - j).clamp(min=0).float()                           # future keys: masked anyway
        return -self.rate[..., None, k_start:k_end] * distance              # CHANGE: your bias

    @property
    def requires_grad(self) -> bool:
        return self.rate.requires_grad


@register("{name}")
class {cls}(PositionEncoding):
    """A bias computed from the keys (a data-dependent scheme, like CoPE or DAPE): each key's own
    decay rate softplus(w_h . k_j). It declares what it reads (`key_dependent`: plan() gets the
    projected keys k) so that the model hands them to it and the fast paths that need a fixed
    bias leave it alone."""

    family = "data-dependent bias"
    formula = "b = -softplus(w_h . k_j) * (i - j), w learned per head"
    shared_across_layers = False   # one per layer: it reads each layer's own keys
    adds_bias = True
    key_dependent = True

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int):
        super().__init__(n_heads, head_dim, d_model, train_length)
        self.w = nn.Parameter(torch.zeros(n_heads, head_dim))              # (H, D)

    def reset_parameters(self, generator: torch.Generator) -> None:
        with torch.no_grad():
            self.w.copy_(torch.randn(self.w.shape, generator=generator) / self.head_dim ** 0.5)

    def plan(self, q_len: int, k_len: int, q: Tensor | None = None, k: Tensor | None = None,
             x: Tensor | None = None) -> BiasPlan:
        if k is None:
            raise ValueError("{name} computes its bias from the keys: pass k")
        rate = nn.functional.softplus(torch.einsum("bhkd,hd->bhk", k, self.w))   # (B, H, k_len)
        return {cls}Plan(rate, q_len, k_len)
'''


def template(name: str, kind: str) -> str:
    """The file for variant `name` of `kind` (one of KINDS)."""
    cls = "".join(part.capitalize() for part in name.replace("-", "_").split("_")) or "MyScheme"
    body = {"bias": _BIAS, "rotary": _ROTARY, "data-dependent": _DATA}[kind]
    file = f"{name.replace('-', '_')}.py"
    return _HEADER.format(name=name, file=file) + "\n" + body.format(name=name, cls=cls)
