"""Attention cost per backend and variant, with two ratios measured in the same run.

For each variant x backend x length (B=1, H=8, d=64, forward, fp32 by default) this prints the
median time of building the position terms plus the attention call, the peak extra memory, and

    vs ref    = time of the seed's reference path for the same variant / this time (higher is better)
    vs floor  = this time / time of unbiased causal SDPA (`none`, sdpa) at the same shape (lower is better)

Each configuration runs in a fresh process (see relbench/cost/profiling.py); the reference path at
lengths whose (H, L, L) tensors cannot fit is recorded as oom without running.

The floor is measured once per length, so on a shared CPU whose speed drifts by 25% between
minutes, `vs floor` carries that drift. A second table therefore times each variant's `auto` path
and unbiased SDPA in alternation, in this process, `--pairs` times (the order swapped every pair),
and prints the median of the per-pair ratios with their range: the number to compare with a goal
such as "within 1.1x of unbiased attention".

    python benchmarks/attention.py                               # the full table (about 20 min on 2 cores)
    python benchmarks/attention.py --lengths 4096 --backends reference auto
    python benchmarks/attention.py --paired-only --lengths 4096 16384   # every scheme, paired only

The full table covers xl, t5, alibi, shaw and rope by default (every backend of every scheme is
hours on 2 cores); the paired table alone (--paired-only) covers every scheme that adds a bias,
rotates q and k or replaces the softmax (stick-breaking). --variants names others, with their options:
"alibi:ssmax=true" times Scalable-Softmax's per-row factor on top of the scheme, "rope:window=256" a
sliding-window layer (its chunked band path, O(L x W)), and a layout "rope:window=256*3,none" its layers
one after the other against as many unbiased layers (docs/variants.md, "Layouts").
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import relbench  # noqa: F401  (first: sets the OpenMP wait policy before torch loads)

# isort: split
import pandas as pd
from rich.console import Console
from rich.table import Table

from relbench import positions
from relbench.attention import BACKENDS
from relbench.cost.profiling import profile_run

BIAS_VARIANTS = ["xl", "t5", "alibi", "shaw"]
OTHER_VARIANTS = ["rope"]
# the paired table's default: every scheme whose attention call differs from unbiased SDPA
EVERY_SCHEME = [n for n in positions.names()
                if positions.get(n).adds_bias or positions.get(n).rotates or positions.get(n).replaces_softmax]


def total_ms(row) -> float:
    return row["bias_ms"] + row["attention_ms"] if row["status"] == "ok" else float("nan")


def ratios(table: pd.DataFrame) -> pd.DataFrame:
    table = table.copy()
    table["total_ms"] = [total_ms(r) for _, r in table.iterrows()]
    floor = table[(table["variant"] == "none") & (table["backend"] == "sdpa")].set_index("length")["total_ms"]
    ref = table[table["backend"] == "reference"].set_index(["variant", "length"])["total_ms"]
    table["vs_ref"] = [ref.get((r.variant, r.length), float("nan")) / r.total_ms for r in table.itertuples()]
    table["vs_floor"] = [r.total_ms / floor.get(r.length, float("nan")) for r in table.itertuples()]
    return table


def show(table: pd.DataFrame, console: Console) -> None:
    out = Table(title="Attention forward, one layer: bias construction + attention", title_justify="left")
    for column in ("variant", "backend", "path", "L", "total ms", "min-max ms", "bias ms", "peak MB", "vs ref", "vs floor"):
        out.add_column(column, justify="left" if column in ("variant", "backend", "path") else "right")
    for r in table.sort_values(["length", "variant", "backend"]).itertuples():
        if r.status != "ok":
            out.add_row(r.variant, r.backend, "", str(r.length), r.status, "", "", "", "", "")
            continue
        spread = f"{r.bias_min_ms + r.attention_min_ms:.1f}-{r.bias_max_ms + r.attention_max_ms:.1f}"
        peak = "" if pd.isna(r.attention_peak_mb) else f"{max(r.attention_peak_mb, r.bias_peak_mb or 0):.0f}"
        out.add_row(r.variant, r.backend, str(r.path), str(r.length), f"{r.total_ms:.1f}", spread, f"{r.bias_ms:.2f}",
                    peak, "" if pd.isna(r.vs_ref) else f"{r.vs_ref:.1f}x", f"{r.vs_floor:.2f}x")
    console.print(out)


def paired_ratios(specs: list[str], lengths: list[int], batch: int, heads: int, head_dim: int, device: str,
                  pairs: int, console: Console, precision: str = "fp32", backward: bool = False) -> pd.DataFrame:
    """Per variant and length: the `auto` path (position terms included) and unbiased causal SDPA
    timed in alternation; the median, min and max of the per-pair time ratios. `precision` bf16:
    q, k, v in bf16 under autocast, the position parameters fp32, as `train --precision bf16` runs
    them (on CUDA unbiased SDPA is then flash attention). `backward`: forward and backward (the
    gradients of q, k, v and of the position parameters), the training path `auto` takes."""
    import contextlib

    import torch
    import torch.nn.functional as F

    from relbench import positions
    from relbench.attention import flush_denormals, path_label, recording, scheme_attention
    from relbench.cost.profiling import interleaved, paired, position_terms
    from relbench.model import scalable_softmax

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    device_type = torch.device(device).type

    def autocast():
        return torch.autocast(device_type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()

    rows = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(flush_denormals())
        if not backward:
            stack.enter_context(torch.no_grad())
        for length in lengths:
            generator = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn((batch, heads, length, head_dim), generator=generator).to(device, dtype)
                       .requires_grad_(backward) for _ in range(3))
            for spec in specs:
                layers = [(layer, layer.build(n_heads=heads, head_dim=head_dim, train_length=256).to(device))
                          for layer in positions.parse(spec).pattern]   # a layout: each layer of its pattern
                for _, position in layers:
                    position.reset_parameters(torch.Generator().manual_seed(0))
                if any(p.max_length is not None and length > p.max_length for _, p in layers):
                    continue
                x = (torch.randn(batch, length, layers[0][1].d_model, generator=generator).to(device)
                     if any(p.input_dependent for _, p in layers) else None)   # FoX's gates read the layer input

                def run(_: int, layers=layers, x=x, q=q, k=k, v=v, length=length) -> None:
                    for layer, position in layers:
                        with autocast():
                            q_rot, k_rot, plan = position_terms(position, q, k, length, x)
                            if layer.ssmax:   # Scalable-Softmax's per-row factor s_h log n, s_h = 1 as trained from
                                q_rot, plan = scalable_softmax(q_rot, plan, torch.ones(heads, device=device), length,
                                                               layer.ssmax_bias)
                            sinks = torch.zeros(heads, device=device) if layer.sinks else None
                            out = scheme_attention(position, q_rot, k_rot, v, plan, "auto", layer.window, sinks,
                                                   layer.chunk)
                        if backward:
                            out.float().sum().backward()

                def floor(_: int, q=q, k=k, v=v, layers=layers) -> None:
                    for _ in layers:    # as many unbiased causal layers as the spec has
                        with autocast():
                            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                        if backward:
                            out.float().sum().backward()

                n = pairs if length < 16384 else max(1, pairs // 2)
                with recording() as taken:
                    times = interleaved({"auto": run, "floor": floor}, n, warmup=1, device=device)
                ratios = paired(times["auto"], times["floor"])
                rows.append({"variant": spec, "length": length, "path": path_label(taken), "pairs": n,
                             "precision": precision, "passes": "forward+backward" if backward else "forward",
                             "auto_ms": 1000 * statistics.median(times["auto"]),
                             "sdpa_ms": 1000 * statistics.median(times["floor"]),
                             "ratio": statistics.median(ratios), "low": ratios[0], "high": ratios[-1]})
                console.print(f"{spec:<14} L={length:<6} {precision} {rows[-1]['passes']:<16} auto/sdpa {rows[-1]['ratio']:.2f}x "
                              f"({ratios[0]:.2f}-{ratios[-1]:.2f}, {n} pairs, {rows[-1]['path']})")
    return pd.DataFrame(rows)


def show_paired(table: pd.DataFrame, console: Console) -> None:
    out = Table(title="auto path / unbiased causal SDPA, timed in alternation (median of pairs)", title_justify="left")
    for column in ("variant", "path", "L", "precision", "passes", "auto ms", "sdpa ms", "pairs", "ratio", "range"):
        out.add_column(column, justify="left" if column in ("variant", "path", "precision", "passes") else "right")
    for r in table.sort_values(["length", "ratio"]).itertuples():
        out.add_row(r.variant, r.path, str(r.length), r.precision, r.passes, f"{r.auto_ms:.2f}",
                    f"{r.sdpa_ms:.2f}", str(r.pairs), f"{r.ratio:.2f}x", f"{r.low:.2f}-{r.high:.2f}")
    console.print(out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--variants", nargs="+", default=None,
                        help="default: xl t5 alibi shaw rope; with --paired-only every scheme that adds a bias or rotates")
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("runs/benchmark-attention/profile.csv"))
    parser.add_argument("--pairs", type=int, default=7, help="alternating auto/SDPA pairs per variant (half at 16384); 0: none")
    parser.add_argument("--paired-only", action="store_true", help="only the alternating table (no profile rows)")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="the paired table's precision (bf16: autocast, as training in bf16)")
    parser.add_argument("--backward", action="store_true", help="the paired table times forward+backward")
    args = parser.parse_args(argv)
    console = Console(width=200)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.variants is None:
        args.variants = EVERY_SCHEME if args.paired_only else BIAS_VARIANTS + OTHER_VARIANTS
    if args.paired_only:
        paired = paired_ratios(args.variants, args.lengths, args.batch, args.heads, args.head_dim, args.device,
                               max(1, args.pairs), console, args.precision, args.backward)
        show_paired(paired, console)
        paired.to_csv(args.out.with_name("paired.csv"), index=False)
        return 0
    # the floor and the reference are measured in this same run
    profile_run(args.out, ["none"], ["sdpa"], args.lengths, args.batch, args.heads, args.head_dim, args.device,
                args.repeats, 0, 900, console)
    backends = list(dict.fromkeys(["reference"] + args.backends))
    table = profile_run(args.out, args.variants, backends, args.lengths, args.batch, args.heads, args.head_dim,
                        args.device, args.repeats, 0, 900, console)
    table = table[(table["heads"] == args.heads) & (table["head_dim"] == args.head_dim) & (table["batch"] == args.batch)
                  & (table["device"] == args.device) & table["length"].isin(args.lengths)]
    show(ratios(table), console)
    console.print(f"rows in {args.out}")
    if args.pairs > 0:
        paired = paired_ratios(args.variants, args.lengths, args.batch, args.heads, args.head_dim, args.device,
                               args.pairs, console, args.precision, args.backward)
        show_paired(paired, console)
        paired.to_csv(args.out.with_name("paired.csv"), index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
