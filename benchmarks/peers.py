"""relbench side by side with x-transformers, for every position scheme both have, in one run.

x-transformers (lucidrains, `pip install -e '.[peers]'`) offers five of relbench's schemes as
options of its `Decoder`: alibi (alibi_pos_bias), t5 (rel_pos_bias), dynamic (dynamic_pos_bias),
xpos (rotary_xpos) and rope (rotary_pos_emb). For each, this prints, measured in the same process
with the two libraries' calls interleaved (so that load from other processes hits both alike):

1. Attention, one layer forward, inference (torch.no_grad, fp32, CPU; B=1, H=8, d=64): the median
   time of building the position term plus the attention call, for relbench
   (`enc.prepare(q, k)` then `attention(q, k, v, plan, "auto")`) and for x-transformers' own
   position module plus its `Attend`, and unbiased causal SDPA as the floor. x-transformers' Attend
   has two modes: `einsum` (flash=False, its Decoder's default: scores materialised) and `sdpa`
   (flash=True: its bias materialised as SDPA's float mask). Its Decoder refuses flash with t5 and
   dynamic, so `x-t` is the fastest mode its Decoder accepts for the scheme and `x-t other` the
   remaining mode (for t5 and dynamic the Decoder refuses it: timed only with --all-modes).
   `ratio` = x-transformers time / relbench time, the median over rounds of the two calls made
   back to back: higher means relbench is faster.
2. Training tokens/s of the same decoder in both libraries (relbench's preset model, default
   quick: bytes, d_model 128, 4 layers, 4 heads, MLP x4, length 256, batch 8), fp32, CPU, the same
   batches and AdamW settings (lr, betas, eps; weight decay 0.1 on matrices, none on norms and
   position parameters); forward + loss + backward + optimizer step, median step after warm-up.
   x-transformers trains in each mode its Decoder accepts (attn_flash=False, and True where allowed);
   `ratio` = x-transformers step time / relbench step time (paired as above) = the tokens/s ratio.

The attention section runs under relbench's denormal flushing (as benchmarks/attention.py does),
for both libraries alike; training runs with torch's defaults, like train_throughput.py. On a
2-core machine shared with other jobs, one busy core stalls torch's two threads for whole steps:
the paired ratios absorb most of it, the absolute times do not (--threads 1 steadies them).

Each scheme is configured to compute what relbench's does; the `same` column checks it on
L=48 (outputs of both libraries equal after mapping x-transformers' parameters onto relbench's).
Mismatches the API leaves:
- alibi: none in the function. x-transformers caches its (H, L, L) bias as a buffer after the first
  call; its timing is that cache hit (its steady state), relbench rebuilds its O(L) plan per call.
- t5: the same causal buckets (32, max distance 128); x-transformers multiplies its table by
  sqrt(head dim) and starts it at N(0, 1) (relbench: 0.02), the same function after a rescaling;
  the Decoder builds the (H, L, L) bias again in every layer (relbench plans once per forward).
- dynamic: the same MLP (1 -> 32 -> 32 -> H, SiLU) of sign(d) log(1 + |d|); x-transformers' width
  is d_model / 4 (32 for the quick model, set to 32 here for the attention rows) and one MLP is
  shared by all layers (relbench: one per layer, so relbench has 3 x 1252 more parameters on the
  quick model); the Decoder evaluates it again in every layer.
- rope, xpos: rotary_emb_dim set to the head dimension (x-transformers' default rotates half of
  it); x-transformers pairs channels (2i, 2i+1), relbench (i, i + d/2): a fixed channel
  permutation, the same attention.
- every model: x-transformers' LayerNorm has no bias (relbench: 9 x 128 more parameters), q, k, v
  are three matrices (relbench: one fused), embeddings start from a Kaiming normal init, and the
  feed-forward is built with ff_no_bias=True and use_abs_pos_emb=False to match relbench.

    pip install -e '.[peers]'
    python benchmarks/peers.py     # both sections, L=4096: 5 min on 2 idle cores, 13 with one core busy elsewhere
    python benchmarks/peers.py --schemes alibi t5 --lengths 1024 4096 --no-train --all-modes
    python benchmarks/peers.py --no-attention --steps 20 --train-length 1024   # 2 sequences of 1024 per step
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table
from torch import Tensor, nn

from relbench import positions
from relbench.attention import attention, flush_denormals, path_label, recording
from relbench.config import resolve
from relbench.cost import memory
from relbench.cost.profiling import interleaved
from relbench.model import GPT
from relbench.training.batches import lm_batch
from relbench.training.step import make_optimizer

INSTALL = "x-transformers is not installed: pip install -e '.[peers]'"
DYNAMIC_WIDTH = positions.get("dynamic").options()["width"].default    # relbench's MLP width (32)


@dataclass(frozen=True)
class Peer:
    """One scheme in both libraries: relbench's spec and the x-transformers Decoder options that
    select the same scheme, and whether that Decoder accepts attn_flash=True with it."""

    spec: str
    decoder: dict[str, Any]
    flash_allowed: bool
    rotary: bool = False


PEERS = {
    "alibi": Peer("alibi", {"alibi_pos_bias": True}, flash_allowed=True),
    "t5": Peer("t5", {"rel_pos_bias": True, "rel_pos_num_buckets": 32, "rel_pos_max_distance": 128},
               flash_allowed=False),
    "dynamic": Peer("dynamic", {"dynamic_pos_bias": True, "dynamic_pos_bias_log_distance": True,
                                "dynamic_pos_bias_mlp_depth": 2}, flash_allowed=False),
    "xpos": Peer("xpos", {"rotary_xpos": True, "rotary_xpos_scale_base": 512}, flash_allowed=True, rotary=True),
    "rope": Peer("rope", {"rotary_pos_emb": True}, flash_allowed=True, rotary=True),
}
MODES = {False: "einsum", True: "sdpa"}      # x-transformers' Attend(flash=...)


def have_x_transformers() -> bool:
    try:
        import x_transformers  # noqa: F401
    except ImportError:
        return False
    return True


# ---- x-transformers' pieces, through its public classes -----------------------------------------------
def xt_position(name: str, heads: int, head_dim: int, width: int = DYNAMIC_WIDTH) -> nn.Module:
    """x-transformers' own module for scheme `name`, with the arguments its Decoder passes (t5's
    scale sqrt(head dim)), full-width rotation, and dynamic's MLP `width` wide."""
    from x_transformers.x_transformers import (
        AlibiPositionalBias,
        DynamicPositionBias,
        RelativePositionBias,
        RotaryEmbedding,
    )

    if name == "alibi":
        return AlibiPositionalBias(heads=heads, total_heads=heads)
    if name == "t5":
        return RelativePositionBias(scale=head_dim ** 0.5, causal=True, num_buckets=32, max_distance=128, heads=heads)
    if name == "dynamic":
        return DynamicPositionBias(dim=width, heads=heads, depth=2, log_distance=True)
    if name == "xpos":
        return RotaryEmbedding(head_dim, use_xpos=True, scale_base=512)
    if name == "rope":
        return RotaryEmbedding(head_dim)
    raise KeyError(name)


def xt_attention(module: nn.Module, heads: int, flash: bool) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """Causal attention the way x-transformers' Attention layer runs it: the position term from
    `module` (a bias added to the scaled logits, or a rotation of q and k, xPos scaling q by its
    factor and k by the inverse), then its Attend."""
    from x_transformers.attend import Attend
    from x_transformers.x_transformers import RotaryEmbedding, apply_rotary_pos_emb

    attend = Attend(causal=True, heads=heads, flash=flash, dropout=0.0)
    if isinstance(module, RotaryEmbedding):
        def rotated(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            freqs, scale = module.forward_from_seq_len(k.shape[-2])
            k_scale = scale ** -1.0 if torch.is_tensor(scale) else scale
            q, k = apply_rotary_pos_emb(q, freqs, scale), apply_rotary_pos_emb(k, freqs, k_scale)
            return attend(q, k, v)[0]
        return rotated

    def biased(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return attend(q, k, v, attn_bias=module(q.shape[-2], k.shape[-2]))[0]
    return biased


def xt_model(name: str, model_config, flash: bool) -> nn.Module:
    """x-transformers' decoder LM of relbench's model shape, with scheme `name`."""
    from x_transformers import Decoder, TransformerWrapper

    peer = PEERS[name]
    options = dict(peer.decoder)
    if peer.rotary:
        options["rotary_emb_dim"] = model_config.head_dim
    decoder = Decoder(dim=model_config.d_model, depth=model_config.n_layers, heads=model_config.n_heads,
                      attn_dim_head=model_config.head_dim, ff_mult=model_config.mlp_ratio, ff_no_bias=True,
                      attn_flash=flash, attn_dropout=0.0, ff_dropout=0.0, **options)
    return TransformerWrapper(num_tokens=model_config.vocab_size, max_seq_len=model_config.train_length,
                              attn_layers=decoder, use_abs_pos_emb=False, tie_embedding=True, emb_dropout=0.0)


def xt_position_of(model: nn.Module) -> nn.Module:
    """The position module a TransformerWrapper's decoder uses."""
    layers = model.attn_layers
    return layers.rel_pos if layers.rel_pos is not None else layers.rotary_pos_emb


def relbench_position(name: str, heads: int, head_dim: int, train_length: int = 256) -> positions.PositionEncoding:
    enc = positions.build_spec(PEERS[name].spec, n_heads=heads, head_dim=head_dim, train_length=train_length)
    enc.reset_parameters(torch.Generator().manual_seed(0))
    return enc


# ---- are they the same scheme? --------------------------------------------------------------------------
@torch.no_grad()
def match_parameters(name: str, xt: nn.Module, enc: positions.PositionEncoding, seed: int = 1) -> None:
    """Draw x-transformers' parameters at random and give relbench's scheme the same function:
    t5's table is x-transformers' times its scale, dynamic's MLP layers are copied."""
    generator = torch.Generator().manual_seed(seed)
    if name == "t5":
        weight = xt.relative_attention_bias.weight
        weight.copy_(torch.randn(weight.shape, generator=generator) * 0.5)
        enc.table.copy_(weight * xt.scale)
    elif name == "dynamic":
        theirs = [m for m in xt.modules() if isinstance(m, nn.Linear)]
        ours = [m for m in enc.mlp if isinstance(m, nn.Linear)]
        if [m.weight.shape for m in theirs] != [m.weight.shape for m in ours]:
            raise ValueError(f"dynamic MLPs differ: {[tuple(m.weight.shape) for m in theirs]} vs "
                             f"{[tuple(m.weight.shape) for m in ours]}")
        for a, b in zip(theirs, ours):
            a.weight.copy_(torch.randn(a.weight.shape, generator=generator) * 0.5)
            a.bias.copy_(torch.randn(a.bias.shape, generator=generator) * 0.5)
            b.weight.copy_(a.weight)
            b.bias.copy_(a.bias)


def interleaved_channels(head_dim: int) -> Tensor:
    """Channel order that turns relbench's rotary pairs (i, i + d/2) into x-transformers' (2i, 2i+1)."""
    half = head_dim // 2
    return torch.stack((torch.arange(half), torch.arange(half) + half), dim=-1).flatten()


@torch.no_grad()
def difference(name: str, xt: nn.Module, enc: positions.PositionEncoding, length: int = 48,
               seed: int = 0) -> float:
    """Largest |relbench - x-transformers| attention output over both Attend modes, on random
    q, k, v of `length`, after `match_parameters`; relbench runs its reference path."""
    match_parameters(name, xt, enc)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, enc.n_heads, length, enc.head_dim, generator=g) for _ in range(3))
    q_rot, k_rot, plan = enc.prepare(q, k)
    ours = attention(q_rot, k_rot, v, plan, "reference")
    if PEERS[name].rotary:   # the same pairs, in x-transformers' channel layout
        order = interleaved_channels(enc.head_dim)
        q, k = q[..., order], k[..., order]
    worst = 0.0
    for flash in (False, True):
        theirs = xt_attention(xt, enc.n_heads, flash)(q, k, v)
        worst = max(worst, float((theirs - ours).abs().max()))
    return worst


def same_label(diff: float) -> str:
    return f"yes ({diff:.0e})" if diff < 1e-4 else f"NO ({diff:.1e})"


# ---- timing ---------------------------------------------------------------------------------------------
def median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1000


def paired_ratio(theirs: list[float], ours: list[float]) -> float:
    """Median over rounds of their time / our time in the same round: a round slowed by another
    process slows both calls of the pair, and a pair slowed on one side only is outvoted."""
    return statistics.median(t / o for t, o in zip(theirs, ours))


def xt_bytes(mode: str, batch: int, heads: int, length: int) -> int:
    """Rough peak of x-transformers' attention at `length`: the einsum mode keeps several (B, H, L, L)
    score tensors alive, the sdpa mode the bias, its masked copy and the scheme's (L, L) temporaries."""
    scores = batch * heads * length * length * 4
    return scores * (8 if mode == "einsum" else 5)


@dataclass
class AttentionRow:
    scheme: str
    length: int
    relbench_ms: float
    relbench_path: str
    xt: dict[str, float | str]      # mode -> ms, or the reason it did not run
    ratios: dict[str, float]        # mode -> paired ratio x-t / relbench (see paired_ratio)
    same: str
    floor_ms: float


def attention_rows(names: list[str], length: int, batch: int, heads: int, head_dim: int, repeats: int,
                   warmup: int, console: Console, all_modes: bool = False) -> list[AttentionRow]:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, length, head_dim, generator=g) for _ in range(3))
    budget = memory.budget("cpu")
    rows = []
    for name in names:
        enc = relbench_position(name, heads, head_dim)
        module = xt_position(name, heads, head_dim)
        same = same_label(difference(name, xt_position(name, heads, head_dim),
                                     relbench_position(name, heads, head_dim)))

        def ours(_: int, enc: positions.PositionEncoding = enc) -> Tensor:
            q_rot, k_rot, plan = enc.prepare(q, k)
            return attention(q_rot, k_rot, v, plan, "auto")

        calls: dict[str, Callable[[int], object]] = {
            "relbench": ours, "floor": lambda _: F.scaled_dot_product_attention(q, k, v, is_causal=True)}
        skipped: dict[str, str] = {}
        for flash, mode in MODES.items():
            if flash and not (PEERS[name].flash_allowed or all_modes):
                skipped[mode] = "not run (--all-modes)"
                continue
            need = xt_bytes(mode, batch, heads, length)
            if budget is not None and need > 0.8 * budget:
                skipped[mode] = f"skipped: needs ~{memory.human(need)}"
                continue
            run = xt_attention(module, heads, flash)
            calls[mode] = lambda _, run=run: run(q, k, v)
        with recording() as taken:
            ours(0)
        try:
            times = interleaved(calls, repeats, warmup)
        except (RuntimeError, MemoryError) as error:
            if not memory.is_out_of_memory(error):
                raise
            times = interleaved({key: calls[key] for key in ("relbench", "floor")}, repeats, warmup)
            skipped.update({mode: "oom" for mode in MODES.values() if mode not in skipped})
        xt = {mode: (median_ms(times[mode]) if mode in times else skipped[mode]) for mode in MODES.values()}
        ratios = {mode: paired_ratio(times[mode], times["relbench"]) for mode in MODES.values() if mode in times}
        row = AttentionRow(name, length, median_ms(times["relbench"]), path_label(taken), xt, ratios, same,
                           median_ms(times["floor"]))
        console.print(f"attention {name:<8} L={length:<6} relbench {row.relbench_ms:8.1f} ms ({row.relbench_path})  "
                      + "  ".join(f"x-t {m} {ms:.1f} ms" if isinstance(ms, float) else f"x-t {m} {ms}"
                                  for m, ms in xt.items()) + f"  floor {row.floor_ms:.1f} ms")
        rows.append(row)
        del module, calls      # x-transformers' ALiBi keeps its (H, L, L) bias cached
    return rows


def split_modes(name: str, results: dict[str, Any]) -> tuple[str | None, str | None]:
    """(the fastest mode x-transformers' Decoder accepts for the scheme, the other mode)."""
    allowed = [MODES[f] for f in (False, True) if f is False or PEERS[name].flash_allowed]
    timed = [m for m in allowed if isinstance(results.get(m), float)]
    best = min(timed, key=lambda m: results[m]) if timed else None
    other = [m for m in MODES.values() if m != best]
    return best, (other[0] if best is not None else None)


def mode_label(name: str, mode: str) -> str:
    refused = mode == "sdpa" and not PEERS[name].flash_allowed
    return f"{mode} (flash={mode == 'sdpa'}{', Decoder refuses' if refused else ''})"


def ratio_label(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def show_attention(rows: list[AttentionRow], batch: int, heads: int, head_dim: int, console: Console) -> None:
    out = Table(title=f"Attention forward, one layer, B={batch} H={heads} d={head_dim}, fp32 CPU: position term + "
                      "attention; ratio = x-transformers time / relbench time (median over rounds of the pair), "
                      "higher = relbench faster", title_justify="left")
    for column in ("scheme", "L", "relbench ms", "relbench path", "x-t ms", "x-t mode", "ratio", "x-t other ms",
                   "x-t other mode", "ratio other", "floor ms", "relbench/floor", "same"):
        out.add_column(column, justify="right" if "ms" in column or "ratio" in column or column in ("L",) else "left")
    for r in rows:
        best, other = split_modes(r.scheme, r.xt)
        best_ms = r.xt.get(best) if best else None
        other_value = r.xt.get(other) if other else None
        out.add_row(r.scheme, str(r.length), f"{r.relbench_ms:.1f}", r.relbench_path,
                    f"{best_ms:.1f}" if best else "not run", mode_label(r.scheme, best) if best else "",
                    ratio_label(r.ratios.get(best)),
                    f"{other_value:.1f}" if isinstance(other_value, float) else str(other_value or ""),
                    mode_label(r.scheme, other) if other else "", ratio_label(r.ratios.get(other)),
                    f"{r.floor_ms:.1f}", f"{r.relbench_ms / r.floor_ms:.2f}x", r.same)
    console.print(out)


# ---- training ---------------------------------------------------------------------------------------------
def xt_optimizer(model: nn.Module, like: torch.optim.AdamW, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with relbench's settings (make_optimizer): decay on matrices only, not on norms or the
    position scheme's parameters; the same lr, betas and eps as `like`."""
    position = {id(p) for p in xt_position_of(model).parameters()}
    decay = [p for p in model.parameters() if p.dim() >= 2 and id(p) not in position]
    rest = [p for p in model.parameters() if p.dim() < 2 or id(p) in position]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]],
                             **{key: like.defaults[key] for key in ("lr", "betas", "eps")})


def explained_difference(name: str, model_config) -> tuple[int, str]:
    """Parameters relbench's model has beyond x-transformers', and why."""
    norms = (2 * model_config.n_layers + 1) * model_config.d_model
    text = f"+{norms} LayerNorm biases"
    extra = norms
    if name == "dynamic":
        copies = model_config.n_layers - 1
        mlp = sum(p.numel() for p in relbench_position(name, model_config.n_heads, model_config.head_dim).parameters())
        extra += copies * mlp
        text += f", +{copies}x{mlp} one dynamic MLP per layer (x-t: shared)"
    return extra, text


def step_call(model: nn.Module, optimizer: torch.optim.Optimizer,
              batches: list[tuple[Tensor, Tensor]]) -> Callable[[int], None]:
    """One training step on batch `s`, timed as benchmarks/train_throughput.py times it: forward,
    loss, backward, optimizer step (the batch is drawn before)."""
    def step(s: int) -> None:
        x, y = batches[s]
        logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return step


@dataclass
class TrainRow:
    scheme: str
    relbench_tps: float
    relbench_path: str
    relbench_params: int
    xt_tps: dict[str, float]
    ratios: dict[str, float]        # mode -> paired ratio x-t step time / relbench step time
    xt_params: int
    explained: str
    same: str


def train_configs(preset: str, train_length: int | None = None):
    """The preset's model and training configs; another train length keeps its tokens per step (as
    benchmarks/train_throughput.py does)."""
    model_config, train_config, _ = resolve(preset, model={"train_length": train_length})
    if train_length:
        base = resolve(preset)[0].train_length * train_config.batch_size
        train_config = dataclasses.replace(train_config, batch_size=max(1, base // train_length))
    return model_config, train_config


def train_row(name: str, preset: str, steps: int, warmup: int, train_tokens: Tensor, console: Console,
              train_length: int | None = None) -> TrainRow:
    model_config, train_config = train_configs(preset, train_length)
    model_config = dataclasses.replace(model_config, position=PEERS[name].spec, attention="auto")
    length, batch = model_config.train_length, train_config.batch_size
    batches = [lm_batch(train_tokens, s, 0, batch, length) for s in range(warmup + steps)]
    ours = GPT(model_config, seed=0).train()
    optimizer = make_optimizer(ours, train_config)
    calls = {"relbench": step_call(ours, optimizer, batches)}
    models = {}
    for flash in (False, True):
        if flash and not PEERS[name].flash_allowed:
            continue
        torch.manual_seed(0)
        models[MODES[flash]] = theirs = xt_model(name, model_config, flash).train()
        calls[MODES[flash]] = step_call(theirs, xt_optimizer(theirs, optimizer, train_config.weight_decay), batches)
    with recording() as taken:
        calls["relbench"](0)
    times = interleaved(calls, steps, warmup)
    tps = {key: batch * length / statistics.median(t) for key, t in times.items()}
    ratios = {mode: paired_ratio(times[mode], times["relbench"]) for mode in times if mode != "relbench"}
    xt_params = sum(p.numel() for p in next(iter(models.values())).parameters())
    # the Decoder's own position module against relbench's (first layer's) scheme
    check = xt_model(name, model_config, False)
    try:
        same = same_label(difference(name, xt_position_of(check), GPT(model_config, seed=0).position(0)))
    except ValueError as error:      # dynamic on a model whose d_model / 4 is not relbench's width
        same = f"NO ({error})"
    _, explained = explained_difference(name, model_config)
    row = TrainRow(name, tps.pop("relbench"), path_label(taken), ours.n_params(), tps, ratios, xt_params, explained,
                   same)
    console.print(f"train     {name:<8} relbench {row.relbench_tps:10,.0f} tokens/s  "
                  + "  ".join(f"x-t {m} {v:,.0f}" for m, v in row.xt_tps.items()))
    return row


def show_train(rows: list[TrainRow], preset: str, steps: int, console: Console,
               train_length: int | None = None) -> None:
    model_config, train_config = train_configs(preset, train_length)
    out = Table(title=f"Training, preset {preset} ({model_config.n_layers} layers, d_model {model_config.d_model}, "
                      f"{model_config.n_heads} heads, length {model_config.train_length}, batch "
                      f"{train_config.batch_size}), fp32 CPU, median step of {steps}; ratio = x-transformers step "
                      "time / relbench step time (median over rounds of the pair) = relbench tokens/s / "
                      "x-transformers'", title_justify="left")
    for column in ("scheme", "relbench tok/s", "relbench path", "x-t tok/s", "x-t mode", "ratio", "x-t other tok/s",
                   "ratio other", "relbench params", "x-t params", "relbench - x-t", "same"):
        out.add_column(column, justify="right" if "tok/s" in column or "ratio" in column or "params" in column
                       or column == "relbench - x-t" else "left")
    for r in rows:
        best = min(r.ratios, key=r.ratios.get)     # x-transformers' fastest mode, against relbench
        others = [m for m in r.xt_tps if m != best]
        other = others[0] if others else None
        out.add_row(r.scheme, f"{r.relbench_tps:,.0f}", r.relbench_path, f"{r.xt_tps[best]:,.0f}",
                    mode_label(r.scheme, best), ratio_label(r.ratios[best]),
                    f"{r.xt_tps[other]:,.0f}" if other else "",
                    ratio_label(r.ratios[other]) if other else "",
                    f"{r.relbench_params:,}", f"{r.xt_params:,}", f"{r.relbench_params - r.xt_params:+,}", r.same)
    console.print(out)
    for r in rows:
        console.print(f"  {r.scheme}: parameters {r.relbench_params - r.xt_params:+,} = {r.explained}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schemes", nargs="+", default=list(PEERS), choices=list(PEERS))
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096])
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="timed attention calls per configuration")
    parser.add_argument("--preset", default="quick", help="relbench preset whose model both libraries train")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per model")
    parser.add_argument("--train-length", type=int, default=None, help="override the preset's (same tokens per step)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed training steps first (attention: 1 call)")
    parser.add_argument("--all-modes", action="store_true",
                        help="also time x-transformers' Attend(flash=True) with the t5 and dynamic biases, which its "
                             "Decoder refuses (information only; adds about 40 s at 4096)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--no-attention", action="store_true")
    parser.add_argument("--no-train", action="store_true")
    args = parser.parse_args(argv)
    if not have_x_transformers():
        print(INSTALL, file=sys.stderr)
        return 1
    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console(width=250)
    console.print(f"relbench vs x-transformers {version('x-transformers')}, torch {torch.__version__}, "
                  f"{torch.get_num_threads()} threads")
    attention_table: list[AttentionRow] = []
    if not args.no_attention:
        with torch.no_grad(), flush_denormals():
            for length in args.lengths:
                attention_table += attention_rows(args.schemes, length, args.batch, args.heads, args.head_dim,
                                                  args.repeats, 1, console, args.all_modes)
    train_table: list[TrainRow] = []
    if not args.no_train:
        from relbench.data import load_splits

        train_tokens = torch.from_numpy(load_splits(None).train)
        for name in args.schemes:
            train_table.append(train_row(name, args.preset, args.steps, args.warmup, train_tokens, console,
                                         args.train_length))
    if attention_table:
        show_attention(attention_table, args.batch, args.heads, args.head_dim, console)
    if train_table:
        show_train(train_table, args.preset, args.steps, console, args.train_length)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
