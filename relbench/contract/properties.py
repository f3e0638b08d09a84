"""The contract's properties, one function each: what the fast attention paths, the model and the
commands rely on a scheme to keep. Each returns a Finding: passed (or None where it does not
apply), the measured evidence in one line, and the fix where one can be named. `run` runs them in
order; `relbench check` prints the table.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from relbench import positions
from relbench.attention import attention, check, recording, resolve
from relbench.contract.measurement import CAPABILITIES, D, H, layer_input, measure, perturbed, queries
from relbench.errors import UsageError
from relbench.model import GPT, ModelConfig
from relbench.positions.base import PositionEncoding, UnsupportedLength

CAUSAL_TOLERANCE = 1e-5
BACKEND_TOLERANCE = 1e-5


@dataclass(frozen=True)
class Finding:
    prop: str                 # the property's name
    passed: bool | None       # None: does not apply to this scheme
    evidence: str             # what was measured
    fix: str = ""             # what to change, when it failed and a fix can be named


# ---- the properties -------------------------------------------------------------------------------
def logits(enc: PositionEncoding, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Full pre-softmax logits (B, H, Lq, Lk) the attention would see, queries the last Lq of Lk."""
    q, k, plan = enc.prepare(q, k, x=layer_input(enc, q.shape[0], k.shape[-2]))
    out = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return out if plan is None else out + plan.full()


def tiny_gpt(spec: str, seed: int = 0, train_length: int = 16) -> GPT:
    return GPT(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, train_length=train_length,
                           position=spec), seed=seed)


def prop_shapes(spec: str) -> Finding:
    enc = perturbed(spec)
    q = queries(3, 4)
    k = torch.randn(2, H, 7, D, generator=torch.Generator().manual_seed(5))
    plan = enc.plan(3, 7, q, k, layer_input(enc, 2, 7, 105))
    if (plan is not None) != enc.adds_bias:
        return Finding("shapes", False, f"plan() returned {'a bias' if plan is not None else 'None'} with "
                       f"adds_bias={enc.adds_bias}", "declare adds_bias = True exactly when plan() returns a BiasPlan")
    q_rot, k_rot = enc.rotate(q, k)
    widened = enc.qk_width * q.shape[-1]           # PoPE's complex channels: q and k twice as wide
    if q_rot.shape != (*q.shape[:-1], widened) or k_rot.shape != (*k.shape[:-1], widened):
        return Finding("shapes", False, f"rotate() changed shapes {tuple(q.shape)} -> {tuple(q_rot.shape)} "
                       f"(qk_width={enc.qk_width})", "declare qk_width = the factor rotate() widens q and k by")
    pieces = [f"rotate keeps {tuple(q.shape)}" if enc.qk_width == 1 else f"rotate widens to {tuple(q_rot.shape)}"]
    if plan is not None:
        bias = plan.full()
        if bias.shape not in ((H, 3, 7), (2, H, 3, 7)):
            return Finding("shapes", False, f"bias of 3 queries over 7 keys has shape {tuple(bias.shape)}, "
                           f"not ({H}, 3, 7) or (B, {H}, 3, 7)", "return (H, q_len, k_len) or (B, H, q_len, k_len)")
        if not bias.isfinite().all():
            return Finding("shapes", False, "the bias holds inf or nan on some pair",
                           "keep the bias finite; the causal mask is the attention's job")
        pieces.insert(0, f"bias {tuple(bias.shape)} for 3 queries over 7 keys, finite")
    embedded = enc.embed(7)
    if embedded is not None and tuple(embedded.shape) != (7, enc.d_model):
        return Finding("shapes", False, f"embed(7) has shape {tuple(embedded.shape)}, not (7, {enc.d_model})")
    return Finding("shapes", True, "; ".join(pieces))


def prop_suffix(spec: str) -> Finding:
    enc = perturbed(spec)
    if not enc.adds_bias:
        return Finding("queries as suffix", None, "adds no bias")
    q = queries(9, 4)
    k = torch.randn(2, H, 9, D, generator=torch.Generator().manual_seed(5))
    x = layer_input(enc, 2, 9, 105)
    full, part = enc.plan(9, 9, q, k, x).full(), enc.plan(4, 9, q[..., 5:, :], k, x).full()
    gap = float((part - full[..., 5:, :]).abs().max().detach())
    return Finding("queries as suffix", gap <= 1e-5, f"bias of the last 4 of 9 queries vs rows 5-8 of the square: "
                   f"max difference {gap:.1e}", "" if gap <= 1e-5 else
                   "queries are the LAST q_len of k_len positions: offset query positions by k_len - q_len")


def prop_causal(spec: str) -> Finding:
    model = tiny_gpt(spec).eval()
    length, t = 24, 12
    if model.max_length is not None:
        length, t = min(length, model.max_length), min(t, model.max_length // 2)
    tokens = torch.randint(0, 64, (2, length), generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[:, t:] = torch.randint(0, 64, (2, length - t), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    leak = float((a[:, :t] - b[:, :t]).abs().max())
    ok = leak <= CAUSAL_TOLERANCE
    return Finding("causal inside a GPT", ok, f"max change of past logits from future tokens {leak:.1e} at L={length}",
                   "" if ok else "a query may read only keys at or before it: mask or ignore j > i in the bias, "
                                 "and compute data-dependent terms from past positions only")


def prop_translation(spec: str) -> Finding:
    cls = positions.scheme(spec)
    if not (cls.relative or cls.distance_only):
        return Finding("translation invariance", None, "neither relative nor distance_only is declared")
    enc = perturbed(spec)
    g = torch.Generator().manual_seed(3)
    n, shift = 6, 40
    q = torch.randn(1, H, n, D, generator=g)
    k = torch.randn(1, H, n, D, generator=g)
    base = logits(enc, q, k)
    k_far = torch.cat([torch.randn(1, H, shift, D, generator=g), k], dim=2)
    shifted = logits(enc, q, k_far)[..., shift:]
    gap = float((shifted - base).abs().max().detach())
    ok = gap <= 1e-4
    declared = "relative" if cls.relative else "distance_only"
    return Finding("translation invariance", ok, f"logits of the same pairs {shift} positions later: max difference "
                   f"{gap:.1e} ({declared} declared)", "" if ok else
                   f"the scheme reads absolute positions: compute it from i - j only, or declare {declared} = False")


def prop_capability(spec: str, capability: str) -> Finding:
    declared = bool(getattr(positions.scheme(spec), capability))
    facts, _ = measure(spec)
    measured = facts[capability]
    ok = declared == measured
    fix = "" if ok else (f"declare {capability} = {measured}" if capability != "has_score_mod" else
                         "has_score_mod must match the plan's has_score_mod")
    return Finding(capability, ok, f"declared {declared}, behaves {measured}", fix)


def prop_plan_extras(spec: str) -> Finding:
    facts, problems = measure(spec)
    if not facts["adds_bias"]:
        return Finding("plan extras", None, "adds no bias")
    return Finding("plan extras", not problems, "; ".join(problems) or
                   "horizon, tail, linear slopes, separable key terms and score_mod agree with the bias",
                   "" if not problems else "make the plan's declarations describe its own bias")


def prop_lengths(spec: str) -> Finding:
    model = tiny_gpt(spec).eval()
    tokens = torch.randint(0, 64, (1, 4 * 16), generator=torch.Generator().manual_seed(0))
    if model.max_length is not None:
        try:
            with torch.no_grad():
                model(tokens)
        except UnsupportedLength:
            return Finding("lengths beyond training", True, f"represents positions below {model.max_length} only, "
                           f"and refuses {4 * 16} with UnsupportedLength")
        return Finding("lengths beyond training", False, f"max_length {model.max_length}, yet length 64 ran",
                       "raise UnsupportedLength (check_length) beyond max_length")
    with torch.no_grad():
        out = model(tokens)
    ok = bool(out.isfinite().all())
    return Finding("lengths beyond training", ok, "finite logits at 4x the training length (64 of 16)" if ok else
                   "inf or nan in the logits at 4x the training length",
                   "" if ok else "keep every term finite at any distance (clamp, log-space)")


def prop_gradients(spec: str) -> Finding:
    model = tiny_gpt(spec)
    params = dict(model.positions.named_parameters())
    if not params:
        return Finding("gradients", None, "no parameters")
    with torch.no_grad():   # off the initial values, so every parameter has a visible effect
        for p in model.positions.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)) * 0.5)
    model.project_parameters()
    tokens = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(0))
    F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
    dead = [n for n, p in params.items() if p.requires_grad and (p.grad is None or not p.grad.abs().sum() > 0)]
    ok = not dead
    return Finding("gradients", ok, f"{len(params) - len(dead)} of {len(params)} parameter tensors get a gradient"
                   + (f"; none: {', '.join(dead)}" if dead else ""),
                   "" if ok else "every parameter must reach the loss (or be a buffer, or requires_grad=False)")


def _backend_lengths(enc: PositionEncoding) -> list[tuple[int, int]]:
    """A square and a rectangle, and a square long enough for the split path to split: past the
    plan's horizon by more than its 32-row near band."""
    horizon = None
    if enc.adds_bias:
        q = queries(64, 0, batch=1)
        k = torch.randn(1, H, 64, D, generator=torch.Generator().manual_seed(1))
        horizon = enc.plan(64, 64, q, k, layer_input(enc, 1, 64)).horizon
    return [(37, 37), (9, 37), (min(2304, max(150, (horizon or 0) + 64)),) * 2]


@torch.no_grad()
def prop_backend(spec: str, backend: str) -> Finding:
    """Inference through `backend` against the reference path, at sizes where that path really runs."""
    cls = positions.scheme(spec)
    try:
        check(backend, cls, "cpu", training=False)
    except UsageError as error:
        return Finding(f"backend {backend}", None, f"not claimed ({error})")
    enc = perturbed(spec)
    worst, ran = 0.0, set()
    for q_len, k_len in _backend_lengths(enc):
        g = torch.Generator().manual_seed(q_len * 7 + k_len)
        q, k, v = (torch.randn(1, H, n, D, generator=g) for n in (q_len, k_len, k_len))
        q, k, plan = enc.prepare(q, k, x=layer_input(enc, 1, k_len, 7))
        ref = attention(q, k, v, plan, "reference")
        with recording() as taken:
            out = attention(q, k, v, plan, backend)
        ran |= set(taken)
        expected = resolve(backend, plan, q, k_len, grad=False)
        if set(taken) != {expected}:
            return Finding(f"backend {backend}", False, f"resolve names {expected}, {'+'.join(taken)} ran")
        worst = max(worst, float((out - ref).abs().max()))
    # FoX's running sums of log f reach -200 at these lengths: every fp32 path, the reference
    # included, is 1e-5 from float64 there, so two paths may differ by twice that
    ok = worst <= BACKEND_TOLERANCE * (3 if cls.input_dependent else 1)
    return Finding(f"backend {backend}", ok, f"paths {'+'.join(sorted(ran))}: max difference from the reference "
                   f"{worst:.1e} (up to L={_backend_lengths(enc)[-1][0]})",
                   "" if ok else "the plan's block(), tail() or score_mod() disagree with full()")


def prop_chunked_gradients(spec: str) -> Finding:
    """Training through the chunked path: the gradients of q, k, v and the scheme's parameters equal
    the reference path's."""
    cls = positions.scheme(spec)
    if not cls.adds_bias:
        return Finding("training gradients (chunked)", None, "adds no bias")
    grads = {}
    for backend in ("reference", "chunked"):
        enc = perturbed(spec)
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, H, 37, D, generator=g).requires_grad_() for _ in range(3))
        qq, kk, plan = enc.prepare(q, k, x=layer_input(enc, 1, 37, 7))
        attention(qq, kk, v, plan, backend).square().sum().backward()
        grads[backend] = [t.grad for t in (q, k, v)] + [p.grad for p in enc.parameters() if p.requires_grad]
    worst = max((float((a - b).abs().max()) for a, b in zip(grads["reference"], grads["chunked"])
                 if a is not None and b is not None), default=0.0)
    ok = worst <= 1e-4
    return Finding("training gradients (chunked)", ok, f"max difference from the reference path {worst:.1e} at L=37",
                   "" if ok else "the plan's block() must be differentiable like full()")


def prop_init(spec: str) -> Finding:
    """Inside a GPT the scheme's parameters are what its own reset_parameters gives from the model's
    generator: the model never overwrites them."""
    model = tiny_gpt(spec, seed=3)
    if not list(model.positions.parameters()):
        return Finding("initialisation in a GPT", None, "no parameters")
    worst = 0.0
    for index, enc in enumerate(model.positions):
        alone = positions.build_spec(spec, **model.config.position_shape)
        alone.reset_parameters(model.generator(f"positions.{index}", 3))
        for p, q in zip(enc.parameters(), alone.parameters()):
            worst = max(worst, float((p - q).abs().max().detach()))
    ok = worst == 0.0
    return Finding("initialisation in a GPT", ok, f"GPT's position parameters vs reset_parameters(the model's "
                   f"generator): max difference {worst:.1e}", "" if ok else
                   "set every parameter (children included) in reset_parameters, from the generator it gets")


def prop_determinism(spec: str) -> Finding:
    """The same seed gives the same parameters whatever the global random state; another seed, others."""
    def params(seed: int, global_seed: int) -> list[torch.Tensor]:
        torch.manual_seed(global_seed)
        return [p.detach().clone() for p in tiny_gpt(spec, seed=seed).positions.parameters()]

    state = torch.random.get_rng_state()
    try:
        a, b, other = params(1, 10), params(1, 20), params(2, 10)
    finally:
        torch.random.set_rng_state(state)
    if not a:
        return Finding("determinism per seed", None, "no parameters")
    same = all(torch.equal(x, y) for x, y in zip(a, b))
    differs = any(not torch.equal(x, y) for x, y in zip(a, other))
    if not same:
        return Finding("determinism per seed", False, "seed 1 gives other parameters under another global seed",
                       "draw every random value from the generator reset_parameters gets, never torch's global one")
    return Finding("determinism per seed", True, "seed 1 twice (global seeds 10, 20): identical; seed 2: "
                   + ("different" if differs else "identical (nothing drawn)"))


BACKENDS_CHECKED = ("sdpa", "chunked", "split", "toeplitz", "flex")
PROPERTIES: tuple[tuple[str, Callable[[str], Finding]], ...] = (
    ("shapes", prop_shapes),
    ("queries as suffix", prop_suffix),
    ("causal inside a GPT", prop_causal),
    ("translation invariance", prop_translation),
    *((c, functools.partial(prop_capability, capability=c)) for c in CAPABILITIES),
    ("plan extras", prop_plan_extras),
    ("lengths beyond training", prop_lengths),
    ("gradients", prop_gradients),
    *((f"backend {b}", functools.partial(prop_backend, backend=b)) for b in BACKENDS_CHECKED),
    ("training gradients (chunked)", prop_chunked_gradients),
    ("initialisation in a GPT", prop_init),
    ("determinism per seed", prop_determinism),
)


def run(spec: str, only: list[str] | None = None) -> list[Finding]:
    """Every property of the contract on variant `spec` (or those named in `only`), in order. A
    property that raises is a failure whose evidence is the exception. A layout's contract is each of
    its distinct layers' (the property named after the layer)."""
    parsed = positions.parse(spec)   # an unknown name or option: one line, before any work
    layers = list(dict.fromkeys(layer.text for layer in parsed.pattern))
    if len(layers) > 1:
        return [dataclasses.replace(f, prop=f"{layer}: {f.prop}") for layer in layers for f in run(layer, only)]
    findings = []
    for name, prop in PROPERTIES:
        if only is not None and name not in only:
            continue
        try:
            findings.append(prop(spec))
        except Exception as error:   # the scheme's own bug: report it as this property's failure
            findings.append(Finding(name, False, f"raised {type(error).__name__}: {error}".splitlines()[0][:300],
                                    "fix the exception (the scheme's code)"))
    return findings
