"""What every relbench command shares: the app, the console, option types and the checks of
variants, devices, backends and memory, and how a command reads its experiment. Commands live in
cli/__init__.py (train, tune-lr, extrapolate, finetune, report, merge), cli/bench.py (bench),
cli/tools.py (variants, presets, profile, inspect, verify) and cli/scheme.py (check, new-variant)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Annotated, Any

import torch
import typer
from rich.console import Console

from relbench import positions
from relbench.attention import BACKENDS, check
from relbench.cli.group import Group
from relbench.config import PRECISIONS, Experiment, ModelConfig, TrainConfig, experiment
from relbench.cost import memory, resident
from relbench.errors import UsageError
from relbench.positions import forms
from relbench.runs import distributed

# Rich sizes its output to the terminal, and to 80 columns when stdout is a pipe or a file (a CI log,
# `relbench bench | tee`), where the headline table's columns would wrap a cell over several lines:
# there it takes PIPE_WIDTH, unless COLUMNS says otherwise. Tables stay as narrow as their cells.
PIPE_WIDTH = 200


def make_console(file: Any = None) -> Console:
    own = Console(file=file)
    return own if own.is_terminal or os.environ.get("COLUMNS") else Console(file=file, width=PIPE_WIDTH)


console = make_console()

app = typer.Typer(cls=Group, add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Benchmark position encodings: train short, test long, measure the cost.")

RunDir = Annotated[Path, typer.Option("--run-dir", help="Run directory shared by train, extrapolate and report.")]
Device = Annotated[str, typer.Option(help="auto (CUDA when available, else CPU), cpu, cuda or cuda:N.")]
Variants = Annotated[list[str] | None, typer.Option(
    help='Variant specs, e.g. xl alibi "t5:bidirectional=true" (default: all). See `relbench variants`.')]
Lengths = Annotated[list[int] | None, typer.Option(help="Evaluation lengths (default: the preset's multiples of the "
                                                       "training length: 1x, 4x, 16x; retrieval also 64x).")]
Attention = Annotated[str, typer.Option(help=f"Attention backend: {', '.join(BACKENDS)} (auto: the fastest exact "
                                                 "path for the device and mode).")]
Precision = Annotated[str, typer.Option(help=f"Training precision: {', '.join(PRECISIONS)} (bf16: autocast of "
                                                 "matrix products, fp32 weights; auto: bf16 where the hardware "
                                                 "has it natively, so results depend on the host). Default: fp32.")]
TrainAttention = Annotated[str | None, typer.Option("--attention", help=f"Attention backend for training: "
                                                    f"{', '.join(BACKENDS)} (default: the preset's, auto: the "
                                                    "fastest exact path for the device).")]
Preset = Annotated[str | None, typer.Option(help="Named preset, see `relbench presets` (default: the --config "
                                            "file's, else quick).")]
ConfigFile = Annotated[Path | None, typer.Option("--config", help="An experiment file (TOML): preset, variants, "
                                                 "seeds, [data], [model], [train], [eval]; options given on the "
                                                 "command line override it. A run's own RUN/config.toml "
                                                 "reproduces it.")]
Log = Annotated[str, typer.Option(help="Also mirror the loss curves (train.csv) into: none or tensorboard "
                                       "(RUN/tensorboard; needs pip install 'relbench[tensorboard]').")]
PositionLR = Annotated[str | None, typer.Option(help="Learning-rate multiplier of the position parameters: a number "
                                                "for every variant, or the position_lr.json of a `relbench tune-lr` "
                                                "sweep (per variant). Default: the preset's tuned multipliers; a "
                                                "variant's own option wins (xl:position_lr_scale=10).")]

JOBS_HELP = ("Training runs side by side on a CPU, each in a process of its own with an equal share of the "
             "threads (the same weights as alone at that thread count): a number, or auto (as many as the threads "
             "this process may use, the runs to train and the memory allow; 1 on a GPU).")
TrainJobs = Annotated[str, typer.Option("--jobs", help=JOBS_HELP)]


def resolve_jobs(jobs: str, specs: list[str], model: ModelConfig, train: TrainConfig, device: torch.device) -> int:
    """--jobs as a number of side-by-side runs: a positive number, or `auto`. More than one needs a CPU
    and one process (not torchrun); each run then holds its own model and batch, so the memory for
    all of them is checked here, before any work (auto takes as many as fit)."""
    text = str(jobs).strip().lower()
    if text != "auto" and not (text.isdigit() and int(text) > 0):
        raise UsageError(f"--jobs must be a positive number or auto, got {jobs!r}")
    alone = device.type != "cpu" or distributed.world() > 1
    if text == "auto" and alone:
        return 1
    wanted = torch.get_num_threads() if text == "auto" else int(text)
    if wanted > 1 and alone:
        where = "under torchrun" if distributed.world() > 1 else f"on {device}"
        raise UsageError(f"--jobs {wanted} trains runs side by side on a CPU; {where} use --jobs 1")
    if wanted == 1:
        return 1
    one = memory.model_bytes(model) + max(training_need(spec, model, train, train.batch_size, device) for spec in specs) \
        + resident.SIDE_PROCESS   # each run side by side is a process of its own, which loads torch again
    have = memory.budget(device)
    if text == "auto":
        return max(1, min(wanted, have // one)) if have is not None else wanted
    fits = max(1, have // one) if have is not None else wanted
    memory.require(one * wanted, device, f"training {wanted} runs side by side (--jobs {wanted})",
                   f"--jobs {fits} fits" if fits > 1 else "use --jobs 1")
    return wanted


TokenizerName = Annotated[str | None, typer.Option("--tokenizer", help="bytes (raw UTF-8, vocabulary 256), bpe:N (a "
                                                   "byte-level BPE of N tokens trained on the train split, cached; "
                                                   "e.g. bpe:4096), or a byte-level hub tokenizer such as gpt2. The "
                                                   "model's vocabulary follows it. Default: the preset's (bytes).")]
Stream = Annotated[bool | None, typer.Option("--stream/--no-stream", help="Read --dataset (a hub name or a local "
                                             "data file) in order with datasets' streaming and stop once the train "
                                             "split holds --max-train-tokens.")]
PluginFiles = Annotated[list[Path] | None, typer.Option(
    "--plugin", help="A Python file of your own that registers position variants (a PositionEncoding subclass "
                     "with @register); repeat for several. Installed packages register through the entry-point "
                     "group relbench.positions. See `relbench new-variant` and `relbench check`.")]
AcceptPluginChange = Annotated[bool, typer.Option(
    "--accept-plugin-change", help="Use a plugin file the run was trained with although it changed since "
                                   "(its new sha256 is recorded in the run).")]


def use_plugins(files: list[Path] | None, accept_change: bool = False) -> None:
    """Load the command's --plugin files (and every installed plugin) before anything reads a variant
    name; a run the command reads loads its own recorded plugins (rundir.require_run)."""
    from relbench.positions import plugins

    plugins.load_installed()
    plugins.set_command_options(files, accept_change)


MaxTrainTokens = Annotated[int | None, typer.Option(help="Train on the first N tokens of the train split (validation "
                                                         "and test stay whole; with --stream: read until it holds N).")]


def check_variant_backend(backend: str, spec: str, model: ModelConfig, device: torch.device, training: bool) -> None:
    parsed = positions.parse(spec)
    parsed.layers(model.n_layers)                      # a layout repeats to the model's depth
    try:
        for layer in parsed.pattern:
            layer.build(**model.position_shape)        # the spec's options are valid for this shape
            check(backend, layer.cls, device, training)
    except UsageError as error:
        raise UsageError(f"{spec}: {error}") from None


def resolve_device(name: str) -> torch.device:
    """The device `name` means; under torchrun "cuda" is the GPU of this process's local rank."""
    if name == "auto":
        return distributed.local_device(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f'unknown device "{name}"; use auto, cpu, cuda or cuda:N') from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("CUDA is not available on this machine; use --device cpu")
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f'device "{name}" is not supported; use auto, cpu, cuda or cuda:N')
    return distributed.local_device(device)


def all_variants(variants: list[str] | None) -> list[str]:
    specs = variants or positions.names()
    for spec in specs:
        positions.parse(spec)  # unknown names and options fail here, before any work
    if len(set(specs)) != len(specs):
        raise UsageError(f"variant {next(s for s in specs if specs.count(s) > 1)} is given twice")
    return specs


def unique(what: str, values: list) -> list:
    if len(set(values)) != len(values):
        raise UsageError(f"{what} {next(v for v in values if values.count(v) > 1)} is given twice; give each once")
    return list(values)


def position_lr_overrides(value: str | None) -> dict[str, Any]:
    """--position-lr-scale: a number (every variant) or a tune-lr position_lr.json (per variant)."""
    if value is None:
        return {}
    try:
        scale = float(value)
    except ValueError:
        from relbench.training.tune import read_choice

        return {"position_lr_scales": read_choice(Path(value))}
    if not (scale > 0 and scale < float("inf")):
        raise UsageError(f"--position-lr-scale must be a positive number or a position_lr.json, got {value}")
    return {"position_lr_scale": scale}


def training_need(spec: str, model: ModelConfig, train: TrainConfig, rows: int, device: torch.device) -> int:
    """The estimated peak bytes of a training run of `spec` at `rows` sequences on `device`
    (resident.training_bytes): what the memory check and --jobs auto both count per run."""
    return resident.training_bytes(dataclasses.replace(model, position=spec, attention=train.attention), rows,
                                   train.precision, device)


def check_training_memory(specs: list[str], model: ModelConfig, train: TrainConfig, preset: str,
                           device: torch.device) -> None:
    """Refuse a batch or length the device cannot hold, naming the hungriest variant, before any work.
    Under torchrun each process holds its share of the batch, and the processes on one node share its RAM."""
    rows, share = distributed.per_rank(train.batch_size), distributed.sharing(device)
    shared = f" in {share} processes sharing its memory" if share > 1 else ""
    memory.require(memory.model_bytes(model) * share, device, f"a model of d_model {model.d_model} x "
                   f"{model.n_layers} layers{shared}", "use a smaller preset")
    need = {spec: training_need(spec, model, train, rows, device) * share for spec in specs}
    hungriest = max(need, key=need.get)
    have = memory.budget(device)
    if have is not None and need[hungriest] > have:
        fits = resident.largest_batch(dataclasses.replace(model, position=hungriest, attention=train.attention),
                                      train.precision, have // share, rows, device)
        fix = (f"--batch-size {fits * distributed.world()} fits (the largest that does), or use a shorter --train-length"
               if fits else "not even a batch of one sequence fits: use a shorter --train-length or a smaller preset")
        memory.require(need[hungriest], device, f"training {hungriest} at {distributed.batch_text(train.batch_size)} x "
                       f"--train-length {model.train_length} (preset {preset}){shared}", fix)


def command_experiment(preset: str | None, config: Path | None, variants: list[str] | None = None,
                seeds: list[int] | None = None, **sections: dict[str, Any]) -> tuple[Experiment, list[str], list[int]]:
    """The experiment of a command: preset < --config file < the options given (`sections`: the
    options of each of data/model/train/eval; None values are not given), with its variants and seeds."""
    exp = experiment(preset, config, sections)
    if exp.plugins:   # the experiment file's own plugins (paths relative to it)
        from relbench.positions import plugins

        plugins.load_files(exp.plugins)
    if variants or not exp.variants:
        specs = all_variants(variants)
    else:   # a preset's or file's list may name evaluation forms ("rope@yarn"): bench evaluates them
        specs = unique("variant", exp.variants)
        for spec in specs:
            forms.parse_form(spec)
    return exp, specs, unique("seed", seeds or exp.seeds or [0])


def trained_variants(specs: list[str]) -> list[str]:
    """The variants to train for these specs: each evaluation form's trained variant, once."""
    return list(dict.fromkeys(forms.trained_spec(spec) for spec in specs))
