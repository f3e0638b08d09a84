"""A variant spec, parsed once into a typed object that everything building or estimating a model reads.

    spec = positions.parse("rope:window=64*3,none")
    spec.layers(8)        # the pattern over the depth: rope with a 64-key window x3, none, twice
    spec.schemes          # the distinct scheme classes: (Rope, NoPosition)

Grammar (one string, readable in a table row):

    spec   := layer ("," layer)*               a pattern, repeated to the model's depth
    layer  := NAME [":" option ("," option)*] ["*" COUNT]
    option := KEY "=" VALUE                     the scheme's own, a layer option or a training option

A comma followed by a registered variant name (or NAME:...) starts the next layer; otherwise what
follows it is another option of the layer before. A layout counts at least one of its layers
("rope*1,none"): "rope,none" is two variants on the command line (`--variants xl,alibi`), so as one
spec it is refused rather than read two ways. "xl:k=64" is a spec of one layer: the scheme on
every layer, as relbench has always built it.

Layer options, for every scheme (they change the layer's attention, not the scheme):
- `window=W`: sliding-window attention, each query sees its W latest keys (itself included), as
  transformers' sliding-window mask does (kv_idx > q_idx - sliding_window); 0: every earlier key.
- `chunk=C`: chunked attention, each query sees only the keys of its own chunk of C positions
  ([nC, (n + 1)C)), Llama 4's local attention on its RoPE layers (transformers masking_utils.py
  `chunked_overlay`: kv_idx // chunk_size == q_idx // chunk_size; configuration_llama4.py
  `attention_chunk_size` 8192); 0: no chunks.
- `sinks=true`: a learned sink logit per head (gpt-oss, transformers models/gpt_oss/modeling_gpt_oss.py
  `sinks`): an extra key that takes probability mass and returns nothing.
- `temperature=llama4|logn`: the queries times a factor of their position p. llama4 is Llama 4's
  attention temperature tuning on its NoPE layers (transformers models/llama4/modeling_llama4.py:
  log(floor((p + 1) / floor_scale) + 1) * attn_scale + 1; configuration_llama4.py: floor_scale 8192,
  its attention_chunk_size, attn_scale 0.1), with `temperature_floor` (0: the training length, the
  chunk relbench's models are trained at) and `temperature_scale`; logn is the `@logn` form's factor
  (positions/forms.py: logn_scale) read per query position, log(p + 1) / log(L_train) beyond training.
- `ssmax=true` (Scalable-Softmax) and `ssmax_bias=false`: see relbench/model.py.
Training options, for the whole model (a layout may give them on any layer, once):
`position_lr_scale` and `random_positions` (training/step.py, training/batches.py).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any

from relbench.errors import UsageError, one_line
from relbench.positions.base import PositionEncoding, build, get, names
from relbench.positions.registry import parse_options


def _option(name: str, default: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)


TEMPERATURES = ("none", "llama4", "logn")
LAYER_OPTIONS = {"window": _option("window", 0), "chunk": _option("chunk", 0), "sinks": _option("sinks", False),
                 "temperature": _option("temperature", "none"), "temperature_floor": _option("temperature_floor", 0),
                 "temperature_scale": _option("temperature_scale", 0.1),
                 "ssmax": _option("ssmax", False), "ssmax_bias": _option("ssmax_bias", True)}
MODEL_OPTIONS = {"position_lr_scale": _option("position_lr_scale", 1.0),
                 "random_positions": _option("random_positions", 0)}
# what `training_options` returns: the options that are not the scheme's own, as before layouts
TRAINING_OPTIONS = {**MODEL_OPTIONS, "ssmax": LAYER_OPTIONS["ssmax"], "ssmax_bias": LAYER_OPTIONS["ssmax_bias"]}
_REPEAT = re.compile(r"^(?P<body>.*?)\s*\*\s*(?P<count>\d+)\s*$", re.S)


@dataclasses.dataclass(frozen=True, eq=False)
class Layer:
    """One layer of a spec: its scheme, the scheme's own options, and the layer options."""
    text: str                       # the layer as written, without its repeat count
    scheme: str
    options: dict[str, Any]         # the scheme's own (read-only by convention: copy before changing)
    window: int = 0
    chunk: int = 0
    sinks: bool = False
    temperature: str = "none"
    temperature_floor: int = 0
    temperature_scale: float = 0.1
    ssmax: bool = False
    ssmax_bias: bool = True

    @property
    def cls(self) -> type[PositionEncoding]:
        return get(self.scheme)

    @property
    def key(self) -> str:
        """What two layers must share to share one instance of a scheme that shares across layers."""
        return self.scheme + repr(sorted(self.options.items()))

    def build(self, **shape: Any) -> PositionEncoding:
        return build(self.scheme, **shape, **self.options)


@dataclasses.dataclass(frozen=True, eq=False)
class Spec:
    """A parsed variant spec: the layer pattern and the model-wide training options."""
    text: str
    pattern: tuple[Layer, ...]
    position_lr_scale: float | None = None
    random_positions: int = 0

    @property
    def is_layout(self) -> bool:
        """More than one kind of layer: a scheme (or layer options) per layer."""
        return len({layer.text for layer in self.pattern}) > 1

    @property
    def schemes(self) -> tuple[type[PositionEncoding], ...]:
        """The distinct scheme classes of the pattern, in order of first appearance."""
        return tuple(dict.fromkeys(layer.cls for layer in self.pattern))

    @property
    def scale_keys(self) -> tuple[str, ...]:
        """The keys under which a run's `position_lr_scales` table (a sweep's choice, per variant) holds
        this variant's rate, most specific first: the spec itself, then its scheme's name (a layout's
        layers have no one scheme: the spec only)."""
        return (self.text,) if self.is_layout else (self.text, self.pattern[0].scheme)

    def layers(self, n_layers: int) -> tuple[Layer, ...]:
        """The layer of each of `n_layers` blocks: the pattern repeated; a depth the pattern does not
        divide is refused (a repeating layout that stops midway is not the stack it names)."""
        if n_layers % len(self.pattern):
            raise UsageError(f'layout "{one_line(self.text)}" repeats a pattern of {len(self.pattern)} layers; the model '
                             f"has {n_layers}: use a multiple of {len(self.pattern)} layers (--n-layers, or a preset "
                             f"that has them)")
        return self.pattern * (n_layers // len(self.pattern))

    def single(self) -> Layer:
        """The layer of a spec that is one scheme on every layer (what a single-scheme caller reads)."""
        if self.is_layout:
            raise UsageError(f'"{one_line(self.text)}" is a layout (a scheme per layer); this needs one scheme')
        return self.pattern[0]


def _tokens(text: str) -> list[list[str]]:
    """The comma-separated items of `text`, grouped by layer: an item opens a layer when it has a ":"
    or names a registered variant (after any "*COUNT"); any other item is an option of the layer before."""
    groups: list[list[str]] = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        head = repeat["body"] if (repeat := _REPEAT.match(item)) else item
        opens = ":" in head or ("=" not in head and head in names())
        if opens or not groups:
            groups.append([item])
        else:
            groups[-1].append(item)
    return groups


def _layer(group: list[str], spec: str) -> tuple[Layer, int, dict[str, Any]]:
    """A layer, its repeat count and the model options it gives."""
    joined = ",".join(group)
    repeat = _REPEAT.match(group[-1])
    count = 1
    if repeat:
        count = int(repeat["count"])
        joined = ",".join(group[:-1] + [repeat["body"]])
        if count < 1:
            raise UsageError(f'"*{count}" in variant "{one_line(spec)}" repeats a layer no times; give 1 or more')
    name, _, rest = joined.strip().partition(":")
    cls = get(name.strip())
    allowed = {**cls.options(), **LAYER_OPTIONS, **MODEL_OPTIONS}
    options = parse_options(rest, allowed, spec, f'in variant "{spec}"', f'option of "{name.strip()}"')
    own = {k: v for k, v in options.items() if k in cls.options()}
    layered = {k: v for k, v in options.items() if k in LAYER_OPTIONS}
    model = {k: v for k, v in options.items() if k in MODEL_OPTIONS}
    layer = Layer(joined.strip(), name.strip(), own, **layered)
    _check_layer(layer, cls, spec, layered)
    return layer, count, model


def _check_layer(layer: Layer, cls: type[PositionEncoding], spec: str, given: dict[str, Any]) -> None:
    where = f'in variant "{one_line(spec)}"'
    if layer.window < 0:
        raise UsageError(f"window={layer.window} {where}: give the number of keys each query sees (0: all of them)")
    if layer.chunk < 0:
        raise UsageError(f"chunk={layer.chunk} {where}: give the positions per chunk (0: no chunks)")
    if (layer.window or layer.sinks or layer.chunk) and cls.replaces_softmax:
        raise UsageError(f'window, chunk and sinks {where} change softmax attention; "{cls.name}" computes its own '
                         f'attention')
    if layer.temperature not in TEMPERATURES:
        raise UsageError(f"temperature={layer.temperature} {where}: use {', '.join(TEMPERATURES)}")
    if ("temperature_floor" in given or "temperature_scale" in given) and layer.temperature != "llama4":
        raise UsageError(f"temperature_floor and temperature_scale {where} set Llama 4's temperature: add temperature=llama4")
    if layer.temperature_floor < 0 or layer.temperature_scale < 0:
        raise UsageError(f"temperature_floor and temperature_scale {where} cannot be negative")
    if "ssmax_bias" in given and not layer.ssmax:
        raise UsageError(f"ssmax_bias {where} says what Scalable-Softmax scales: add ssmax=true")


def _model_options(given: list[dict[str, Any]], pattern: tuple[Layer, ...], spec: str) -> dict[str, Any]:
    """The model-wide options the layers give: each at most one value, and in range."""
    merged: dict[str, Any] = {}
    for options in given:
        for key, value in options.items():
            if merged.setdefault(key, value) != value:
                raise UsageError(f'{key} in variant "{one_line(spec)}" applies to the whole model: give it once')
    where = f'in variant "{one_line(spec)}"'
    if "position_lr_scale" in merged and not merged["position_lr_scale"] > 0:
        raise UsageError(f"position_lr_scale {where} must be positive")
    drawn = merged.get("random_positions", 0)
    if drawn < 0:
        raise UsageError(f"random_positions {where} must be 0 (off) or the number of positions N to draw from, got {drawn}")
    # a layer without a position representation (none) has nothing to place and reads no positions;
    # every other layer must take them, and at least one layer must
    unplaced = [layer.cls for layer in pattern if not layer.cls.takes_positions and layer.cls.family != "none"]
    unplaced = unplaced or ([pattern[0].cls] if not any(layer.cls.takes_positions for layer in pattern) else [])
    if drawn and unplaced:
        cls = unplaced[0]
        raise UsageError(f'random_positions {where}: "{cls.name}" cannot place its tokens at chosen positions '
                         f"({cls.family or 'no position'} scheme); the schemes that can: "
                         f"{', '.join(n for n in names() if get(n).takes_positions)}")
    return merged


def parse(text: str) -> Spec:
    """The typed spec of `text`; every refusal is one UsageError line (an unknown variant or option, a
    bad value, an evaluation form where a trained variant is needed, a model option given twice)."""
    if "@" in text:    # "rope@yarn:factor=16": a form of a trained variant, for `extrapolate` (positions/forms.py)
        trained = text.partition("@")[0].strip()
        raise UsageError(f'"{one_line(text)}" is an evaluation form of "{one_line(trained)}": train "{one_line(trained)}" '
                         f"and give the form to `relbench extrapolate --variants`")
    groups = _tokens(text)
    if not groups:
        raise UsageError('an empty variant "" names no scheme; give a variant name (relbench variants lists them)')
    if len(groups) > 1 and not any(_REPEAT.match(group[-1]) for group in groups):
        layers = ",".join(groups[0]) + "*1," + ",".join(",".join(group) for group in groups[1:])
        raise UsageError(f'"{one_line(text)}" names {len(groups)} variants; a layout (a scheme per layer) counts its '
                         f'layers, e.g. "{one_line(layers)}", and --variants takes the variants one by one')
    parsed = [_layer(group, text) for group in groups]
    pattern = tuple(layer for layer, count, _ in parsed for _ in range(count))
    model = _model_options([options for _, _, options in parsed], pattern, text)
    return Spec(text.strip(), pattern, model.get("position_lr_scale"), int(model.get("random_positions", 0)))


# ---- the single-scheme view, for callers that need one scheme -----------------------------------------
def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """The name and the scheme's own typed options of a one-scheme spec "name[:key=value,...]"."""
    layer = parse(spec).single()
    return layer.scheme, dict(layer.options)


def training_options(spec: str) -> dict[str, Any]:
    """The training options a one-scheme spec sets, e.g. {"position_lr_scale": 10.0} for "xl:position_lr_scale=10"."""
    parsed = parse(spec)
    layer = parsed.single()
    found = {"ssmax": layer.ssmax, "ssmax_bias": layer.ssmax_bias, "position_lr_scale": parsed.position_lr_scale,
             "random_positions": parsed.random_positions}
    return {k: v for k, v in found.items() if v != TRAINING_OPTIONS[k].default and v is not None}


def build_spec(spec: str, **shape: Any) -> PositionEncoding:
    """Build the scheme of a one-scheme spec such as "t5:bidirectional=true"."""
    return parse(spec).single().build(**shape)


def scheme(spec: str) -> type[PositionEncoding]:
    """The class a one-scheme spec names ("xl:k=64" -> the `xl` class): its declared capabilities
    (adds_bias, rotates, has_horizon, ...) hold whatever the options."""
    return parse(spec).single().cls
