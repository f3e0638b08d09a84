"""The position-encoding interface every variant implements, and the registry that names them (a
variant spec is parsed in positions/spec.py, the evaluation-form base is positions/form_base.py).

A variant is one `PositionEncoding` subclass decorated with `@register("name")`. The model only
talks to this interface; nothing outside `positions/` branches on a variant's name.

Shapes: queries are the LAST `q_len` of `k_len` positions, so a chunk of queries at the end of a
longer context (chunked evaluation, decoding) uses the same code as a full square attention.
"""

from __future__ import annotations

import abc
import inspect
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from relbench.errors import UsageError, unknown
from relbench.positions.plan import BiasPlan, DensePlan, DistancePlan
from relbench.positions.registry import Registry, convert_option, parse_options  # noqa: F401 (re-exported)

_REGISTRY: Registry = Registry("position variant")


class PositionEncoding(nn.Module):
    """Base class: no position information at all. Subclasses override what their scheme needs."""

    name: ClassVar[str] = ""
    family: ClassVar[str] = ""               # "none", "absolute", "rotary", "relative bias", "relative vector"
    formula: ClassVar[str] = ""              # one line, shown by `relbench variants`
    shared_across_layers: ClassVar[bool] = True   # one instance serves every layer (T5, ALiBi, absolute)
    relative: ClassVar[bool] = False         # attention depends on positions only through i - j

    # ---- capabilities: facts about the scheme, declared per class, that backends and commands read
    # without building anything. tests/test_positions.py checks every registered variant against
    # what its plan and rotation really do.
    adds_bias: ClassVar[bool] = False        # plan() returns a BiasPlan: a term added to the logits
    rotates: ClassVar[bool] = False          # rotate() transforms q and k (RoPE, xPos, transformer-xl's u)
    content_dependent: ClassVar[bool] = False  # the bias depends on the queries: plan() needs q (Shaw)
    key_dependent: ClassVar[bool] = False    # the bias depends on the keys: plan() needs k (CoPE, DAPE)
    input_dependent: ClassVar[bool] = False  # the bias depends on the layer's input: plan() needs x (FoX)
    distance_only: ClassVar[bool] = False    # the bias is a function of i - j alone (a Toeplitz matrix)
    has_horizon: ClassVar[bool] = False      # beyond some distance the bias is constant along a query row
    linear: ClassVar[bool] = False           # the causal bias is exactly -slope_h * (i - j) (ALiBi)
    separable: ClassVar[bool] = False        # the causal bias is r(i) + c(j), c not constant (ALiBi, FoX)
    has_score_mod: ClassVar[bool] = False    # the plan can be written as a FlexAttention score_mod
    replaces_softmax: ClassVar[bool] = False  # attend() computes the attention itself (stick-breaking)
    qk_width: ClassVar[int] = 1              # rotate() returns q and k with this many times the channels (PoPE: 2)
    takes_positions: ClassVar[bool] = False  # embed/rotate/plan take `positions=` (B, L), any sorted integers:
    #                                          randomized positions in training (VARIANT:random_positions=N)

    # an evaluation form (positions/forms.py: YaRN, log-n scaling, ...) set on a trained model's
    # encodings by `forms.apply`; None: the scheme as trained. It holds no weights.
    form: Any = None    # a positions.form_base.Form (imported there: it reads this module), or None

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = head_dim
        self.d_model = d_model
        self.train_length = train_length

    # ---- what the model asks of a position scheme -------------------------------------------------
    @property
    def max_length(self) -> int | None:
        """Longest sequence the scheme can represent, or None when any length works."""
        return None

    def embed(self, length: int, positions: Tensor | None = None) -> Tensor | None:
        """(length, d_model) absolute embeddings added to the token embeddings, or None. A scheme
        that declares `takes_positions` also takes `positions=` (B, length) and returns (B, length,
        d_model): the embeddings at those positions."""
        return None

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Position-dependent transform of q (B, H, Lq, D) and k (B, H, Lk, D) for the content term
        q.k; identity here. Schemes that override it declare `rotates`; with `takes_positions` they
        also take `positions=` (B, Lk), the keys' positions (the queries are the last Lq of them)."""
        return q, k

    def plan(self, q_len: int, k_len: int, q: Tensor | None = None, k: Tensor | None = None,
             x: Tensor | None = None, positions: Tensor | None = None) -> BiasPlan | None:
        """The additive logits bias for q_len queries over k_len keys, as a BiasPlan (see
        positions/plan.py), or None when the scheme adds no bias. `q` (B, H, q_len, D) and `k`
        (B, H, k_len, D) are the queries and keys as projected, BEFORE `rotate`; `x` (B, k_len,
        d_model) is the attention layer's input at the key positions (after its LayerNorm). A scheme
        reads only what it declares (`content_dependent`: q, `key_dependent`: k, `input_dependent`:
        x); the others ignore them, so that one plan can serve every layer that shares the scheme.
        A scheme that declares `takes_positions` also takes `positions=` (B, k_len): the keys'
        positions, any increasing integers, instead of 0 .. k_len - 1 (a DensePlan per sequence)."""
        return None

    def prepare(self, q: Tensor, k: Tensor, plan: BiasPlan | None = None, x: Tensor | None = None,
                positions: Tensor | None = None) -> tuple[Tensor, Tensor, BiasPlan | None]:
        """Everything attention needs from the scheme, in the one order every caller uses: the plan
        from the projected queries and keys and the layer input `x` (unless the caller passes one it
        built for several layers), then the rotation of q and k. `positions` (B, k_len): the keys'
        positions when they are not 0 .. k_len - 1 (randomized positions; `takes_positions` schemes
        only). Returns (q, k, plan) for `attention.attention`."""
        given = self.placed(positions)
        if plan is None and self.adds_bias:
            if self.input_dependent and x is None:
                raise UsageError(f'"{self.name}" computes its bias from the layer input: pass x to prepare()')
            plan = self.plan(q.shape[-2], k.shape[-2], q, k, x, **given)
        q, k = self.rotate(q, k, **given)
        scale = 1.0 if self.form is None else self.form.logit_scale(self, k.shape[-2])
        if scale != 1.0:   # a form's temperature: the whole logit, q.k / sqrt(d) + bias, times scale
            q = q * scale
            plan = None if plan is None else plan.scaled(scale)
        return q, k, plan

    def placed(self, positions: Tensor | None) -> dict[str, Tensor]:
        """The keyword arguments that hand `positions` to embed/rotate/plan ({} for ordinary ones), or
        a UsageError when given positions reach a scheme that does not declare `takes_positions`."""
        if positions is None or self.family == "none":   # none has nothing to place (a layout's NoPE layer)
            return {}
        if not self.takes_positions:
            raise UsageError(f'"{self.name}" cannot place its tokens at given positions (it does not declare takes_positions)')
        return {"positions": positions}

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor | None:
        """The attention output (B, H, Lq, D) of a scheme that replaces softmax attention (declares
        `replaces_softmax`), from q and k as `prepare` returns them; None here: softmax attention, with
        the plan's bias, on the backend the model chose."""
        return None

    def attention_weights(self, q: Tensor, k: Tensor) -> Tensor | None:
        """(B, H, Lq, Lk) weights of a scheme that replaces softmax attention, for `relbench inspect`;
        None here: the softmax of the logits and the plan's bias."""
        return None

    def reset_parameters(self, generator: torch.Generator) -> None:
        """Initialise the scheme's own parameters from `generator` (deterministic per seed)."""

    def project_parameters(self) -> None:
        """Put constrained parameters back into their allowed set, in place (KERPLE's positivity).
        Training calls it after every optimiser step; nothing to do for most schemes."""

    # ---- helpers ----------------------------------------------------------------------------------
    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def check_length(self, length: int) -> None:
        if self.max_length is not None and length > self.max_length:
            raise UnsupportedLength(
                f'"{self.name}" represents positions below {self.max_length} only; length {length} is beyond it')

    @classmethod
    def layers_share(cls, options: dict[str, Any]) -> bool:
        """Whether one instance built with `options` serves every layer; the class's declaration unless
        an option decides it (bam's `shared`)."""
        return cls.shared_across_layers

    @classmethod
    def options(cls) -> dict[str, inspect.Parameter]:
        """The variant's own keyword options (beyond the shared shape arguments), with defaults."""
        shared = {"self", "n_heads", "head_dim", "d_model", "train_length"}
        return {n: p for n, p in inspect.signature(cls.__init__).parameters.items() if n not in shared}

    def extra_repr(self) -> str:
        return f"heads={self.n_heads}"


_REGISTRY.base = PositionEncoding


class UnsupportedLength(UsageError):
    """The scheme has no representation for a length (learned absolute embeddings past training)."""


class RelativeBias(PositionEncoding, abc.ABC):
    """A bias that is a function of the distance i - j (query position minus key position) alone.

    Subclasses implement `distance_bias`; the plan evaluates it once per distance (O(L), not
    O(L^2)), and says from which distance on the bias is constant (`horizon`), if it ever is."""

    family = "relative bias"
    relative = True
    adds_bias = True
    distance_only = True
    has_score_mod = True

    @abc.abstractmethod
    def distance_bias(self, distance: Tensor) -> Tensor:
        """(H, *distance.shape) bias for integer distances i - j (>= 0 for past keys)."""

    def horizon(self) -> int | None:
        """Smallest distance d >= 0 such that the bias is the same for every distance >= d, or None."""
        return None

    def linear_slopes(self) -> Tensor | None:
        """(H,) slopes when the causal bias is exactly -slope * (i - j), else None."""
        return None

    takes_positions = True

    def plan(self, q_len: int, k_len: int, q: Tensor | None = None, k: Tensor | None = None,
             x: Tensor | None = None, positions: Tensor | None = None) -> DistancePlan | DensePlan:
        if positions is not None:   # p_i - p_j per sequence: no longer Toeplitz, one (B, H, q, k) tensor
            distances = positions[:, k_len - q_len:, None] - positions[:, None, :]      # (B, q_len, k_len)
            return DensePlan(self.distance_bias(distances).movedim(0, 1), q_len, k_len)
        distances = DistancePlan.distances(q_len, k_len, self.device)
        if self.form is None:
            values, horizon = self.distance_bias(distances), self.horizon()
        else:   # an evaluation form may read the trained table differently at this length
            values, horizon = self.form.distance_bias(self, distances, k_len), self.form.horizon(self, k_len)
        values = values.expand(self.n_heads, -1)                             # (H, q_len + k_len - 1)
        return DistancePlan(values, q_len, k_len, horizon, self.linear_slopes())

    @property
    def device(self) -> torch.device:
        for tensor in list(self.parameters()) + list(self.buffers()):
            return tensor.device
        return torch.device("cpu")


def table_rows(table: Tensor, index: Tensor) -> Tensor:
    """table[index] (index.shape + table.shape[1:]) for a learned table read at integer rows. An index
    of more than one dimension (randomized positions' (B, q, k) distances) is read through index_select,
    whose gradient sums the rows in a fixed order: the gradient of table[index] scatter-adds from
    several threads and differs from run to run in its last bits (a resumed training would not end
    with the weights of an uninterrupted one)."""
    if index.dim() <= 1:
        return table[index]
    return table.index_select(0, index.reshape(-1)).view(*index.shape, *table.shape[1:])


def register(name: str):
    """Class decorator: make a PositionEncoding subclass available as `name`."""
    return _REGISTRY.register(name)


def names() -> list[str]:
    """Sorted names of every registered variant."""
    return _REGISTRY.names()


def unregister(name: str) -> None:
    """Forget variant `name` (see Registry.unregister)."""
    _REGISTRY.unregister(name)


def get(name: str) -> type[PositionEncoding]:
    """The class registered as `name`; an unknown name raises a UsageError listing the names."""
    return _REGISTRY.get(name)


def build(name: str, n_heads: int = 8, head_dim: int = 64, d_model: int | None = None,
          train_length: int = 256, **options: Any) -> PositionEncoding:
    """Construct variant `name` for a model of this shape, with the variant's own `options`."""
    cls = get(name)
    allowed = cls.options()
    for key in options:
        if key not in allowed:
            raise unknown(f'option of "{name}"', key, sorted(allowed) or ["(none)"])
    d_model = n_heads * head_dim if d_model is None else d_model
    return cls(n_heads=n_heads, head_dim=head_dim, d_model=d_model, train_length=train_length, **options)


# ---- randomized positions -----------------------------------------------------------------------------
def sorted_draw(generator: torch.Generator, length: int, limit: int) -> Tensor:
    """(length,) int64: a sorted random subset of [0, limit) drawn without replacement, the positions
    of one sequence under randomized positions (training; the `drawn` evaluation form)."""
    return torch.randperm(limit, generator=generator)[:length].sort().values
