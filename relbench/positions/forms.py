"""Evaluation forms: a trained model's position scheme read differently at evaluation, without
retraining and without touching its weights (inference-time context extension).

A spec "VARIANT[:options]@FORM[:key=value,...]" names the trained variant and the form applied to it:

    rope@yarn:factor=16      YaRN on the `rope` run's checkpoint (positions/rope_forms.py)
    rope@pi                  position interpolation, factor = evaluation length / training length
    alibi@logn               log-length attention scaling, for every scheme (this module)
    xl@logidx:log_from=8     a clipped table read with log-scaled distances (positions/table_forms.py)

The part before "@" names a checkpoint: a trained variant ("rope"), or one fine-tuned at a longer
length by `relbench finetune` ("rope+ft1024", relbench/training/finetune.py), which keeps its variant's scheme.
A checkpoint fine-tuned under a form carries it in its name, with the options that follow the length
pinned at the fine-tuning length ("rope@pi:factor=4+ft1024": PI with s = 1024 / 256, as in Chen et
al. 2023), and is evaluated with that form at every length; it takes no second form.

A form is one class registered with `@register_form(name)`. It declares the schemes it applies to
by their class (`applies_to`: subclasses included), so a new rotary or table variant gets the forms
of its family; its keyword options, with their defaults, are its `__init__`'s. It changes nothing
itself: `apply` sets it on the model's encodings (`PositionEncoding.form`), and the encodings ask
it through three hooks, each the identity by default:

    logit_scale(enc, L)                     every scheme (PositionEncoding.prepare): the whole logit,
                                            q.k / sqrt(d) + bias, is multiplied by it
    frequencies(enc, inv_freq, L)           rotary schemes (Rotary.frequencies)
    distance_bias(enc, d, L), horizon(enc, L)   relative-bias schemes (RelativeBias.plan)

L is the length of the sequence being evaluated: the number of keys of the attention call (in
`relbench extrapolate`, the evaluation length; a shorter last window uses its own length).
"""

from __future__ import annotations

import copy
import math
import re
import zlib
from typing import Any

import torch
from torch import Tensor, nn

from relbench.errors import UsageError, one_line
from relbench.positions import base
from relbench.positions import spec as specs
from relbench.positions.base import PositionEncoding
from relbench.positions.form_base import Form

_FORMS: base.Registry = base.Registry("evaluation form")
_FORMS.base = Form


def register_form(name: str):
    """Class decorator: make a Form subclass available as `name` after "@" in a variant spec."""
    return _FORMS.register(name)


def form_names() -> list[str]:
    return _FORMS.names()


def unregister_form(name: str) -> None:
    _FORMS.unregister(name)


def get_form(name: str) -> type[Form]:
    return _FORMS.get(name)


def schemes_of(form: type[Form]) -> list[str]:
    """The registered variants `form` applies to."""
    return [n for n in base.names() if form.applies(base.get(n))]


# ---- specs ------------------------------------------------------------------------------------------
# the checkpoint of a fine-tuned spec: "rope+ft1024", or "rope@pi:factor=4+ft1024" (fine-tuned under a form)
FINETUNED = re.compile(r"^(?P<variant>[^@]+?)(?:@(?P<form>[^@]*))?\+ft(?P<length>[0-9]+)$")
_CHECKPOINT = re.compile(r"^(?P<checkpoint>[^@]+?(?:@[^@]*?)?\+ft[0-9]+)(?:@(?P<form>.*))?$")


def split_spec(spec: str) -> tuple[str, str]:
    """(checkpoint, evaluation form): ("rope:base=500", "yarn:factor=16") for
    "rope:base=500@yarn:factor=16", ("rope+ft1024", "yarn") for "rope+ft1024@yarn",
    ("rope@pi:factor=4+ft1024", "") for that checkpoint; the form part is "" for a plain variant."""
    text = spec.strip()
    match = _CHECKPOINT.match(text)
    if match:
        return match["checkpoint"].strip(), (match["form"] or "").strip()
    variant, _, form = text.partition("@")
    return variant.strip(), form.strip()


def trained_spec(spec: str) -> str:
    """The checkpoint a spec evaluates: "rope" for "rope@yarn:factor=16", "rope+ft1024" for
    "rope+ft1024@yarn" (the fine-tuned checkpoint)."""
    return split_spec(spec)[0]


def finetuned_spec(spec: str, length: int, enc: PositionEncoding | None = None) -> str:
    """The checkpoint of `spec` fine-tuned at `length` (relbench finetune): "rope+ft1024"; for a
    spec with a form, that form pinned at `length` for `enc`, the trained scheme (Form.pinned):
    "rope@pi" -> "rope@pi:factor=4+ft1024" when trained at 256."""
    form = parse_form(spec)
    if form is None:
        return f"{scheme_spec(spec)}+ft{length}"
    if enc is None:
        raise TypeError("finetuned_spec of a spec with a form needs the trained encoding to pin it")
    return f"{scheme_spec(spec)}@{form.pinned(enc, length).text()}+ft{length}"


def _finetuned(spec: str) -> re.Match | None:
    """The parts of the fine-tuned checkpoint `spec` evaluates (variant, form, length), or None."""
    return FINETUNED.match(trained_spec(spec))


def scheme_spec(spec: str) -> str:
    """The variant spec the model was built from: "rope" for "rope", "rope@pi", "rope+ft1024@yarn"
    and "rope@pi:factor=4+ft1024"."""
    match = _finetuned(spec)
    return match["variant"].strip() if match else trained_spec(spec)


def tuned_form(spec: str) -> str:
    """The form the checkpoint of `spec` was fine-tuned under: "pi:factor=4" for
    "rope@pi:factor=4+ft1024", "" for "rope+ft1024@yarn" and for "rope"."""
    match = _finetuned(spec)
    return (match["form"] or "").strip() if match else ""


def tuned_spec(spec: str) -> str:
    """What was fine-tuned for the checkpoint of `spec`: "rope@pi:factor=4" for
    "rope@pi:factor=4+ft1024", "rope" for "rope+ft1024@yarn" and for "rope"."""
    form = tuned_form(spec)
    return scheme_spec(spec) + (f"@{form}" if form else "")


def form_text(spec: str) -> str:
    """The form a spec is evaluated with, "" for none: the one after "@", or the one its checkpoint
    was fine-tuned under."""
    return split_spec(spec)[1] or tuned_form(spec)


def places_positions(spec: str) -> bool:
    """Whether `spec` is evaluated under a form that places its tokens elsewhere than 0 .. L - 1
    (`drawn`): training's criterion, checked at ordinary positions, does not speak for it, and the
    model is judged by its own accuracy at the training length (evaluation/reach.py)."""
    text = form_text(spec)
    return bool(text) and get_form(text.partition(":")[0].strip()).places


def finetune_length(spec: str) -> int | None:
    """The length the checkpoint of `spec` was fine-tuned at, or None for a checkpoint as trained."""
    match = _finetuned(spec)
    return int(match["length"]) if match else None


def replaced(form: Form, **options: Any) -> Form:
    """A copy of `form` with these options changed (for Form.pinned)."""
    copied = copy.copy(form)
    for name, value in options.items():
        setattr(copied, name, value)
    return copied


def parse_form(spec: str) -> Form | None:
    """The form a spec names, built from its options, or None for a plain variant. Every refusal is a
    UsageError of one line: an unknown variant, form or option, a bad value, two forms, or a form
    that does not apply to the variant's scheme."""
    evaluated, tuned, variant = split_spec(spec)[1], tuned_form(spec), scheme_spec(spec)
    trained = specs.parse(variant)    # the trained variant and its options are valid
    if evaluated and tuned:
        raise UsageError(f'"{one_line(spec)}" was fine-tuned under form "{one_line(tuned)}" and is evaluated with it; '
                         f'give no second form after "+ft{finetune_length(spec)}"')
    text = evaluated or tuned
    if not text and "@" not in spec:
        return None
    if "@" in text:
        raise UsageError(f'variant "{one_line(spec)}" names more than one evaluation form; give one after "@"')
    name, _, rest = text.partition(":")
    cls = get_form(name.strip())
    if not any(cls.applies(scheme) for scheme in trained.schemes):   # a layout: the layers it applies to
        fits = ", ".join(schemes_of(cls)) or "(none)"
        named = ", ".join(scheme.name for scheme in trained.schemes)
        raise UsageError(f'evaluation form "{cls.name}" does not apply to "{named}"; it applies to: {fits}')
    options = base.parse_options(rest, cls.options(), spec, f'of form "{cls.name}" in "{one_line(spec)}"',
                                 f'option of form "{cls.name}"')
    return cls(**options).for_variant(variant)


def apply(model: nn.Module, spec: str) -> Form | None:
    """Set the form `spec` names on every position encoding of `model` (a GPT loaded from the
    trained variant's checkpoint) and return it; a plain spec leaves the model as it is. The weights
    are not changed: the form only changes how the encodings read them."""
    form = parse_form(spec)
    for enc in model.positions:      # in a layout, the layers whose scheme the form applies to
        if form is not None and not form.applies(type(enc)):
            continue
        if form is not None:
            form.check(enc)
        enc.form = form
    return form


def check_spec(spec: str, **shape: Any) -> None:
    """Refuse, before any work, a form that cannot read the trained variant built with this model
    `shape` (n_heads, head_dim, d_model, train_length): e.g. a table form on a log-bucketed xl."""
    form = parse_form(spec)
    if form is not None:
        for layer in specs.parse(scheme_spec(spec)).pattern:
            if form.applies(layer.cls):
                form.check(layer.build(**shape))


def default_factor(factor: float, enc: PositionEncoding, length: int) -> float:
    """`factor` when given (> 0), else the evaluation length over the training length, at least 1."""
    if factor:
        return factor
    return max(1.0, length / enc.train_length)


def positive(name: str, value: float, form: str, allow_zero: bool = True) -> None:
    if value < 0 or (value == 0 and not allow_zero) or not math.isfinite(value):
        raise UsageError(f"{name}={value:g} of form \"{form}\" must be positive" + (" (0: the default)" if allow_zero else ""))


# ---- the form every scheme takes ---------------------------------------------------------------------
def logn_scale(length: int, train_length: int) -> float:
    """log(L) / log(L_train) when L > L_train, else 1 (the model's own attention at and below its
    training length)."""
    return math.log(length) / math.log(train_length) if length > train_length > 1 else 1.0


@register_form("logn")
class LogN(Form):
    """Log-length attention scaling: the logits are multiplied by log(L) / log(L_train) when the
    sequence is longer than training, so the attention entropy does not grow with the number of keys
    (Su 2021, "Entropy invariance and the scale of attention", kexue.fm/archives/8823; Chiang and
    Cholak 2022, "Overcoming a Theoretical Limitation of Self-Attention", scale by log n).

    Both sources scale the whole logit fed to the softmax, q.k / sqrt(d) (their models have no
    bias term); relbench scales the whole logit of every scheme, q.k / sqrt(d) + bias, so the form
    is the softmax temperature it is published as (a bias left unscaled would change the relative
    weight of content and position instead). For content-dependent schemes (shaw, transformer-xl)
    the query-dependent bias is scaled after it is computed, so u and v are scaled with the rest."""

    formula = "logits x log(L) / log(L_train) for L > L_train"

    def logit_scale(self, enc: PositionEncoding, length: int) -> float:
        return logn_scale(length, enc.train_length)


# ---- randomized positions at test time --------------------------------------------------------------
@register_form("drawn")
class Drawn(Form):
    """Each evaluated sequence's tokens placed at a sorted random subset of [0, limit), drawn as
    randomized-positions training draws them (VARIANT:random_positions=N, Ruoss et al. 2023), instead
    of at 0 .. L - 1: the test protocol of that method, whose official code draws at test time too.
    `limit` defaults to the N the variant was trained with; a variant trained at ordinary positions
    needs it given (drawn:limit=8192: an ordinary model read at drawn positions, the control).

    The draw of a sequence is seeded by `seed` and the sequence's own tokens, so a trial sits at the
    same positions whatever batch or process evaluates it. No sequence longer than `limit` can be
    placed: those lengths are skipped as unsupported, as a learned table's beyond its rows. A
    relative bias at drawn positions is a dense (B, H, L, L) plan, not a Toeplitz one."""

    formula = "positions: a sorted random subset of [0, N) per sequence (N = random_positions)"
    places = True

    def __init__(self, limit: int = 0, seed: int = 0):
        if limit < 0:
            raise UsageError(f"limit={limit} of form \"drawn\" must be positive (0: the variant's random_positions)")
        self.limit, self.seed = int(limit), int(seed)

    @classmethod
    def applies(cls, scheme: type[PositionEncoding]) -> bool:
        return scheme.takes_positions

    def for_variant(self, variant: str) -> Form:
        if self.limit:
            return self
        trained = specs.parse(variant).random_positions
        if not trained:
            raise UsageError(f'form "drawn" of "{one_line(variant)}": the variant was not trained with random_positions; '
                             f"give the range to draw from, drawn:limit=N")
        return replaced(self, limit=trained)

    def max_length(self, enc: PositionEncoding) -> int | None:
        own = enc.max_length
        return self.limit if own is None else min(own, self.limit)

    def placement(self, enc: PositionEncoding, tokens: Tensor) -> Tensor:
        length = tokens.shape[-1]
        if length > self.limit:
            raise base.UnsupportedLength(f'form "drawn" places at most {self.limit} tokens (positions drawn from '
                                         f"[0, {self.limit})); length {length} is beyond it")
        rows = []
        for row in tokens.detach().cpu():
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + zlib.crc32(row.numpy().tobytes()))
            rows.append(base.sorted_draw(generator, length, self.limit))
        return torch.stack(rows).to(tokens.device)
