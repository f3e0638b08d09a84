"""The relbench command line. Parses and validates, calls the library, prints; no maths here.

The commands that make and read a run are here (train, tune-lr, extrapolate, finetune, report), what
they do in cli/pipeline.py; bench in cli/bench.py; the others in cli/tools.py and cli/scheme.py, the
shared options and checks in cli/common.py."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated, Any

import typer

from relbench.cli import bench as cli_bench  # noqa: F401  (registers bench)
from relbench.cli import scheme as cli_scheme  # noqa: F401  (registers check and new-variant)
from relbench.cli import tools as cli_tools  # noqa: F401  (registers variants, profile and inspect)
from relbench.cli.common import (
    AcceptPluginChange,
    Attention,
    ConfigFile,
    Device,
    Lengths,
    Log,
    MaxTrainTokens,
    PluginFiles,
    PositionLR,
    Precision,
    Preset,
    RunDir,
    Stream,
    TokenizerName,
    TrainAttention,
    TrainJobs,
    Variants,
    all_variants,
    app,
    command_experiment,
    console,
    position_lr_overrides,
    resolve_device,
    trained_variants,
    unique,
    use_plugins,
)
from relbench.cli.group import say_interrupted, spread_variadic  # noqa: F401  (spread_variadic: part of the module's API)
from relbench.cli.pipeline import dry_run_experiment, extrapolate_runs, report_run, train_runs
from relbench.comparisons import MARGIN
from relbench.config import experiment, read_file
from relbench.errors import UsageError
from relbench.reporting import report
from relbench.runs import distributed, results, rundir


@app.command("train")
def train_command(
    variants: Variants = None,
    preset: Preset = None,
    config: ConfigFile = None,
    dataset: Annotated[str | None, typer.Option(help="A .txt file or folder of .txt files, .jsonl/.parquet with a "
                                                "text column, a datasets save_to_disk folder, or a hub name "
                                                "name[:config]. Default: the embedded corpus.")] = None,
    tokenizer: TokenizerName = None,
    stream: Stream = None,
    max_train_tokens: MaxTrainTokens = None,
    run_dir: RunDir = results.DEFAULT_RUN_DIR,
    seeds: Annotated[list[int] | None, typer.Option(help="Seeds (initialisation and data order); each variant is "
                                                    "trained once per seed. Default: 0.")] = None,
    steps: Annotated[int | None, typer.Option(help="Optimiser steps (overrides the preset).")] = None,
    train_length: Annotated[int | None, typer.Option(help="Training context length (overrides the preset).")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Sequences per step (overrides the preset).")] = None,
    lr: Annotated[float | None, typer.Option(help="Peak learning rate (overrides the preset).")] = None,
    attention: TrainAttention = None,
    precision: Precision | None = None,
    position_lr_scale: PositionLR = None,
    device: Device = "auto",
    force: Annotated[bool, typer.Option(help="Train again variants that already have a finished checkpoint.")] = False,
    log: Log = "none",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print parameters, tokens, the memory estimate and "
                                          "seconds per step measured over a few steps, and the projected wall "
                                          "time; then exit without training or writing anything.")] = False,
    plugin: PluginFiles = None,
    jobs: TrainJobs = "1",
) -> None:
    """Train one small causal LM per variant, with the same seed, data order and batches.

    Example: relbench train --variants xl t5 alibi --preset quick --tokenizer bpe:4096
             relbench train --config experiment.toml --steps 800      (options override the file)
             relbench train --preset paper --variants alibi --dry-run
             relbench train --preset retrieval --jobs auto   (one run per core, side by side)
    """
    use_plugins(plugin)
    exp, specs, seeds = command_experiment(
        preset, config, variants, seeds, model={"train_length": train_length},
        data={"dataset": dataset, "tokenizer": tokenizer, "stream": stream, "max_train_tokens": max_train_tokens},
        train={"steps": steps, "batch_size": batch_size, "lr": lr, "attention": attention, "precision": precision,
               **position_lr_overrides(position_lr_scale)})
    specs = trained_variants(specs)
    if dry_run:
        return dry_run_experiment(exp, specs, seeds, device, jobs)
    with rundir.RunLock(run_dir):
        train_runs(run_dir, exp, specs, seeds, device, force, log, jobs)


@app.command("tune-lr")
def tune_lr_command(
    variants: Variants = None,
    grid: Annotated[list[float] | None, typer.Option(help="Multipliers to try (default: 1 3 10 30 100).")] = None,
    preset: Preset = None,
    config: ConfigFile = None,
    dataset: Annotated[str | None, typer.Option(help="As for `relbench train` (default: the embedded corpus).")] = None,
    tokenizer: TokenizerName = None,
    stream: Stream = None,
    max_train_tokens: MaxTrainTokens = None,
    run_dir: Annotated[Path, typer.Option("--run-dir", help="Run directory of the sweep.")] = Path("runs") / "lr-sweep",
    seeds: Annotated[list[int] | None, typer.Option(help="Seeds per multiplier (default: 0).")] = None,
    steps: Annotated[int | None, typer.Option(help="Optimiser steps (overrides the preset).")] = None,
    device: Device = "auto",
    plugin: PluginFiles = None,
) -> None:
    """Choose each variant's learning-rate multiplier for its position parameters: train it at every
    multiplier of the grid and keep the one with the lowest validation loss at the training length.

    Writes RUN/lr_sweep.csv (the sensitivity table) and RUN/position_lr.json (the choices), which
    `relbench train --position-lr-scale RUN/position_lr.json` uses. Default variants: every one with
    position parameters. An interrupted sweep resumes where it stopped.

    Example: relbench tune-lr --variants xl t5 --grid 1 3 10 30 --run-dir runs/lr-sweep
    """
    use_plugins(plugin)
    from relbench.training import tune

    # every grid spec sets its own multiplier; the preset's table plays no part
    exp = experiment(preset, config, {"data": {"dataset": dataset, "tokenizer": tokenizer, "stream": stream,
                                               "max_train_tokens": max_train_tokens},
                                      "train": {"steps": steps, "position_lr_scales": {}}})
    shape = {"n_heads": exp.model.n_heads, "head_dim": exp.model.head_dim, "d_model": exp.model.d_model,
                 "train_length": exp.model.train_length}
    specs = all_variants(variants or exp.variants or tune.learned_variants(shape))
    grid = tune.validate_grid(list(grid or tune.GRID))
    seeds = unique("seed", seeds or exp.seeds or [0])
    grid_specs = [tune.grid_spec(spec, scale) for spec in specs for scale in grid]
    with rundir.RunLock(run_dir):
        config = train_runs(run_dir, exp, all_variants(grid_specs), seeds, device, False)

        def choose() -> tuple[Any, dict[str, Any]]:
            frame = tune.collect(run_dir, specs, grid, seeds)
            return frame, tune.write(run_dir, frame, config)

        frame, chosen = distributed.on_main(choose)   # rank 0 reads the sweep and writes the choice
    console.print(report.rich_table("Validation loss at the training length per position learning-rate multiplier "
                                    "(* chosen)", *tune.table(frame)))
    console.print(f"chosen: {', '.join(f'{v} x{s:g}' for v, s in chosen['chosen'].items())}; wrote "
                  f"{run_dir / tune.SWEEP_CSV} and {run_dir / tune.CHOICE_JSON}")


@app.command("extrapolate")
def extrapolate_command(
    lengths: Lengths = None,
    variants: Variants = None,
    run_dir: RunDir = results.DEFAULT_RUN_DIR,
    task: Annotated[list[str] | None, typer.Option(help="perplexity, copy, or a retrieval task (passkey, mqar, "
                                                   "flipflop, tracking, needles: relbench/tasks), or several "
                                                   "(default: the preset's: perplexity and copy for the "
                                                   "language-model presets, the task trained on for the others).")] = None,
    mode: Annotated[list[str] | None, typer.Option(help="nonoverlap, sliding, or both (default: nonoverlap).")] = None,
    stride: Annotated[int | None, typer.Option(help="Sliding mode: tokens scored per window; each scored token "
                                                "sees at least length - stride of context (default: half the "
                                                "training length).")] = None,
    trials: Annotated[int | None, typer.Option(help="copy: trials per distance; a retrieval task: trials per "
                                                 "length and condition, e.g. passkey's depth (default: the "
                                                 "preset's).")] = None,
    seeds: Annotated[list[int] | None, typer.Option(help="Seeds to evaluate (default: every trained seed).")] = None,
    config: Annotated[Path | None, typer.Option("--config", help="An experiment file (TOML): its variants, seeds "
                                                "and [eval] table (tasks, lengths, trials, eval_tokens) replace the "
                                                "run's; options given here override it.")] = None,
    attention: Attention = "auto",
    eval_tokens: Annotated[int | None, typer.Option(help="Scored test tokens per length (default: the preset's).")] = None,
    device: Device = "auto",
    force: Annotated[bool, typer.Option(help="Recompute rows that are already in the CSVs.")] = False,
    not_learned: Annotated[bool, typer.Option("--not-learned", help="Also evaluate a retrieval task on models trained "
                                              "to criterion on it that did not learn it (skipped by default: "
                                              "their accuracy beyond the training length says nothing).")] = False,
    plugin: PluginFiles = None,
    accept_plugin_change: AcceptPluginChange = False,
) -> None:
    """Perplexity of every trained variant at growing lengths and the cost of bias and attention;
    with --task, also whether the model uses distant context (copy) and a retrieval task's accuracy
    (passkey: does it retrieve a key stated once; mqar, flipflop, tracking, needles: relbench/tasks).

    Writes extrapolation.csv (one row per variant x seed x length x protocol, with a bootstrap
    interval over windows), positions.csv (the loss in log-spaced bins of the position inside the
    window), copy.csv (loss ratio with an earlier copy of the text / with unrelated text there, per distance) and
    each retrieval task's CSV (passkey.csv: accuracy per length and depth; a binned task's per distance too).

    Example: relbench extrapolate --lengths 256 1024 4096 --task perplexity copy passkey --mode nonoverlap sliding
    """
    use_plugins(plugin, accept_plugin_change)
    if eval_tokens is not None and eval_tokens < 1:
        raise UsageError("--eval-tokens must be positive")
    rundir.require_run(run_dir)
    file = read_file(config) if config is not None else {}
    with rundir.RunLock(run_dir):
        extrapolate_runs(run_dir, lengths, variants or file.get("variants"), attention, eval_tokens, device,
                     seeds or file.get("seeds"), mode, stride, force, task, trials, file.get("eval"), not_learned)


@app.command("finetune")
def finetune_command(
    length: Annotated[int, typer.Option(help="Target length: fine-tune at this many tokens per sequence (longer "
                                        "than training; the training length itself is the control run).")],
    steps: Annotated[int, typer.Option(help="Fine-tuning steps (PI used 1000, YaRN 400).")],
    variants: Annotated[list[str] | None, typer.Option(help="Trained variants to fine-tune (default: every one "
                                                       "with a finished checkpoint that can reach --length); "
                                                       "VARIANT@FORM fine-tunes under an evaluation form "
                                                       "(rope@pi: PI's protocol).")] = None,
    seeds: Annotated[list[int] | None, typer.Option(help="Seeds (default: every trained seed).")] = None,
    lr: Annotated[float | None, typer.Option(help="Peak learning rate (default: the variant's training peak, with "
                                             "its position multiplier).")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Sequences per step (default: training's tokens per step "
                                                   "/ --length).")] = None,
    run_dir: RunDir = results.DEFAULT_RUN_DIR,
    device: Device = "auto",
    force: Annotated[bool, typer.Option(help="Fine-tune again checkpoints already fine-tuned at --length.")] = False,
    plugin: PluginFiles = None,
    accept_plugin_change: AcceptPluginChange = False,
) -> None:
    """Continue training every trained variant at a longer length; `extrapolate` then evaluates
    VARIANT+ftLENGTH beside VARIANT and `report` shows zero-shot against fine-tuned.

    Fresh AdamW, training's schedule over --steps (short warm-up), batches by training's rule continued
    after its last step; writes RUN/checkpoints/VARIANT+ftLENGTH-seedS/ and RUN/finetune.csv. Ctrl-C
    saves a resumable state; running the same command again resumes.

    Example: relbench finetune --length 1024 --steps 200 && relbench extrapolate --lengths 256 1024 4096
    """
    use_plugins(plugin, accept_plugin_change)
    from relbench.training.finetune import finetune_run

    rundir.require_run(run_dir)
    target = resolve_device(device)
    with rundir.RunLock(run_dir):
        finetune_run(run_dir, length, steps, variants, unique("seed", seeds) if seeds else None, lr, batch_size,
                     target, force, console)


@app.command("report")
def report_command(run_dir: RunDir = results.DEFAULT_RUN_DIR, plugin: PluginFiles = None,
                   accept_plugin_change: AcceptPluginChange = False,
                   margin: Annotated[float, typer.Option(help="Equivalence margin of the retrieval comparisons: two "
                                                              "schemes are equivalent when the 95% interval of their "
                                                              "paired difference lies within +-margin (accuracy, 0.1 = "
                                                              "10 points).")] = MARGIN) -> None:
    """Tables of a run: retrieval tiers first, perplexity by length, cost, training; writes report.md,
    a pivoted CSV and each retrieval task's pairwise comparisons (<task>_comparisons.csv).

    Example: relbench report --run-dir runs/default --margin 0.05
    """
    if not 0 < margin < 1:
        raise UsageError(f"--margin must be between 0 and 1 (a share of accuracy: 0.1 is 10 points), got {margin}")
    use_plugins(plugin, accept_plugin_change)
    if not Path(run_dir).is_dir():
        rundir.require_run(run_dir)  # says the directory does not exist
    with rundir.RunLock(run_dir):
        report_run(run_dir, margin)


@app.command("merge")
def merge_command(
    runs: Annotated[list[Path], typer.Argument(help="Run directories to fold into --run-dir.", show_default=False)],
    run_dir: RunDir = results.DEFAULT_RUN_DIR,
    replace: Annotated[bool, typer.Option(help="Where a folded run and --run-dir both hold a row or checkpoint and "
                                               "they differ, keep the folded run's (default: stop, write nothing).")]
    = False,
    seeds: Annotated[list[int] | None, typer.Option(help="Fold only these seeds of the runs named (default: all).")]
    = None,
    variants: Annotated[list[str] | None, typer.Option(help="Fold only these variants of the runs named (default: "
                                                            "all).")] = None,
) -> None:
    """Fold runs made side by side (two processes, machines or cluster jobs, each in its own run
    directory with the same configuration) into one: checkpoints, train.csv and every table
    `extrapolate` writes, and the variants and seeds in config.json, with each source's machine
    recorded. Then `report` sees them all. profile.csv and inspect.csv are not folded.

    --seeds and --variants fold only those seeds and variants of the runs named (rows and checkpoints).

    Example: relbench merge runs/worker-a runs/worker-b --run-dir runs/all
             relbench merge runs/host-b --seeds 4 5 --run-dir runs/all
    """
    from relbench.evaluation.extrapolate import result_tables
    from relbench.runs.merge import merge_runs

    distributed.single_process("merge")
    with contextlib.ExitStack() as locks:
        for run in dict.fromkeys(Path(r).resolve() for r in [run_dir, *runs]):   # each folder once
            if run.is_dir() or run == Path(run_dir).resolve():
                locks.enter_context(rundir.RunLock(run))
        done = merge_runs(run_dir, list(runs), result_tables(), replace,
                          unique("seed", seeds) if seeds else None, list(variants) if variants else None)
    for name in sorted(done.added):
        if done.added[name] or done.replaced.get(name):
            console.print(f"{name}: {done.added[name]} added, {done.replaced.get(name, 0)} replaced")
    now = rundir.require_run(run_dir)
    console.print(f"{len(done.checkpoints)} checkpoint(s) copied; {run_dir} now holds "
                  f"{', '.join(now['variants'])} (seeds {' '.join(map(str, now['seeds']))}); "
                  f"next: relbench report --run-dir {run_dir}")


def main() -> None:
    """The command line. A Ctrl-C inside a command is the command's to handle (training saves, then
    exits 130); one that lands while the process winds down (the process group closing, the
    interpreter exiting) ends it the same way, without a traceback: by then everything is saved."""
    try:
        with distributed.session():                   # a process group under torchrun, nothing otherwise
            console.quiet = not distributed.is_main()  # rank 0 speaks for the job (progress, tables, messages)
            app()
    except KeyboardInterrupt:
        ignore_interrupts()
        say_interrupted()
        sys.exit(130)
    finally:
        ignore_interrupts()   # the command has returned or raised: nothing is left for a Ctrl-C to stop


def ignore_interrupts() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)

