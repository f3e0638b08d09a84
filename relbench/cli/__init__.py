"""The relbench command line. Parses and validates, calls the library, prints; no maths here.

The commands that make and read a run are here (train, tune-lr, extrapolate, report, bench); the
others are in cli/tools.py, the shared options and checks in cli/common.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer

from relbench.attention import check, flush_denormals
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
    Variants,
    all_variants,
    app,
    check_training_memory,
    check_variant_backend,
    command_experiment,
    console,
    position_lr_overrides,
    resolve_device,
    trained_variants,
    unique,
    use_plugins,
)
from relbench.cli.group import spread_variadic  # noqa: F401  (part of the module's API)
from relbench.config import EvalConfig, Experiment, ModelConfig, experiment, read_file, resolve_precision
from relbench.cost import memory
from relbench.errors import RelbenchError, UsageError, unknown
from relbench.positions import forms
from relbench.reporting import report
from relbench.runs import checkpoints, distributed, results, tracking


def _train(run_dir: Path, exp: Experiment, specs: list[str], seeds: list[int], device: str, force: bool,
           log: str = "none") -> dict[str, Any]:
    from relbench.data import load_data
    from relbench.training.train import train_run

    target = resolve_device(device)
    # rank 0 logs; a missing package fails here, before any work
    logger = tracking.open_logger(log, run_dir) if distributed.is_main() else None
    model_config, train_config = exp.model, exp.train
    train_config.precision = resolve_precision(train_config.precision, target)
    for spec in specs:  # an impossible backend for a variant fails here, before any work
        check_variant_backend(train_config.attention, spec, model_config, target, training=True)
    splits = load_data(exp.data, console)
    exp.model.vocab_size = splits.tokenizer.vocab_size   # the model's vocabulary follows the tokenizer
    check_training_memory(specs, model_config, train_config, exp.preset, target)
    run_config = distributed.on_main(results.record_run, run_dir, results.run_config(exp, specs, seeds, splits), specs,
                                     seeds, target, exp.description)
    console.print(f"training {len(specs)} variant(s) x {len(seeds)} seed(s) on {splits.description}: "
                  f"{splits.sizes()['train']:,} train tokens; run directory {run_dir}"
                  + (f"; {distributed.world()} processes" if distributed.world() > 1 else ""))
    train_run(Path(run_dir), specs, seeds, run_config, splits, target, force, console, logger)
    return run_config


def _dry_run(exp: Experiment, specs: list[str], seeds: list[int], device: str) -> None:
    from relbench.cli import dryrun

    target = resolve_device(device)
    exp.train.precision = resolve_precision(exp.train.precision, target)
    dryrun.plan_vocabulary(exp, console)
    for spec in specs:
        check_variant_backend(exp.train.attention, spec, exp.model, target, training=True)
    memory.require(memory.model_bytes(exp.model), target, f"a model of d_model {exp.model.d_model} x "
                   f"{exp.model.n_layers} layers", "use a smaller preset")   # the batch's fit is in the table
    dryrun.report(exp, specs, seeds, target, console)


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
) -> None:
    """Train one small causal LM per variant, with the same seed, data order and batches.

    Example: relbench train --variants xl t5 alibi --preset quick --tokenizer bpe:4096
             relbench train --config experiment.toml --steps 800      (options override the file)
             relbench train --preset paper --variants alibi --dry-run
    """
    use_plugins(plugin)
    exp, specs, seeds = command_experiment(
        preset, config, variants, seeds, model={"train_length": train_length},
        data={"dataset": dataset, "tokenizer": tokenizer, "stream": stream, "max_train_tokens": max_train_tokens},
        train={"steps": steps, "batch_size": batch_size, "lr": lr, "attention": attention, "precision": precision,
               **position_lr_overrides(position_lr_scale)})
    specs = trained_variants(specs)
    if dry_run:
        return _dry_run(exp, specs, seeds, device)
    with results.RunLock(run_dir):
        _train(run_dir, exp, specs, seeds, device, force, log)


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
    with results.RunLock(run_dir):
        config = _train(run_dir, exp, all_variants(grid_specs), seeds, device, False)

        def choose() -> tuple[Any, dict[str, Any]]:
            frame = tune.collect(run_dir, specs, grid, seeds)
            return frame, tune.write(run_dir, frame, config)

        frame, chosen = distributed.on_main(choose)   # rank 0 reads the sweep and writes the choice
    console.print(report.rich_table("Validation loss at the training length per position learning-rate multiplier "
                                    "(* chosen)", *tune.table(frame)))
    console.print(f"chosen: {', '.join(f'{v} x{s:g}' for v, s in chosen['chosen'].items())}; wrote "
                  f"{run_dir / tune.SWEEP_CSV} and {run_dir / tune.CHOICE_JSON}")


def _extrapolate(run_dir: Path, lengths: list[int] | None, variants: list[str] | None, attention: str,
                 eval_tokens: int | None, device: str, seeds: list[int] | None = None,
                 modes: list[str] | None = None, stride: int | None = None, force: bool = False,
                 tasks: list[str] | None = None, trials: int | None = None,
                 eval_overrides: dict[str, Any] | None = None, not_learned: bool = False) -> None:
    from relbench.data import load_run_splits
    from relbench.evaluation.extrapolate import Job, extrapolate_run
    from relbench.evaluation.perplexity import MODES, longest_length, scored_text, validate_lengths
    from relbench.tasks import get_task

    config = results.require_run(run_dir)
    check(attention)
    modes = unique("mode", modes or ["nonoverlap"])
    for mode in modes:
        if mode not in MODES:
            raise unknown("evaluation mode", mode, list(MODES))
    eval_config = EvalConfig(**{**config.get("eval", {}), **(eval_overrides or {}),
                                **({"eval_tokens": eval_tokens} if eval_tokens else {})})
    tasks = unique("task", tasks or eval_config.tasks)
    for task in tasks:
        get_task(task)
    trials = eval_config.trials if trials is None else trials
    if trials < 1:
        raise UsageError(f"--trials must be positive, got {trials}")
    target = resolve_device(device)
    train_length = int(config["model"]["train_length"])
    specs = variants if variants else config.get("variants", []) + list(config.get("finetune", {}))
    for spec in specs:
        forms.parse_form(spec)   # the variant, and the evaluation form after "@" if any
    seeds = unique("seed", seeds) if seeds else config.get("seeds", [0])
    pairs = [(s, seed) for seed in seeds for s in specs]
    trained = distributed.on_main(_finished, run_dir, pairs, bool(variants or config.get("seeds") != seeds))
    model_config = ModelConfig(**config["model"])
    for spec in specs:
        forms.check_spec(spec, **model_config.position_shape)
    for spec in dict.fromkeys(forms.scheme_spec(s) for s, _ in trained):
        check_variant_backend(attention, spec, model_config, target, training=False)
    splits = load_run_splits(config, console)
    for spec, seed in trained:
        checkpoints.check_tokenizer(results.checkpoint_dir(run_dir, forms.trained_spec(spec), seed), splits.tokenizer)
    lengths = validate_lengths(list(lengths or eval_config.lengths or [m * train_length for m in eval_config.length_multiples]),
                               longest_length(splits.test.size))
    stride = stride if stride is not None else max(1, train_length // 2)
    if stride < 1:
        raise UsageError(f"--stride must be positive, got {stride}")
    text = scored_text(splits.test, lengths, eval_config.eval_tokens, splits.tokenizer.token_bytes)
    console.print(f"evaluating {len(trained)} checkpoint(s) at lengths {', '.join(map(str, lengths))}: "
                  f"{', '.join(tasks)}; perplexity {' and '.join(modes)}{f' (stride {stride})' if 'sliding' in modes else ''} "
                  f"on {text.n_tokens:,} test tokens in {len(text.offsets)} segments spread over the test split "
                  f"({attention} attention, {target})"
                  + (f"; shared by {distributed.world()} processes" if distributed.world() > 1 else ""))
    job = Job(text, tuple(lengths), tuple(modes), stride, tuple(tasks), trials, eval_config.max_batch_tokens, attention,
              target, splits.tokenizer, force, mqar_pairs=Job.trained_pairs(config), not_learned=not_learned)
    with flush_denormals():
        extrapolate_run(Path(run_dir), trained, job, console)


def _finished(run_dir: Path, pairs: list[tuple[str, int]], named: bool) -> list[tuple[str, int]]:
    """The (variant, seed) pairs with a finished checkpoint; an error when there is none, or when
    one that was `named` (by --variants or --seeds) has not finished."""
    trained = [(s, seed) for s, seed in pairs
               if (checkpoints.read_meta(results.checkpoint_dir(run_dir, forms.trained_spec(s), seed)) or {}).get("finished")]
    missing = [p for p in pairs if p not in trained]
    if named and missing:
        spec, seed = missing[0]
        base = forms.trained_spec(spec)
        evaluated = f" (evaluated as {spec})" if base != spec else ""
        length = forms.finetune_length(spec)
        fix = (f"relbench train --run-dir {run_dir} --variants {base}" if length is None else
               f"relbench finetune --run-dir {run_dir} --length {length} --variants {forms.tuned_spec(spec)}")
        raise RelbenchError(f"variant {base} seed {seed}{evaluated} has no finished checkpoint in {run_dir}; "
                            f"run `{fix} --seeds {seed}`")
    if not trained:
        raise RelbenchError(f"{run_dir} has no trained variant yet; run `relbench train --run-dir {run_dir}`")
    return trained


@app.command("extrapolate")
def extrapolate_command(
    lengths: Lengths = None,
    variants: Variants = None,
    run_dir: RunDir = results.DEFAULT_RUN_DIR,
    task: Annotated[list[str] | None, typer.Option(help="perplexity, copy, passkey, mqar, or several (default: "
                                                   "the preset's: perplexity and copy for the language-model "
                                                   "presets, passkey and mqar for retrieval).")] = None,
    mode: Annotated[list[str] | None, typer.Option(help="nonoverlap, sliding, or both (default: nonoverlap).")] = None,
    stride: Annotated[int | None, typer.Option(help="Sliding mode: tokens scored per window; each scored token "
                                                "sees at least length - stride of context (default: half the "
                                                "training length).")] = None,
    trials: Annotated[int | None, typer.Option(help="copy: trials per distance; passkey and mqar: trials per "
                                                 "length and depth (default: the preset's).")] = None,
    seeds: Annotated[list[int] | None, typer.Option(help="Seeds to evaluate (default: every trained seed).")] = None,
    config: Annotated[Path | None, typer.Option("--config", help="An experiment file (TOML): its variants, seeds "
                                                "and [eval] table (tasks, lengths, trials, eval_tokens) replace the "
                                                "run's; options given here override it.")] = None,
    attention: Attention = "auto",
    eval_tokens: Annotated[int | None, typer.Option(help="Scored test tokens per length (default: the preset's).")] = None,
    device: Device = "auto",
    force: Annotated[bool, typer.Option(help="Recompute rows that are already in the CSVs.")] = False,
    not_learned: Annotated[bool, typer.Option("--not-learned", help="Also evaluate passkey or mqar on models trained "
                                              "to criterion on it that did not learn it (skipped by default: "
                                              "their accuracy beyond the training length says nothing).")] = False,
    plugin: PluginFiles = None,
    accept_plugin_change: AcceptPluginChange = False,
) -> None:
    """Perplexity of every trained variant at growing lengths and the cost of bias and attention;
    with --task, also whether the model uses distant context (copy) and retrieves a key (passkey).

    Writes extrapolation.csv (one row per variant x seed x length x protocol, with a bootstrap
    interval over windows), positions.csv (the loss in log-spaced bins of the position inside the
    window), copy.csv (loss ratio with an earlier copy of the text / with unrelated text there, per distance) and
    passkey.csv (accuracy per length and depth).

    Example: relbench extrapolate --lengths 256 1024 4096 --task perplexity copy passkey --mode nonoverlap sliding
    """
    use_plugins(plugin, accept_plugin_change)
    if eval_tokens is not None and eval_tokens < 1:
        raise UsageError("--eval-tokens must be positive")
    results.require_run(run_dir)
    file = read_file(config) if config is not None else {}
    with results.RunLock(run_dir):
        _extrapolate(run_dir, lengths, variants or file.get("variants"), attention, eval_tokens, device,
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

    results.require_run(run_dir)
    target = resolve_device(device)
    with results.RunLock(run_dir):
        finetune_run(run_dir, length, steps, variants, unique("seed", seeds) if seeds else None, lr, batch_size,
                     target, force, console)


@app.command("report")
def report_command(run_dir: RunDir = results.DEFAULT_RUN_DIR, plugin: PluginFiles = None,
                   accept_plugin_change: AcceptPluginChange = False) -> None:
    """Tables of a run: perplexity by length, cost, training; writes report.md and a pivoted CSV.

    Example: relbench report --run-dir runs/default
    """
    use_plugins(plugin, accept_plugin_change)
    if not Path(run_dir).is_dir():
        results.require_run(run_dir)  # says the directory does not exist
    with results.RunLock(run_dir):
        _report(run_dir)


def _report(run_dir: Path) -> None:
    distributed.on_main(_render, run_dir)   # rank 0 writes; under torchrun the others wait for it


def _render(run_dir: Path) -> None:
    written = report.render(run_dir, console)
    console.print("wrote " + ", ".join(str(path) for path in written.values()))


TRACKS = ("all", "lm", "retrieval")
RETRIEVAL_PRESET = "retrieval"


@app.command("bench")
def bench_command(
    variants: Variants = None,
    preset: Preset = None,
    config: ConfigFile = None,
    lengths: Lengths = None,
    track: Annotated[str, typer.Option(help="all (default): the language-model track (perplexity, copy; --preset, "
                                       "default quick) and the retrieval track (models trained to criterion on "
                                       "passkey and MQAR, their reach at 1x-64x: the language-model preset's retrieval "
                                       "preset, `retrieval` unless it names another, with the same variants and seeds, "
                                       "in RUN/retrieval); lm or retrieval: one of them (with --track "
                                       "retrieval, --preset/--config name the retrieval setup).")] = "all",
    retrieval_config: Annotated[Path | None, typer.Option("--retrieval-config", help="With --track all: an "
                                                          "experiment file (TOML) for the retrieval track instead "
                                                          "of the retrieval preset (its variants and seeds are "
                                                          "still the language-model track's).")] = None,
    run_dir: RunDir = results.DEFAULT_RUN_DIR,
    position_lr_scale: PositionLR = None,
    device: Device = "auto",
    log: Log = "none",
    tokenizer: TokenizerName = None,
    max_train_tokens: MaxTrainTokens = None,
    plugin: PluginFiles = None,
) -> None:
    """Train, extrapolate and report in one go (default: both tracks on the embedded corpus).

    The report opens with one table: per variant, the perplexity ratio at 16x, whether the language
    model uses distant context, passkey and MQAR reach over the seeds that learned, steps to learn,
    and the attention cost at 4x. Before training, bench prints its expected time for each track.

    Example: relbench bench        (the quick preset's 16 variants and their retrieval track; the README quotes
    measured times per CPU)
             relbench bench --track lm --config examples/three-schemes.toml
             relbench bench --track retrieval --variants alibi rope xl t5
    """
    use_plugins(plugin)
    from relbench.reporting.overview import RETRIEVAL_TRACK

    if track not in TRACKS:
        raise unknown("track", track, list(TRACKS))
    if retrieval_config is not None and track != "all":
        raise UsageError("--retrieval-config sets the retrieval track of --track all; with --track retrieval give "
                         "the file as --config")
    data = {"tokenizer": tokenizer, "max_train_tokens": max_train_tokens}
    overrides = position_lr_overrides(position_lr_scale)
    runs = []   # (run directory, experiment, specs, seeds, eval overrides)
    if track in ("all", "lm"):
        exp, specs, seeds = command_experiment(preset, config, variants, train=overrides, data=data)
        if exp.train.task != "lm":
            raise UsageError(f"preset {exp.preset} trains on {exp.train.task}, not language modelling; use --track "
                             f"retrieval for it, or a language-model preset (quick, standard) with --track {track}")
        runs.append((Path(run_dir), exp, specs, seeds, read_file(config).get("eval") if config is not None else None))
    if track in ("all", "retrieval"):
        own = track == "retrieval"
        file, named = (config, preset) if own else (retrieval_config, None if retrieval_config else runs[0][1].retrieval)
        base = named or (read_file(file).get("preset") if file is not None else None) or RETRIEVAL_PRESET
        rexp, rspecs, rseeds = command_experiment(base, file, variants if own or not runs else trained_variants(runs[0][2]),
                                           None if own or not runs else runs[0][3], train=overrides, data=data)
        if rexp.train.task == "lm":
            raise UsageError(f"preset {rexp.preset} trains a language model; the retrieval track needs a retrieval "
                             f"preset (task passkey or mqar), e.g. --preset {RETRIEVAL_PRESET}")
        runs.append((Path(run_dir) if own else Path(run_dir) / RETRIEVAL_TRACK, rexp, rspecs, rseeds,
                     read_file(file).get("eval") if file is not None else None))
    _announce(runs, device)
    for folder, exp, specs, seeds, evals in runs:
        with results.RunLock(folder):
            _train(folder, exp, trained_variants(specs), seeds, device, False, log)
            _extrapolate(folder, lengths if exp.train.task == "lm" or track == "retrieval" else None, specs, "auto",
                         None, device, seeds, eval_overrides=evals)
    for folder, *_ in reversed(runs):   # the retrieval track first: the language-model report reads it
        with results.RunLock(folder):
            _report(folder)


def _announce(runs: list, device: str) -> None:
    """Print what each track will train and its expected training time, from one step of each of its
    variants measured on this machine now (a retrieval run trained to criterion stops early; its cap
    is the upper bound)."""
    from relbench.cli import dryrun

    target = resolve_device(device)
    for folder, exp, specs, seeds, _ in runs:
        probe = dataclasses.replace(exp, train=dataclasses.replace(
            exp.train, precision=resolve_precision(exp.train.precision, target)))
        per_step = [dryrun.measure(spec, probe, target, steps=1)["seconds_per_step"] for spec in trained_variants(specs)]
        total = sum(per_step) * exp.train.steps * len(seeds)
        what = (f"up to {exp.train.steps:,} steps each, stopping once {exp.train.task} accuracy at length "
                f"{exp.model.train_length} holds {exp.train.criterion_accuracy:.0%}" if exp.train.criterion_accuracy > 0
                else f"{exp.train.steps:,} steps each")
        bound = "at most " if exp.train.criterion_accuracy > 0 else "about "
        console.print(f"{'retrieval' if exp.train.task != 'lm' else 'language-model'} track (preset {exp.preset}, "
                      f"{folder}): {len(per_step)} variant(s) x {len(seeds)} seed(s), {what}; expected training "
                      f"{bound}{dryrun.human_time(total)} on {target} (one step of each variant measured now), then "
                      f"evaluation", markup=False)


def main() -> None:
    with distributed.session():                   # a process group under torchrun, nothing otherwise
        console.quiet = not distributed.is_main()  # rank 0 speaks for the job (progress, tables, messages)
        app()

