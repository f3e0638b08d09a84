"""Causal attention with a position bias, behind one function.

    q, k, plan = enc.prepare(q, k)                  # q, k: (B, H, L, D) as projected
    attention(q, k, v, plan, backend="auto")        # -> (B, H, L, D)

Queries are the LAST Lq of the Lk key positions. The scheme's bias comes as a BiasPlan
(positions/plan.py); each path takes from it what it needs:

- `reference`: the seed's path. Materialise the (H, Lq, Lk) bias and the scores, add, mask,
  softmax. Every other path is tested against it.
- `sdpa`: torch's scaled_dot_product_attention, `is_causal` without a bias, a float mask
  (bias + causal -inf, materialised) with one.
- `chunked`: queries in blocks; each block builds only its rows of the bias and skips the keys
  after its last query. Memory O(block x L); works for every scheme, with autograd.
The split, split-linear and toeplitz paths (exact decompositions handed to the fused CPU kernel)
live in relbench/attention/fused.py; this module holds the interface, the choice of path and the others.

- `split`: exact decomposition for biases that become constant beyond a horizon K (xl, t5, shaw).
  Far keys go through the fused unbiased kernel in one causal call, the band of near keys gets the
  bias in one batched call of query blocks, and the two are merged by their log-sum-exp. CPU
  inference only; `auto` takes it for Shaw, and for a distance-only bias from L >= 32 x horizon.
- `split-linear`: the same for a separable bias r(i) + c(j) (alibi's linear distance, fox's running
  sums): per query block the row term cancels and the bias is a per-key term; the block's own keys
  and the earlier keys are merged by log-sum-exp.
- `toeplitz`: a bias that depends on i - j alone (xl, t5, alibi, kerple, sandwich, dynamic), with
  the causal mask folded in, given to the fused CPU kernel as a zero-copy strided view of one O(L)
  vector per head (a Hankel matrix over the reversed keys). CPU inference.
- `flex`: FlexAttention with the scheme's score_mod and a causal block mask, compiled. Inference
  on CPU (torch has no FlexAttention backward on CPU); training and inference on CUDA.

A layer with a sliding window, chunked attention or attention sinks (positions/spec.py: `window=W`,
`chunk=C`, `sinks=true`) runs on the reference path when asked, else on the chunked one, whose blocks
then start at the window's (or the chunk's) first key (O(L x W)) and carry the sink logits as one more
key of value zero.

A *backend* is what the user asks for (`auto`, `split`, ...); the *path* is the algorithm that
runs. `resolve` maps one to the other, visibly: `split` on a sequence too short for any far key
is the chunked path, and says so. What each backend takes of a bias is one rule (`takes`): `check`
reads it from a scheme's declared capabilities and refuses, `resolve` from a plan and runs the
chunked path instead. Nothing falls back inside a path; `recording()` counts the
paths that really ran, which is what profile.csv, extrapolation.csv and the report show.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections import Counter
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from relbench.attention.fused import (
    SPLIT_HORIZON_RATIO,
    four_d,
    split_attention,
    split_fits,
    split_linear_attention,
    toeplitz_attention,
)
from relbench.errors import UsageError, unknown
from relbench.positions.base import PositionEncoding
from relbench.positions.plan import BiasPlan, causal_mask, distance_grid

BACKENDS = ("auto", "reference", "sdpa", "chunked", "split", "toeplitz", "flex")
PATH_NAMES = ("reference", "sdpa", "chunked", "split", "split-linear", "toeplitz", "flex")
CHUNK_ROWS = (64, 512)      # query rows per block on the chunked path: as many as keep its mask
CHUNK_MASK_BYTES = 16 << 20  # within this (a tile that stays in cache; docs/performance.md, "Measurements behind the defaults")


# ---- reference and sdpa ---------------------------------------------------------------------------
def reference_attention(q: Tensor, k: Tensor, v: Tensor, plan: BiasPlan | None, window: int = 0,
                        sinks: Tensor | None = None, chunk: int = 0) -> Tensor:
    q_len, k_len = q.shape[-2], k.shape[-2]
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, Lq, Lk)
    if plan is not None:
        scores = scores + plan.full().to(scores.dtype)                      # (H or B,H, Lq, Lk)
    scores = scores.masked_fill(hidden_keys(k_len - q_len, k_len, 0, k_len, window, q.device, chunk), float("-inf"))
    if sinks is None:
        return torch.matmul(torch.softmax(scores, dim=-1), v)                # (B, H, Lq, D)
    sink = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]   # the sink returns nothing
    return torch.matmul(weights, v)


def hidden_keys(q_start: int, q_end: int, k_start: int, k_end: int, window: int, device=None,
                chunk: int = 0) -> Tensor:
    """(q, k) True where a query at [q_start, q_end) does not see a key at [k_start, k_end): keys after
    it, with a window W > 0 keys W or more positions before it, and with chunks of C > 0 keys in another
    chunk than its own (positions [nC, (n + 1)C): Llama 4's chunked attention, transformers'
    masking_utils.chunked_overlay, kv // C == q // C)."""
    distance = distance_grid(q_start, q_end, k_start, k_end, device)
    hidden = (distance < 0) | (distance >= window) if window else distance < 0
    if chunk:
        queries = torch.arange(q_start, q_end, device=device) // chunk
        hidden = hidden | (queries[:, None] != torch.arange(k_start, k_end, device=device)[None, :] // chunk)
    return hidden


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, plan: BiasPlan | None) -> Tensor:
    q_len, k_len = q.shape[-2], k.shape[-2]
    if plan is None and q_len == k_len:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    bias = torch.zeros(q_len, k_len, dtype=q.dtype, device=q.device) if plan is None else plan.full().to(q.dtype)
    mask = bias.masked_fill(causal_mask(q_len, k_len, q.device), float("-inf"))  # (H?, Lq, Lk)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


# ---- chunked ----------------------------------------------------------------------------------------
def chunk_block(k_len: int, heads: int, device_type: str = "cpu") -> int:
    """Query rows per block of the chunked path. On the CPU its (H, rows, keys) fp32 mask stays within
    CHUNK_MASK_BYTES (a tile that stays in cache while it is written and read), within CHUNK_ROWS. On
    CUDA, where every block is a few kernel launches, the largest (small blocks are launch-bound there:
    docs/performance.md, "Measurements behind the defaults")."""
    if device_type != "cpu":
        return CHUNK_ROWS[1]
    return min(CHUNK_ROWS[1], max(CHUNK_ROWS[0], CHUNK_MASK_BYTES // (4 * heads * max(1, k_len))))


def chunked_attention(q: Tensor, k: Tensor, v: Tensor, plan: BiasPlan | None, block: int | None = None,
                      window: int = 0, sinks: Tensor | None = None, chunk: int = 0) -> Tensor:
    """Query blocks, each over the keys it can see: up to its last query, and with a `window` W from
    W - 1 before its first query (the band: O(L x (W + block)) work and memory, not O(L^2)), with a
    `chunk` C from the start of its first query's chunk; `sinks` (H,) a sink logit per head, an extra key
    of value zero."""
    q_len, k_len = q.shape[-2], k.shape[-2]
    reach = min(r for r in (window, chunk) if r) if window or chunk else 0
    seen = min(k_len, reach + CHUNK_ROWS[1]) if reach else k_len
    block = chunk_block(seen, q.shape[1], q.device.type) if block is None else block
    offset = k_len - q_len
    outputs = []
    for start in range(0, q_len, block):
        end = min(q_len, start + block)
        keys = offset + end                                    # keys after the block's last query are skipped
        q_blk = q[..., start:end, :]                           # (B, H, bq, D)
        if window or chunk or sinks is not None:
            first = max(0, offset + start - window + 1) if window else 0   # keys before the band are skipped
            first = max(first, (offset + start) // chunk * chunk) if chunk else first   # and before the chunk
            mask = limited_mask(plan, offset + start, offset + end, first, keys, window, sinks, q, chunk)
            k_blk, v_blk = with_sink(k[..., first:keys, :], sinks), with_sink(v[..., first:keys, :], sinks)
            outputs.append(F.scaled_dot_product_attention(q_blk, k_blk, v_blk, attn_mask=mask))
            continue
        if plan is None:
            masked = distance_grid(offset + start, offset + end, 0, keys, q.device) < 0   # (bq, keys)
            mask = torch.zeros(end - start, keys, dtype=q.dtype, device=q.device).masked_fill(masked, float("-inf"))
        else:
            # (1 or B, H, bq, keys): the fused CPU kernel takes only a 4-d mask (a 3-d one runs the unfused math path)
            mask = four_d(plan.causal_block(offset + start, offset + end, keys).to(q.dtype))
        outputs.append(F.scaled_dot_product_attention(q_blk, k[..., :keys, :], v[..., :keys, :], attn_mask=mask))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-2)   # (B, H, Lq, D)


def limited_mask(plan: BiasPlan | None, q_start: int, q_end: int, k_start: int, k_end: int, window: int,
                 sinks: Tensor | None, q: Tensor, chunk: int = 0) -> Tensor:
    """The float mask of a windowed or sink layer's query block over keys [k_start, k_end): the bias
    (zero without a plan), -inf on the keys the window and causality hide, and the sink logits as one
    more column: (1 or B, H, bq, keys [+ 1])."""
    hidden = hidden_keys(q_start, q_end, k_start, k_end, window, q.device, chunk)
    bias = q.new_zeros(hidden.shape) if plan is None else plan.block(q_start, q_end, k_start, k_end).to(q.dtype)
    mask = bias.masked_fill(hidden, float("-inf"))
    mask = mask.view(1, 1, *mask.shape) if mask.dim() == 2 else four_d(mask)
    if sinks is None:
        return mask
    shape = (mask.shape[0], q.shape[1], q_end - q_start)
    sink = sinks.to(q.dtype).view(1, -1, 1, 1).expand(*shape, 1)
    return torch.cat([mask.expand(*shape, k_end - k_start), sink], dim=-1)


def with_sink(t: Tensor, sinks: Tensor | None) -> Tensor:
    """Keys or values with the sink's key appended (zero: its logit is the sink alone, its value nothing)."""
    return t if sinks is None else torch.cat([t, t.new_zeros(*t.shape[:-2], 1, t.shape[-1])], dim=-2)


# ---- flex -------------------------------------------------------------------------------------------
_FLEX: dict = {}


def flex_attention(q: Tensor, k: Tensor, v: Tensor, plan: BiasPlan | None) -> Tensor:
    """FlexAttention, compiled once per shape (dynamic=False: dynamic shapes fail to compile some
    score_mods on CPU), with the causal block mask cached per (Lq, Lk, device)."""
    from torch.nn.attention import flex_attention as flex

    if "kernel" not in _FLEX:
        _FLEX["kernel"] = torch.compile(flex.flex_attention, dynamic=False)
    q_len, k_len = q.shape[-2], k.shape[-2]
    key = (q_len, k_len, str(q.device))
    if key not in _FLEX:
        offset = k_len - q_len

        def causal(b, h, q_idx, kv_idx):
            return q_idx + offset >= kv_idx

        _FLEX[key] = flex.create_block_mask(causal, None, None, q_len, k_len, device=q.device)
    score_mod = None if plan is None else plan.score_mod()
    if plan is not None and score_mod is None:
        raise UsageError("this position scheme has no FlexAttention score_mod; use the chunked backend")
    # each length compiles its own kernel; past dynamo's recompile limit (8 by default) flex would
    # silently run unfused and materialise every score. The limit is raised for these calls only,
    # where the (re)compilation happens, and restored after: other compiled code keeps torch's default.
    with torch._dynamo.config.patch(recompile_limit=FLEX_RECOMPILE_LIMIT):
        return _FLEX["kernel"](q, k, v, score_mod=score_mod, block_mask=_FLEX[key])


FLEX_RECOMPILE_LIMIT = 256   # one kernel per (length, score_mod) a run evaluates; well above what a run uses


PATHS = {"reference": reference_attention, "sdpa": sdpa_attention, "chunked": chunked_attention,
         "split": split_attention, "split-linear": split_linear_attention, "toeplitz": toeplitz_attention,
         "flex": flex_attention}


# ---- choosing and checking a backend ----------------------------------------------------------------
def needs_grad(q: Tensor, k: Tensor, v: Tensor, plan: BiasPlan | None) -> bool:
    if not torch.is_grad_enabled():
        return False
    return q.requires_grad or k.requires_grad or v.requires_grad or (plan is not None and plan.requires_grad)


@dataclasses.dataclass(frozen=True)
class BiasFacts:
    """What the backend rules read of a bias: a scheme's declared capabilities (`of_scheme`, read by
    `check` before anything is built) or what a plan says of itself (`of_plan`, read by `resolve` and
    `choose` at each call)."""
    distance_only: bool
    has_horizon: bool
    separable: bool
    has_score_mod: bool

    @classmethod
    def of_scheme(cls, position: PositionEncoding | type[PositionEncoding]) -> BiasFacts:
        return cls(position.distance_only, position.has_horizon, position.separable, position.has_score_mod)

    @classmethod
    def of_plan(cls, plan: BiasPlan) -> BiasFacts:
        return cls(plan.distance_only, plan.horizon is not None, plan.separable, plan.has_score_mod)


CPU_INFERENCE = ("split", "toeplitz")   # fused CPU kernels that return no gradient for the bias


def takes(backend: str, bias: BiasFacts) -> bool:
    """The one rule per backend on the bias it can compute: toeplitz one of i - j alone, split one
    constant beyond some distance or separable, flex one with a score_mod; the others any bias.
    `check` refuses what fails it; `resolve` runs the chunked path instead."""
    if backend == "toeplitz":
        return bias.distance_only
    if backend == "split":
        return bias.has_horizon or bias.separable
    if backend == "flex":
        return bias.has_score_mod
    return True


def choose(plan: BiasPlan | None, q: Tensor, k_len: int, grad: bool) -> str:
    """The fastest exact backend measured for this device, mode and scheme (benchmarks/attention.py)."""
    if plan is None:
        return "sdpa"
    bias = BiasFacts.of_plan(plan)
    if q.device.type == "cuda":  # a per-query position term (transformer-xl) has no score_mod
        return "flex" if takes("flex", bias) and (plan.flex_trains or not grad) else "chunked"
    if grad:
        # measured (benchmarks/train_throughput.py, quick model): in fp32 chunked is as fast as the
        # reference path at 256 and twice as fast at 1024; under bf16 autocast the materialised
        # reference path is the fastest up to 1024 (1.25x chunked at 256)
        if q.dtype == torch.bfloat16 and k_len <= 1024:
            return "reference"
        return "chunked"
    # CPU inference: a bias constant beyond a horizon short against the length through the horizon
    # split (its far keys run unbiased, faster than the toeplitz view there, and Shaw's
    # content-dependent bias has no other fast path: docs/performance.md); any
    # other distance-only bias as a strided view; a separable one (FoX) through the linear split;
    # the rest chunked (resolve names it)
    if takes("toeplitz", bias):
        short = plan.horizon is not None and plan.horizon * SPLIT_HORIZON_RATIO <= k_len
        return "split" if short and split_fits(plan, q, k_len) else "toeplitz"
    return "split"


def resolve(backend: str, plan: BiasPlan | None, q: Tensor, k_len: int, grad: bool, limited: bool = False) -> str:
    """The path (PATH_NAMES) that `backend` runs for this plan and these queries. `auto` picks the
    backend (`choose`); `split` is the horizon split where it has far keys, the linear split for
    a separable bias (ALiBi, FoX), and otherwise what the split would compute anyway: sdpa without a bias, chunked for a
    short, non-square or non-CPU call, or a bias the backend does not take (`takes`). A `limited` layer
    (a window, chunks or sinks: positions/spec.py) runs on the reference path when that is the backend, else chunked."""
    if backend == "auto":
        backend = choose(plan, q, k_len, grad)
    elif backend not in BACKENDS:
        raise unknown("attention backend", backend, list(BACKENDS))
    if limited:
        return "reference" if backend == "reference" else "chunked"
    if backend not in CPU_INFERENCE:
        return backend
    if plan is None:
        return "sdpa"
    if grad:
        raise UsageError(f"the {backend} backend is for inference only (its fused kernel returns no gradient "
                         "for the bias); train with --attention auto or chunked")
    if q.device.type != "cpu" or not takes(backend, BiasFacts.of_plan(plan)):
        return "chunked"
    if backend == "toeplitz":
        return "toeplitz"
    if plan.separable and q.shape[-2] == k_len:
        return "split-linear"
    return "split" if split_fits(plan, q, k_len) else "chunked"


REFUSED = {"flex": '"{name}" has no FlexAttention score_mod (its position term is a per-query dot product); use '
                   '--attention chunked or auto',
           "split": 'the split backend needs a bias that is constant beyond some distance or separable (a per-row '
                    'plus a per-key term); "{name}" is neither: use --attention toeplitz, chunked or auto',
           "toeplitz": 'the toeplitz backend needs a bias that depends on i - j alone; "{name}" does not: use '
                       '--attention chunked or auto'}   # why `check` refuses a scheme's bias (`takes`)


def check(backend: str, position: PositionEncoding | type[PositionEncoding] | None = None,
          device: torch.device | str = "cpu", training: bool = False) -> str:
    """Validate a backend choice up front, from the scheme's declared capabilities (nothing is
    built), by the rules `resolve` applies to plans (`takes`, CPU_INFERENCE); raise a UsageError that
    says why it cannot work."""
    if backend not in BACKENDS:
        raise unknown("attention backend", backend, list(BACKENDS))
    device = torch.device(device)
    if backend == "flex" and training and device.type == "cpu":
        raise UsageError("the flex backend cannot train on CPU (torch's FlexAttention has no CPU backward); "
                         "use --attention auto or chunked")
    if backend in CPU_INFERENCE:
        if training:
            raise UsageError(f"the {backend} backend is for inference only; train with --attention auto or chunked")
        if device.type != "cpu":
            raise UsageError(f"the {backend} backend runs on CPU; on CUDA use --attention flex or auto")
    if position is not None and position.adds_bias and not takes(backend, BiasFacts.of_scheme(position)):
        raise UsageError(REFUSED[backend].format(name=position.name))
    return backend


@contextlib.contextmanager
def flush_denormals() -> Iterator[None]:
    """Flush subnormal floats to zero on the CPU inside the block, and restore torch's default (off)
    after: `torch.set_flush_denormal` is process-wide and has no getter, so only commands that
    measure or evaluate at length enter it (extrapolate, profile). ALiBi-like biases leave some
    of the softmax probabilities subnormal; flushing them changes no perplexity digit and makes those
    paths faster (docs/performance.md, "Measurements behind the defaults")."""
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


_RECORDERS: list[Counter] = []


@contextlib.contextmanager
def recording() -> Iterator[Counter]:
    """Count, by path name, the attention calls made inside the block (nested blocks each count)."""
    taken: Counter = Counter()
    _RECORDERS.append(taken)
    try:
        yield taken
    finally:
        _RECORDERS.remove(taken)


def path_label(taken: Counter) -> str:
    """The paths a recording saw, as one CSV cell: "split", or "chunked+split" when calls differed."""
    return "+".join(sorted(taken))


def scheme_attention(position: PositionEncoding, q: Tensor, k: Tensor, v: Tensor, plan: BiasPlan | None = None,
                     backend: str = "auto", window: int = 0, sinks: Tensor | None = None, chunk: int = 0) -> Tensor:
    """The attention `position`'s scheme computes: its own, for a scheme that replaces the softmax
    (stick-breaking; counted by `recording()` under the scheme's name, `backend` does not apply), or
    softmax attention with the plan's bias on `backend`."""
    if position.replaces_softmax:
        for taken in _RECORDERS:
            taken[position.name] += 1
        return position.attend(q, k, v)
    return attention(q, k, v, plan, backend, window, sinks, chunk)


def attention(q: Tensor, k: Tensor, v: Tensor, plan: BiasPlan | None = None, backend: str = "auto",
              window: int = 0, sinks: Tensor | None = None, chunk: int = 0) -> Tensor:
    """Causal attention of q (B, H, Lq, D) over k, v (B, H, Lk, D) with `plan`'s bias (None: no bias);
    with `window` W > 0 each query sees its W latest keys, with `chunk` C > 0 only the keys of its own
    chunk of C positions, and `sinks` (H,) adds a sink logit per head.

    q, k and the plan come from `PositionEncoding.prepare`; `backend` is resolved to the path that
    runs (`resolve`), and the path is counted by any active `recording()`."""
    limited = bool(window) or bool(chunk) or sinks is not None
    grad = needs_grad(q, k, v, plan) or (sinks is not None and sinks.requires_grad and torch.is_grad_enabled())
    path = resolve(backend, plan, q, k.shape[-2], grad, limited)
    for taken in _RECORDERS:
        taken[path] += 1
    width = v.shape[-1]
    if path != "reference" and width < q.shape[-1]:
        # q and k wider than v (PoPE: qk_width 2): torch's fused kernels take one head width, and with two
        # they fall back to the math path, L x L materialised (docs/performance.md: 6.6x unbiased SDPA at
        # 4096, 2.3x padded); zero columns of v change nothing in the first `width` columns of the output
        v = F.pad(v, (0, q.shape[-1] - width))
    if limited:
        return PATHS[path](q, k, v, plan, window=window, sinks=sinks, chunk=chunk)[..., :width]
    return PATHS[path](q, k, v, plan)[..., :width]
