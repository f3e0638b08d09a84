"""Attention cost per backend and variant, with two ratios measured in the same run.

For each variant x backend x length (B=1, H=8, d=64, forward, fp32 by default) this prints the
median time of building the position terms plus the attention call, the peak extra memory, and

    vs ref    = time of the seed's reference path for the same variant / this time (higher is better)
    vs floor  = this time / time of unbiased causal SDPA (`none`, sdpa) at the same shape (lower is better)

Targets (issue 3): at L=4096 every bias variant's default path >= 10x vs ref and <= 2x vs floor.
Each configuration runs in a fresh process (see relbench/profile.py); the reference path at
lengths whose (H, L, L) tensors cannot fit is recorded as oom without running.

    python benchmarks/attention.py                               # the full table (about 20 min on 2 cores)
    python benchmarks/attention.py --lengths 4096 --backends reference auto
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from relbench.attention import BACKENDS
from relbench.profile import profile_run

BIAS_VARIANTS = ["xl", "t5", "alibi", "shaw"]
OTHER_VARIANTS = ["rope"]


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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--variants", nargs="+", default=BIAS_VARIANTS + OTHER_VARIANTS)
    parser.add_argument("--backends", nargs="+", default=[b for b in BACKENDS], choices=BACKENDS)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("runs/benchmark-attention/profile.csv"))
    args = parser.parse_args(argv)
    console = Console(width=200)
    args.out.parent.mkdir(parents=True, exist_ok=True)
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
