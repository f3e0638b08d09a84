"""The relbench command line. Parses and validates, calls the library, prints; no maths here."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import torch
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from relbench import checkpoints, memory, positions, report, results
from relbench.attention import BACKENDS, check
from relbench.cli_group import Group, spread_variadic  # noqa: F401  (spread_variadic: part of the module's API)
from relbench.config import (DEFAULT_PRESET, PRECISIONS, PRESETS, EvalConfig, ModelConfig, TrainConfig, resolve,
                             resolve_precision, to_dict)
from relbench.errors import RelbenchError, UsageError, unknown

console = Console()

app = typer.Typer(cls=Group, add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Benchmark position encodings: train short, test long, measure the cost.")

RunDir = Annotated[Path, typer.Option("--run-dir", help="Run directory shared by train, extrapolate and report.")]
Device = Annotated[str, typer.Option(help="auto (CUDA when available, else CPU), cpu, cuda or cuda:N.")]
Variants = Annotated[list[str] | None, typer.Option(
    help='Variant specs, e.g. xl alibi "t5:bidirectional=true" (default: all). See `relbench variants`.')]
Lengths = Annotated[list[int] | None, typer.Option(help="Evaluation lengths (default: 1x, 4x, 16x the training length).")]
Attention = Annotated[str, typer.Option(help=f"Attention backend: {', '.join(BACKENDS)} (auto: the fastest exact "
                                                 "path for the device and mode).")]
Precision = Annotated[str, typer.Option(help=f"Training precision: {', '.join(PRECISIONS)} (bf16: autocast of "
                                                 "matrix products, fp32 weights; auto: bf16 where the hardware "
                                                 "has it natively, so results depend on the host). Default: fp32.")]
PositionLR = Annotated[str | None, typer.Option(help="Learning-rate multiplier of the position parameters: a number "
                                                "for every variant, or the position_lr.json of a `relbench tune-lr` "
                                                "sweep (per variant). Default: the preset's tuned multipliers; a "
                                                "variant's own option wins (xl:position_lr_scale=10).")]


def _check_backend(backend: str, spec: str, model: ModelConfig, device: torch.device, training: bool) -> None:
    enc = positions.build_spec(spec, n_heads=model.n_heads, head_dim=model.head_dim, d_model=model.d_model,
                               train_length=model.train_length)
    try:
        check(backend, enc, device, training)
    except UsageError as error:
        raise UsageError(f"{spec}: {error}") from None


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f'unknown device "{name}"; use auto, cpu, cuda or cuda:N') from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("CUDA is not available on this machine; use --device cpu")
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f'device "{name}" is not supported; use auto, cpu, cuda or cuda:N')
    return device


def all_variants(variants: list[str] | None) -> list[str]:
    specs = variants or positions.names()
    for spec in specs:
        positions.parse_spec(spec)  # unknown names and options fail here, before any work
    if len(set(specs)) != len(specs):
        raise UsageError(f"variant {next(s for s in specs if specs.count(s) > 1)} is given twice")
    return specs


@app.command("variants")
def variants_command(
    heads: Annotated[int, typer.Option(help="Attention heads per layer.")] = 8,
    head_dim: Annotated[int, typer.Option(help="Channels per head.")] = 64,
    layers: Annotated[int, typer.Option(help="Layers, for the total parameter count.")] = 4,
    train_length: Annotated[int, typer.Option(help="Training length (learned embeddings' size).")] = 256,
) -> None:
    """List every position variant with its family, formula and parameter count.

    Example: relbench variants --heads 8 --head-dim 64 --layers 12
    """
    if min(heads, head_dim, layers, train_length) < 1:
        raise UsageError("--heads, --head-dim, --layers and --train-length must be positive")
    described = ModelConfig(d_model=heads * head_dim, n_layers=layers, n_heads=heads, position="learned",
                            train_length=train_length)
    memory.require(memory.model_bytes(described), "cpu", f"a model of {layers} layers x {heads} heads x {head_dim} "
                   f"channels (training length {train_length})", "use smaller --heads, --head-dim, --layers or --train-length")
    table = Table(title=f"Position variants ({heads} heads x {head_dim} channels, {layers} layers)", title_justify="left")
    for column in ("name", "family", "formula", "params", "options"):
        table.add_column(column, justify="right" if column == "params" else "left")
    for name in positions.names():
        enc = positions.build(name, n_heads=heads, head_dim=head_dim, train_length=train_length)
        per = enc.n_params()
        params = f"{per:,} (one table)" if enc.shared_across_layers else f"{per * layers:,} ({layers} x {per:,})"
        options = ", ".join(f"{k}={p.default}" for k, p in type(enc).options().items())
        table.add_row(escape(name), enc.family, escape(enc.formula), params if per else "0", escape(options))
    console.print(table)


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


def position_lr_overrides(value: str | None) -> dict[str, Any]:
    """--position-lr-scale: a number (every variant) or a tune-lr position_lr.json (per variant)."""
    if value is None:
        return {}
    try:
        scale = float(value)
    except ValueError:
        from relbench.tune import read_choice

        return {"position_lr_scales": read_choice(Path(value))}
    if not (scale > 0 and scale < float("inf")):
        raise UsageError(f"--position-lr-scale must be a positive number or a position_lr.json, got {value}")
    return {"position_lr_scale": scale}


def _train(run_dir: Path, variants: list[str] | None, preset: str, dataset: str | None, seeds: list[int] | None,
           steps: int | None, train_length: int | None, batch_size: int | None, lr: float | None,
           device: str, force: bool, attention: str = "auto", precision: str | None = None,
           position_lr_scale: str | None = None) -> dict[str, Any]:
    from relbench.data import load_splits
    from relbench.train import train_run

    specs = all_variants(variants)
    model_config, train_config, eval_config = resolve(
        preset, model={"train_length": train_length},
        train={"steps": steps, "batch_size": batch_size, "lr": lr, "attention": attention, "precision": precision,
               **position_lr_overrides(position_lr_scale)})
    seeds = unique("seed", seeds or [0])
    target = resolve_device(device)
    train_config.precision = resolve_precision(train_config.precision, target)
    for spec in specs:  # an impossible backend for a variant fails here, before any work
        _check_backend(attention, spec, model_config, target, training=True)
    _check_training_memory(specs, model_config, train_config, preset, target)
    splits = load_splits(dataset)
    run_config = {"preset": preset, "model": to_dict(model_config), "train": to_dict(train_config),
                  "eval": to_dict(eval_config), "dataset": dataset or "sotu", "tokenizer": splits.tokenizer.name,
                  "dataset_description": splits.description}
    run_config["model"].pop("position")
    run_config["model"].pop("attention")
    run_config["train"].pop("seed")
    config_path = Path(run_dir) / results.CONFIG
    if config_path.is_file():
        old = results.read_json(config_path)
        differs = [key for key in ("model", "train", "dataset", "tokenizer") if old.get(key) != run_config[key]]
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
                                                "text column, or a hub name name[:config]. Default: the embedded corpus.")] = None,
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

    Example: relbench train --variants xl t5 alibi --preset quick
    """
    with results.RunLock(run_dir):
        _train(run_dir, variants, preset, dataset, seeds, steps, train_length, batch_size, lr, device, force,
               attention, precision, position_lr_scale)


@app.command("tune-lr")
def tune_lr_command(
    variants: Variants = None,
    grid: Annotated[list[float] | None, typer.Option(help="Multipliers to try (default: 1 3 10 30).")] = None,
    preset: Annotated[str, typer.Option(help=f"Named preset: {', '.join(PRESETS)}.")] = DEFAULT_PRESET,
    dataset: Annotated[str | None, typer.Option(help="As for `relbench train` (default: the embedded corpus).")] = None,
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
        config = _train(run_dir, grid_specs, preset, dataset, seeds, steps, None, None, None, device, False)
        frame = tune.collect(run_dir, specs, grid, seeds)
        chosen = tune.write(run_dir, frame, config)
    console.print(report.rich_table("Validation loss at the training length per position learning-rate multiplier "
                                    "(* chosen)", *tune.table(frame)))
    console.print(f"chosen: {', '.join(f'{v} x{s:g}' for v, s in chosen['chosen'].items())}; wrote "
                  f"{run_dir / tune.SWEEP_CSV} and {run_dir / tune.CHOICE_JSON}")


def _extrapolate(run_dir: Path, lengths: list[int] | None, variants: list[str] | None, attention: str,
                 eval_tokens: int | None, device: str, seeds: list[int] | None = None,
                 modes: list[str] | None = None, stride: int | None = None, force: bool = False) -> None:
    from relbench.data import load_splits
    from relbench.evaluate import MODES, extrapolate_run, scored_stream, validate_lengths

    config = results.require_run(run_dir)
    check(attention)
    modes = unique("mode", modes or ["nonoverlap"])
    for mode in modes:
        if mode not in MODES:
            raise unknown("evaluation mode", mode, list(MODES))
    target = resolve_device(device)
    # ALiBi-like biases leave ~1.5% of the softmax probabilities subnormal; flushing them to zero
    # changes no perplexity digit and made those paths 1.4-2.2x faster (../shared/PERF_NOTES.md)
    torch.set_flush_denormal(True)
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
    splits = load_splits(None if config["dataset"] == "sotu" else config["dataset"])
    lengths = validate_lengths(list(lengths) if lengths else [train_length, 4 * train_length, 16 * train_length],
                               splits.test.size - 1)
    stride = stride if stride is not None else max(1, train_length // 2)
    if stride < 1:
        raise UsageError(f"--stride must be positive, got {stride}")
    eval_config = EvalConfig(**{**config.get("eval", {}), **({"eval_tokens": eval_tokens} if eval_tokens else {})})
    stream = scored_stream(splits.test, lengths, eval_config.eval_tokens)
    console.print(f"evaluating {len(trained)} checkpoint(s) at lengths {', '.join(map(str, lengths))} "
                  f"({', '.join(modes)}{f', stride {stride}' if 'sliding' in modes else ''}) on "
                  f"{stream.numel() - 1:,} test tokens ({attention} attention, {target})")
    extrapolate_run(Path(run_dir), trained, lengths, modes, stride, stream, eval_config, attention, target, console,
                    force)


def unique(what: str, values: list) -> list:
    if len(set(values)) != len(values):
        raise UsageError(f"{what} {next(v for v in values if values.count(v) > 1)} is given twice; give each once")
    return list(values)


@app.command("extrapolate")
def extrapolate_command(
    lengths: Lengths = None,
    variants: Variants = None,
    run_dir: RunDir = results.DEFAULT_RUN_DIR,
    mode: Annotated[list[str] | None, typer.Option(help="nonoverlap, sliding, or both (default: nonoverlap).")] = None,
    stride: Annotated[int | None, typer.Option(help="Sliding mode: tokens scored per window; each scored token "
                                                "sees at least length - stride of context (default: half the "
                                                "training length).")] = None,
    seeds: Annotated[list[int] | None, typer.Option(help="Seeds to evaluate (default: every trained seed).")] = None,
    attention: Attention = "auto",
    eval_tokens: Annotated[int | None, typer.Option(help="Scored test tokens per length (default: the preset's).")] = None,
    device: Device = "auto",
    force: Annotated[bool, typer.Option(help="Recompute rows that are already in extrapolation.csv.")] = False,
) -> None:
    """Perplexity of every trained variant at growing lengths, and the cost of bias and attention.

    Writes extrapolation.csv (one row per variant x seed x length x mode) and positions.csv (the
    loss in log-spaced bins of the position inside the window).

    Example: relbench extrapolate --lengths 256 1024 4096 --mode nonoverlap sliding --stride 128
    """
    if eval_tokens is not None and eval_tokens < 1:
        raise UsageError("--eval-tokens must be positive")
    results.require_run(run_dir)
    with results.RunLock(run_dir):
        _extrapolate(run_dir, lengths, variants, attention, eval_tokens, device, seeds, mode, stride, force)


@app.command("profile")
def profile_command(
    lengths: Annotated[list[int] | None, typer.Option(help="Lengths to profile.")] = None,
    variants: Variants = None,
    attention: Annotated[list[str] | None, typer.Option(help=f"Backends to profile (default: all of "
                                                        f"{', '.join(BACKENDS)}).")] = None,
    batch: Annotated[int, typer.Option(help="Batch size.")] = 1,
    heads: Annotated[int, typer.Option(help="Attention heads.")] = 8,
    head_dim: Annotated[int, typer.Option(help="Channels per head.")] = 64,
    repeats: Annotated[int, typer.Option(help="Timed repeats (median, min and max are reported).")] = 5,
    train_max: Annotated[int, typer.Option(help="Also time forward+backward at lengths up to this.")] = 2048,
    timeout: Annotated[float, typer.Option(help="Seconds allowed per configuration.")] = 900.0,
    run_dir: RunDir = results.DEFAULT_RUN_DIR,
    device: Device = "auto",
) -> None:
    """Time and peak memory of bias construction and attention, per variant x backend x length.

    No training needed. Each configuration runs in a fresh process on CPU; one that runs out of
    memory is recorded as oom and the rest continue. Writes RUN/profile.csv, which `report` shows.

    Example: relbench profile --lengths 1024 4096 16384 --variants xl t5 alibi --attention reference split
    """
    from relbench.evaluate import validate_lengths
    from relbench.profile import PROFILE_CSV, profile_run

    if min(batch, heads, head_dim, repeats) < 1:
        raise UsageError("--batch, --heads, --head-dim and --repeats must be positive")
    lengths = validate_lengths(list(lengths) if lengths else [1024, 4096, 16384], 1 << 22)
    specs = all_variants(variants)
    backends = list(dict.fromkeys(attention or BACKENDS))
    for backend in backends:
        check(backend)
    target = resolve_device(device)
    with results.RunLock(run_dir):
        table = profile_run(Path(run_dir) / PROFILE_CSV, specs, backends, lengths, batch, heads, head_dim, str(target),
                            repeats, train_max, timeout, console)
    mine = (table["batch"] == batch) & (table["heads"] == heads) & (table["head_dim"] == head_dim) & \
        (table["device"] == str(target))
    console.print(report.rich_table(f"Profile ({target}, batch {batch}, {heads} heads x {head_dim})",
                                    *report.profile_table(table[mine])))
    console.print(f"wrote {Path(run_dir) / PROFILE_CSV}")


@app.command("inspect")
def inspect_command(
    run: Annotated[Path, typer.Argument(help="Run directory.")] = results.DEFAULT_RUN_DIR,
    variants: Variants = None,
    seed: Annotated[int | None, typer.Option(help="Seed to inspect (default: the run's first).")] = None,
    lengths: Annotated[list[int] | None, typer.Option(help="Lengths (default: 1x and 16x the training length).")] = None,
    device: Device = "auto",
) -> None:
    """Diagnostics of trained variants: bias size against q.k logits per layer and head, the
    gradient reaching the bias parameters at the end of training, and how far attention reaches.

    Example: relbench inspect runs/default --variants xl t5
    """
    from relbench.data import load_splits
    from relbench.evaluate import validate_lengths
    from relbench.inspect import INSPECT_CSV, inspect_run, tables

    config = results.require_run(run)
    seed = config.get("seeds", [0])[0] if seed is None else seed
    specs = variants or config.get("variants", [])
    for spec in specs:
        positions.parse_spec(spec)
        meta = checkpoints.read_meta(results.checkpoint_dir(run, spec, seed))
        if not meta or not meta.get("finished"):
            raise RelbenchError(f"variant {spec} seed {seed} has no finished checkpoint in {run}; "
                                f"run `relbench train --run-dir {run} --variants {spec} --seeds {seed}`")
    train_length = int(config["model"]["train_length"])
    splits = load_splits(None if config["dataset"] == "sotu" else config["dataset"])
    lengths = validate_lengths(list(lengths) if lengths else [train_length, 16 * train_length], splits.test.size)
    with results.RunLock(run):
        frame = inspect_run(Path(run), specs, seed, lengths, torch.from_numpy(splits.test), resolve_device(device))
        results.write_csv(Path(run) / INSPECT_CSV, frame)
    for title, header, body in tables(frame, lengths):
        console.print(report.rich_table(title, header, body))
    console.print(f"wrote {Path(run) / INSPECT_CSV}")


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
    device: Device = "auto",
) -> None:
    """Train, extrapolate and report in one go on the embedded corpus (the default preset: quick).

    Example: relbench bench        (all 16 variants, lengths 256 1024 4096, about 14 minutes on 2 cores)
    """
    with results.RunLock(run_dir):
        config = _train(run_dir, variants, preset, None, None, None, None, None, None, device, False,
                        position_lr_scale=position_lr_scale)
        _extrapolate(run_dir, lengths, variants or config["variants"], "auto", None, device)
        _report(run_dir)


def main() -> None:
    app()

