"""Training throughput per variant, precision and attention backend, measured in one run.

Trains the given preset's model (default: quick) for a few steps per configuration on the
embedded corpus, after warm-up steps, and prints tokens/s and the ratio to fp32 with the same
backend. Perplexity effects of bf16 need full training runs: compare `relbench train --precision
bf16` with fp32 in two run directories (the README quotes both).

    python benchmarks/train_throughput.py
    python benchmarks/train_throughput.py --variants xl alibi --precisions fp32 bf16 --backends auto reference
    python benchmarks/train_throughput.py --paired --precisions fp32 --backends auto   # each variant x none
    python benchmarks/train_throughput.py --paired --precisions fp32 --backends auto --preset retrieval \
        --variants alibi:random_positions=8192 --baseline alibi   # randomized positions' dense bias x alibi's
    python benchmarks/train_throughput.py --device cuda --modes eager compile   # torch.compile of the model

`--modes compile` runs the model under torch.compile (forward and backward through inductor; the
first steps, which compile, are warm-up and not timed): whether it pays for a model that is
launch-bound on a GPU is measured, not assumed.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys

import relbench  # noqa: F401  (first: sets the OpenMP wait policy before torch loads)

# isort: split
import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from relbench import positions
from relbench.config import resolve
from relbench.cost.profiling import interleaved, paired
from relbench.data import load_splits
from relbench.model import GPT
from relbench.training.batches import lm_batch as batch_at
from relbench.training.batches import random_positions
from relbench.training.step import make_optimizer


def make_step(spec: str, precision: str, backend: str, preset: str, train_tokens: torch.Tensor,
              train_length: int | None = None, device: str = "cpu", mode: str = "eager"):
    """A model and optimiser of the preset for `spec`, and a function that runs training step i
    (forward, loss, backward, AdamW) on batch i; plus the tokens per step."""
    model_config, train_config, _ = resolve(preset, model={"train_length": train_length})
    if train_length:  # keep the tokens per step of the preset
        base = resolve(preset)[0].train_length * train_config.batch_size
        train_config = dataclasses.replace(train_config, batch_size=max(1, base // train_length))
    model_config = dataclasses.replace(model_config, position=spec, attention=backend)
    model = GPT(model_config, seed=0).to(device).train()
    optimizer = make_optimizer(model, train_config)
    forward = torch.compile(model) if mode == "compile" else model
    length, batch = model_config.train_length, train_config.batch_size

    def step(i: int) -> None:
        x, y = (t.to(device) for t in batch_at(train_tokens, i, 0, batch, length))
        given = {"positions": random_positions(0, i, batch, length, model.random_positions).to(device)} \
            if model.random_positions else {}         # VARIANT:random_positions=N trains at drawn positions
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = forward(x, **given)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step, batch * length


def tokens_per_second(spec: str, precision: str, backend: str, preset: str, steps: int, warmup: int,
                      train_tokens: torch.Tensor, train_length: int | None = None, device: str = "cpu",
                      mode: str = "eager") -> float:
    step, tokens = make_step(spec, precision, backend, preset, train_tokens, train_length, device, mode)
    return tokens / statistics.median(interleaved({spec: step}, steps, warmup, device)[spec])


def paired_ratio(spec: str, precision: str, backend: str, preset: str, steps: int, warmup: int,
                 train_tokens: torch.Tensor, train_length: int | None = None, device: str = "cpu",
                 baseline: str = "none") -> tuple[float, float, float]:
    """Step time of `spec` over that of `baseline` (same backend and precision), the two models
    stepped in alternation on the same batches (order swapped every pair): median, min, max of the
    per-pair ratios, which a shared CPU's drift between minutes does not move."""
    ours, _ = make_step(spec, precision, backend, preset, train_tokens, train_length, device)
    base, _ = make_step(baseline, precision, backend, preset, train_tokens, train_length, device)
    times = interleaved({"ours": ours, "base": base}, steps, warmup, device)
    ratios = paired(times["ours"], times["base"])
    return statistics.median(ratios), ratios[0], ratios[-1]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=positions.names())
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--backends", nargs="+", default=["auto", "reference"])
    parser.add_argument("--preset", default="quick")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--paired", action="store_true",
                        help="instead: each variant's step time over --baseline's, stepped in alternation")
    parser.add_argument("--baseline", default="none",
                        help="the variant --paired divides by (alibi, to time alibi:random_positions=8192's dense bias)")
    parser.add_argument("--train-length", type=int, default=None, help="override the preset's (same tokens per step)")
    parser.add_argument("--modes", nargs="+", default=["eager"], choices=["eager", "compile"],
                        help="eager, and/or the model under torch.compile")
    args = parser.parse_args(argv)
    train_tokens = torch.from_numpy(load_splits(None).train)
    console = Console()
    length = args.train_length or resolve(args.preset)[0].train_length
    table = Table(title=f"Training throughput, preset {args.preset}, length {length} (median step of {args.steps})",
                  title_justify="left")
    for column in ("variant", "backend", "mode", "precision", "tokens/s", "vs fp32"):
        table.add_column(column, justify="left" if column in ("variant", "backend", "mode", "precision") else "right")
    if args.paired:
        paired = Table(title=f"Training step time over {args.baseline}'s, stepped in alternation, preset {args.preset}, "
                             f"length {length} (median of {args.steps} pairs)", title_justify="left")
        for column in ("variant", "backend", "precision", f"x {args.baseline}", "range"):
            paired.add_column(column, justify="left" if column in ("variant", "backend", "precision") else "right")
        for spec in [v for v in args.variants if v != args.baseline]:
            for backend in args.backends:
                for precision in args.precisions:
                    ratio, low, high = paired_ratio(spec, precision, backend, args.preset, args.steps, args.warmup,
                                                    train_tokens, args.train_length, args.device, args.baseline)
                    paired.add_row(spec, backend, precision, f"{ratio:.2f}x", f"{low:.2f}-{high:.2f}")
                    console.print(f"{spec:<14} {backend:<10} {precision:<5} {ratio:.2f}x {args.baseline} ({low:.2f}-{high:.2f})")
        console.print(paired)
        return 0
    for spec in args.variants:
        for backend in args.backends:
            for mode in args.modes:
                base = None
                for precision in args.precisions:
                    rate = tokens_per_second(spec, precision, backend, args.preset, args.steps,
                                             args.warmup + (2 if mode == "compile" else 0), train_tokens,
                                             args.train_length, args.device, mode)
                    base = rate if precision == "fp32" else base
                    ratio = f"{rate / base:.2f}x" if base else ""
                    table.add_row(spec, backend, mode, precision, f"{rate:,.0f}", ratio)
                    console.print(f"{spec:<12} {backend:<10} {mode:<7} {precision:<5} {rate:>10,.0f} tokens/s {ratio}")
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
