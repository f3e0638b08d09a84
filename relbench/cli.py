"""The relbench command line. Parses and validates, calls the library, prints; no maths here.

The commands that make and read a run are here (train, tune-lr, extrapolate, report, bench); the
others are in cli_tools.py, the shared options and checks in cli_common.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import torch
import typer

from relbench import checkpoints, memory, positions, report, results
from relbench import cli_tools  # noqa: F401  (registers variants, profile and inspect)
from relbench.attention import check, flush_denormals
from relbench.cli_common import (Attention, Device, Lengths, MaxTrainTokens, PositionLR, Precision, RunDir, Stream,
                                 TokenizerName, Variants, _check_backend, all_variants, app, console,
                                 position_lr_overrides, resolve_device, unique)
from relbench.cli_group import spread_variadic  # noqa: F401  (part of the module's API)
from relbench.config import (DEFAULT_PRESET, PRESETS, EvalConfig, ModelConfig, TrainConfig, resolve,
                             resolve_precision, to_dict)
from relbench.errors import RelbenchError, UsageError, unknown


def _check_training_memory(specs: list[str], model: ModelConfig, train: TrainConfig, preset: str,
                           device: torch.device) -> None:
    """Refuse a batch or length the device cannot hold, naming the hungriest variant, before any work."""
    memory.require(memory.model_bytes(model), device, f"a model of d_model {model.d_model} x {model.n_layers} layers",
                   "use a smaller preset")
    need = {spec: memory.training_bytes(dataclasses.replace(model, position=spec, attention=train.attention),
                                        train.batch_size, train.precision) for spec in specs}
    hungriest = max(need, key=need.get)
    memory.require(need[hungriest], device, f"training {hungriest} at --batch-size {train.batch_size} x --train-length "
                   f"{model.train_length} (preset {preset})", "use a smaller --batch-size or --train-length")


def _train(run_dir: Path, variants: list[str] | None, preset: str, dataset: str | None, seeds: list[int] | None,
           steps: int | None, train_length: int | None, batch_size: int | None, lr: float | None,
           device: str, force: bool, attention: str = "auto", precision: str | None = None,
           position_lr_scale: str | None = None, untuned: bool = False, tokenizer: str = "bytes",
           stream: bool = False, max_train_tokens: int | None = None) -> dict[str, Any]:
    from relbench.data import RUN_DATA_DEFAULTS, load_splits
    from relbench.train import train_run

    specs = all_variants(variants)
    model_config, train_config, eval_config = resolve(
        preset, model={"train_length": train_length},
        train={"steps": steps, "batch_size": batch_size, "lr": lr, "attention": attention, "precision": precision,
               **position_lr_overrides(position_lr_scale), **({"position_lr_scales": {}} if untuned else {})})
    seeds = unique("seed", seeds or [0])
    target = resolve_device(device)
    train_config.precision = resolve_precision(train_config.precision, target)
    for spec in specs:  # an impossible backend for a variant fails here, before any work
        _check_backend(attention, spec, model_config, target, training=True)
    splits = load_splits(dataset, tokenizer, stream=stream, max_train_tokens=max_train_tokens, console=console)
    model_config = dataclasses.replace(model_config, vocab_size=splits.tokenizer.vocab_size)
    _check_training_memory(specs, model_config, train_config, preset, target)
    run_config = {"preset": preset, "model": to_dict(model_config), "train": to_dict(train_config),
                  "eval": to_dict(eval_config), "dataset": dataset or "sotu", "tokenizer": splits.tokenizer.name,
                  "tokenizer_fingerprint": splits.tokenizer.fingerprint, "stream": stream,
                  "max_train_tokens": max_train_tokens, "dataset_description": splits.description}
    run_config["model"].pop("position")
    run_config["model"].pop("attention")
    run_config["train"].pop("seed")
    config_path = Path(run_dir) / results.CONFIG
    if config_path.is_file():
        old = results.read_json(config_path)
        differs = [key for key in ("model", "train", "dataset", "tokenizer", "stream", "max_train_tokens")
                   if old.get(key, RUN_DATA_DEFAULTS.get(key)) != run_config[key]]
        if differs:
            raise UsageError(f"{run_dir} holds a run with a different {' and '.join(differs)} configuration "
                             f"(preset {old.get('preset')}); use another --run-dir, or delete {run_dir} to start over")
        known = old.get("variants", [])
        run_config["variants"] = known + [s for s in specs if s not in known]
        run_config["seeds"] = sorted(set(old.get("seeds", [])) | set(seeds))
    else:
        run_config["variants"], run_config["seeds"] = specs, seeds
    run_config["environment"] = results.environment(str(target))
    results.write_json(config_path, run_config)
    console.print(f"training {len(specs)} variant(s) x {len(seeds)} seed(s) on {splits.description}: "
                  f"{splits.sizes()['train']:,} train tokens; run directory {run_dir}")
    train_run(Path(run_dir), specs, seeds, run_config, splits, target, force, console)
    return run_config


@app.command("train")
def train_command(
    variants: Variants = None,
    preset: Annotated[str, typer.Option(help=f"Named preset: {', '.join(PRESETS)}.")] = DEFAULT_PRESET,
    dataset: Annotated[str | None, typer.Option(help="A .txt file or folder of .txt files, .jsonl/.parquet with a "
                                                "text column, a datasets save_to_disk folder, or a hub name "
                                                "name[:config]. Default: the embedded corpus.")] = None,
    tokenizer: TokenizerName = "bytes",
    stream: Stream = False,
    max_train_tokens: MaxTrainTokens = None,
    run_dir: RunDir = results.DEFAULT_RUN_DIR,
    seeds: Annotated[list[int] | None, typer.Option(help="Seeds (initialisation and data order); each variant is "
                                                    "trained once per seed. Default: 0.")] = None,
    steps: Annotated[int | None, typer.Option(help="Optimiser steps (overrides the preset).")] = None,
    train_length: Annotated[int | None, typer.Option(help="Training context length (overrides the preset).")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Sequences per step (overrides the preset).")] = None,
    lr: Annotated[float | None, typer.Option(help="Peak learning rate (overrides the preset).")] = None,
    attention: Attention = "auto",
    precision: Precision | None = None,
    position_lr_scale: PositionLR = None,
    device: Device = "auto",
    force: Annotated[bool, typer.Option(help="Train again variants that already have a finished checkpoint.")] = False,
) -> None:
    """Train one small causal LM per variant, with the same seed, data order and batches.

    Example: relbench train --variants xl t5 alibi --preset quick --tokenizer bpe:4096
    """
    with results.RunLock(run_dir):
        _train(run_dir, variants, preset, dataset, seeds, steps, train_length, batch_size, lr, device, force,
               attention, precision, position_lr_scale, tokenizer=tokenizer, stream=stream,
               max_train_tokens=max_train_tokens)


@app.command("tune-lr")
def tune_lr_command(
    variants: Variants = None,
    grid: Annotated[list[float] | None, typer.Option(help="Multipliers to try (default: 1 3 10 30 100).")] = None,
    preset: Annotated[str, typer.Option(help=f"Named preset: {', '.join(PRESETS)}.")] = DEFAULT_PRESET,
    dataset: Annotated[str | None, typer.Option(help="As for `relbench train` (default: the embedded corpus).")] = None,
    tokenizer: TokenizerName = "bytes",
    stream: Stream = False,
    max_train_tokens: MaxTrainTokens = None,
    run_dir: Annotated[Path, typer.Option("--run-dir", help="Run directory of the sweep.")] = Path("runs") / "lr-sweep",
    seeds: Annotated[list[int] | None, typer.Option(help="Seeds per multiplier (default: 0).")] = None,
    steps: Annotated[int | None, typer.Option(help="Optimiser steps (overrides the preset).")] = None,
    device: Device = "auto",
) -> None:
    """Choose each variant's learning-rate multiplier for its position parameters: train it at every
    multiplier of the grid and keep the one with the lowest validation loss at the training length.

    Writes RUN/lr_sweep.csv (the sensitivity table) and RUN/position_lr.json (the choices), which
    `relbench train --position-lr-scale RUN/position_lr.json` uses. Default variants: every one with
    position parameters. An interrupted sweep resumes where it stopped.

    Example: relbench tune-lr --variants xl t5 --grid 1 3 10 30 --run-dir runs/lr-sweep
    """
    from relbench import tune

    model_config, _, _ = resolve(preset)
    shape = dict(n_heads=model_config.n_heads, head_dim=model_config.head_dim, d_model=model_config.d_model,
                 train_length=model_config.train_length)
    specs = all_variants(variants or tune.learned_variants(shape))
    grid = tune.validate_grid(list(grid or tune.GRID))
    seeds = unique("seed", seeds or [0])
    grid_specs = [tune.grid_spec(spec, scale) for spec in specs for scale in grid]
    with results.RunLock(run_dir):
        config = _train(run_dir, grid_specs, preset, dataset, seeds, steps, None, None, None, device, False,
                        untuned=True,  # every grid spec sets its own multiplier; the preset's table plays no part
                        tokenizer=tokenizer, stream=stream, max_train_tokens=max_train_tokens)
        frame = tune.collect(run_dir, specs, grid, seeds)
        chosen = tune.write(run_dir, frame, config)
    console.print(report.rich_table("Validation loss at the training length per position learning-rate multiplier "
                                    "(* chosen)", *tune.table(frame)))
    console.print(f"chosen: {', '.join(f'{v} x{s:g}' for v, s in chosen['chosen'].items())}; wrote "
                  f"{run_dir / tune.SWEEP_CSV} and {run_dir / tune.CHOICE_JSON}")


def _extrapolate(run_dir: Path, lengths: list[int] | None, variants: list[str] | None, attention: str,
                 eval_tokens: int | None, device: str, seeds: list[int] | None = None,
                 modes: list[str] | None = None, stride: int | None = None, force: bool = False,
                 tasks: list[str] | None = None, trials: int | None = None) -> None:
    from relbench.data import load_run_splits
    from relbench.evaluate import MODES, longest_length, scored_text, validate_lengths
    from relbench.extrapolate import extrapolate_run
    from relbench.tasks import TASKS

    config = results.require_run(run_dir)
    check(attention)
    modes = unique("mode", modes or ["nonoverlap"])
    for mode in modes:
        if mode not in MODES:
            raise unknown("evaluation mode", mode, list(MODES))
    eval_config = EvalConfig(**{**config.get("eval", {}), **({"eval_tokens": eval_tokens} if eval_tokens else {})})
    tasks = unique("task", tasks or eval_config.tasks)
    for task in tasks:
        if task not in TASKS:
            raise unknown("task", task, list(TASKS))
    trials = eval_config.trials if trials is None else trials
    if trials < 1:
        raise UsageError(f"--trials must be positive, got {trials}")
    target = resolve_device(device)
    train_length = int(config["model"]["train_length"])
    specs = variants if variants else config.get("variants", [])
    for spec in specs:
        positions.parse_spec(spec)
    seeds = unique("seed", seeds) if seeds else config.get("seeds", [0])
    pairs = [(s, seed) for seed in seeds for s in specs]
    trained = [(s, seed) for s, seed in pairs
               if (checkpoints.read_meta(results.checkpoint_dir(run_dir, s, seed)) or {}).get("finished")]
    missing = [p for p in pairs if p not in trained]
    if (variants or config.get("seeds") != seeds) and missing:
        spec, seed = missing[0]
        raise RelbenchError(f"variant {spec} seed {seed} has no finished checkpoint in {run_dir}; "
                            f"run `relbench train --run-dir {run_dir} --variants {spec} --seeds {seed}`")
    if not trained:
        raise RelbenchError(f"{run_dir} has no trained variant yet; run `relbench train --run-dir {run_dir}`")
    model_config = ModelConfig(**config["model"])
    for spec in dict.fromkeys(s for s, _ in trained):
        _check_backend(attention, spec, model_config, target, training=False)
    splits = load_run_splits(config, console)
    for spec, seed in trained:
        checkpoints.check_tokenizer(results.checkpoint_dir(run_dir, spec, seed), splits.tokenizer)
    lengths = validate_lengths(list(lengths) if lengths else [m * train_length for m in eval_config.length_multiples],
                               longest_length(splits.test.size))
    stride = stride if stride is not None else max(1, train_length // 2)
    if stride < 1:
        raise UsageError(f"--stride must be positive, got {stride}")
    text = scored_text(splits.test, lengths, eval_config.eval_tokens, splits.tokenizer.token_bytes)
    console.print(f"evaluating {len(trained)} checkpoint(s) at lengths {', '.join(map(str, lengths))}: "
                  f"{', '.join(tasks)}; perplexity {' and '.join(modes)}{f' (stride {stride})' if 'sliding' in modes else ''} "
                  f"on {text.n_tokens:,} test tokens in {len(text.offsets)} segments spread over the test split "
                  f"({attention} attention, {target})")
    with flush_denormals():
        extrapolate_run(Path(run_dir), trained, lengths, modes, stride, text, eval_config, attention, target, console,
                        force, tuple(tasks), trials, splits.tokenizer)


@app.command("extrapolate")
def extrapolate_command(
    lengths: Lengths = None,
    variants: Variants = None,
    run_dir: RunDir = results.DEFAULT_RUN_DIR,
    task: Annotated[list[str] | None, typer.Option(help="perplexity, copy, passkey, or several (default: the "
                                                   "preset's: perplexity and copy for the language-model presets, "
                                                   "passkey for retrieval).")] = None,
    mode: Annotated[list[str] | None, typer.Option(help="nonoverlap, sliding, or both (default: nonoverlap).")] = None,
    stride: Annotated[int | None, typer.Option(help="Sliding mode: tokens scored per window; each scored token "
                                                "sees at least length - stride of context (default: half the "
                                                "training length).")] = None,
    trials: Annotated[int | None, typer.Option(help="copy: trials per distance; passkey: trials per length and "
                                                 "depth (default: the preset's).")] = None,
    seeds: Annotated[list[int] | None, typer.Option(help="Seeds to evaluate (default: every trained seed).")] = None,
    attention: Attention = "auto",
    eval_tokens: Annotated[int | None, typer.Option(help="Scored test tokens per length (default: the preset's).")] = None,
    device: Device = "auto",
    force: Annotated[bool, typer.Option(help="Recompute rows that are already in the CSVs.")] = False,
) -> None:
    """Perplexity of every trained variant at growing lengths and the cost of bias and attention;
    with --task, also whether the model uses distant context (copy) and retrieves a key (passkey).

    Writes extrapolation.csv (one row per variant x seed x length x protocol, with a bootstrap
    interval over windows), positions.csv (the loss in log-spaced bins of the position inside the
    window), copy.csv (loss ratio with / without an earlier copy of the text, per distance) and
    passkey.csv (accuracy per length and depth).

    Example: relbench extrapolate --lengths 256 1024 4096 --task perplexity copy passkey --mode nonoverlap sliding
    """
    if eval_tokens is not None and eval_tokens < 1:
        raise UsageError("--eval-tokens must be positive")
    results.require_run(run_dir)
    with results.RunLock(run_dir):
        _extrapolate(run_dir, lengths, variants, attention, eval_tokens, device, seeds, mode, stride, force, task,
                     trials)


@app.command("report")
def report_command(run_dir: RunDir = results.DEFAULT_RUN_DIR) -> None:
    """Tables of a run: perplexity by length, cost, training; writes report.md and a pivoted CSV.

    Example: relbench report --run-dir runs/default
    """
    if not Path(run_dir).is_dir():
        results.require_run(run_dir)  # says the directory does not exist
    with results.RunLock(run_dir):
        _report(run_dir)


def _report(run_dir: Path) -> None:
    written = report.render(run_dir, console)
    console.print("wrote " + ", ".join(str(path) for path in written.values()))


@app.command("bench")
def bench_command(
    variants: Variants = None,
    preset: Annotated[str, typer.Option(help=f"Named preset: {', '.join(PRESETS)}.")] = DEFAULT_PRESET,
    lengths: Lengths = None,
    run_dir: RunDir = results.DEFAULT_RUN_DIR,
    position_lr_scale: PositionLR = None,
    tokenizer: TokenizerName = "bytes",
    max_train_tokens: MaxTrainTokens = None,
    device: Device = "auto",
) -> None:
    """Train, extrapolate and report in one go on the embedded corpus (the default preset: quick).

    Example: relbench bench        (all 16 variants, lengths 256 1024 4096; after its first training steps it
    prints how long the training should take on this machine; the README quotes measured times per CPU)
    """
    with results.RunLock(run_dir):
        config = _train(run_dir, variants, preset, None, None, None, None, None, None, device, False,
                        position_lr_scale=position_lr_scale, tokenizer=tokenizer, max_train_tokens=max_train_tokens)
        _extrapolate(run_dir, lengths, variants or config["variants"], "auto", None, device)
        _report(run_dir)


def main() -> None:
    app()

