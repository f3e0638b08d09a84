"""The dry run's composed step time and memory estimate against the configured model's own.

`relbench train --dry-run` never builds the configured model: a step's time is composed from the
variant's model at one and two layers with a small vocabulary, the vocabulary's share (measured
once) and the batch (relbench/cli/dryrun.py says how), and the memory estimate is composed the
same way (relbench/cost/memory.py). This script builds the configured model too, times its steps
at the same batch in the same run, probes its saved tensors whole, and prints the ratios.

    python benchmarks/dry_run.py                                  # paper preset, five variants, batch 1
    python benchmarks/dry_run.py --preset quick --batch 32 --variants xl alibi
    python benchmarks/dry_run.py --variants alibi --no-memory     # times only

A ratio near 1.00 says the composition holds; each time is the fastest of --steps steps after a
warm-up, as in the dry run. The "dry run" column is the wall time the dry run spent on the variant.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import relbench  # noqa: F401  (first: sets the OpenMP wait policy before torch loads)

# isort: split
import torch
from rich.console import Console
from rich.table import Table

from relbench import config
from relbench.cli import dryrun
from relbench.cost import memory, resident
from relbench.training.step import position_lr


def whole_step(spec: str, exp, device: torch.device, batch: int, steps: int) -> float:
    """Seconds of one training step of the configured model at `batch` (fastest of `steps`)."""
    model_config = dataclasses.replace(exp.model, position=spec, attention=exp.train.attention)
    train = dataclasses.replace(exp.train, position_lr_scale=position_lr(spec, exp.train)[0])
    timer = dryrun.StepTimer(model_config, train, device, model_config.n_layers, model_config.vocab_size)
    timer.step(batch, model_config.train_length)              # warm-up at the timed shape
    times, started = [], time.perf_counter()
    while len(times) < steps or (len(times) < dryrun.MOST_ROUNDS and time.perf_counter() - started < 2.0):
        times.append(sum(timer.step(batch, model_config.train_length)))
    return min(times)


def whole_memory(spec: str, exp, batch: int) -> int:
    """training_bytes (on CPU) with the saved tensors probed on the configured model itself."""
    model = dataclasses.replace(exp.model, position=spec, attention=exp.train.attention)
    per_row, shared = memory.probe_line(model, exp.train.precision)
    weights = memory.FLOAT * 4 * memory.parameter_count(model)
    step = memory.with_backward(model, batch, weights, batch * per_row + shared)
    return resident.process_bytes(model, batch, exp.train.precision, step, batch * per_row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="paper")
    parser.add_argument("--variants", nargs="+", default=["alibi", "xl", "fire", "t5", "rope"])
    parser.add_argument("--batch", type=int, default=1, help="the batch both are timed at (default 1)")
    parser.add_argument("--steps", type=int, default=dryrun.DRY_STEPS, help="at least this many (both)")
    parser.add_argument("--precision", default=None, help="default: the preset's")
    parser.add_argument("--no-memory", action="store_true", help="skip the whole-model memory probe")
    args = parser.parse_args()

    exp = config.experiment(args.preset)
    train = dataclasses.replace(exp.train, batch_size=args.batch, precision=args.precision or exp.train.precision)
    exp = dataclasses.replace(exp, train=train)
    device = torch.device("cpu")
    m = exp.model
    console = Console()
    console.print(f"preset {args.preset}: {m.n_layers} layers, d {m.d_model}, vocabulary {m.vocab_size:,}, length "
                  f"{m.train_length}, batch {args.batch}, {train.precision}, {torch.get_num_threads()} thread(s)")
    started = time.perf_counter()
    vocabulary = dryrun.vocabulary_seconds(exp, device, args.steps)
    console.print(f"vocabulary's share measured once in {time.perf_counter() - started:.1f} s: "
                  f"{vocabulary[0]:.3f} s per step, {vocabulary[1] * m.train_length:.3f} s per sequence")
    table = Table("variant", "timed at", "composed s/step", "whole s/step", "ratio", "dry run", "composed memory",
                  "whole memory", "ratio", title="composed / whole model")
    ratios = []
    for spec in args.variants:
        memory.saved_line.cache_clear()
        started = time.perf_counter()
        composed = dryrun.measure(spec, exp, device, args.steps, vocabulary)
        spent = time.perf_counter() - started
        whole = whole_step(spec, exp, device, args.batch, args.steps)
        ratios.append(composed["seconds_per_step"] / whole)
        cells = [spec, str(composed["micro_batch"]), f"{composed['seconds_per_step']:.3f}", f"{whole:.3f}",
                 f"{ratios[-1]:.2f}", f"{spent:.1f} s"]
        if args.no_memory:
            cells += ["", "", ""]
        else:
            need = whole_memory(spec, exp, args.batch)
            cells += [memory.human(composed["memory_bytes"]), memory.human(need),
                      f"{composed['memory_bytes'] / need:.3f}"]
        table.add_row(*cells)
        console.print(json.dumps({"variant": spec, "composed": composed["seconds_per_step"], "whole": whole}))
    console.print(table)
    console.print(f"step time ratios {min(ratios):.2f}-{max(ratios):.2f} (composed / whole model)")


if __name__ == "__main__":
    main()
