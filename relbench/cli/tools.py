"""Commands that need no trained run, or read one without changing it: variants, profile, inspect."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import torch
import typer
from rich.markup import escape
from rich.table import Table

from relbench import config, positions
from relbench.attention import BACKENDS, check
from relbench.cli.common import (
    AcceptPluginChange,
    Device,
    PluginFiles,
    RunDir,
    Variants,
    all_variants,
    app,
    console,
    resolve_device,
    use_plugins,
)
from relbench.config import ModelConfig
from relbench.cost import memory
from relbench.errors import RelbenchError, UsageError
from relbench.reporting import report
from relbench.runs import checkpoints, distributed, results, rundir


@app.command("variants")
def variants_command(
    heads: Annotated[int, typer.Option(help="Attention heads per layer.")] = 8,
    head_dim: Annotated[int, typer.Option(help="Channels per head.")] = 64,
    layers: Annotated[int, typer.Option(help="Layers, for the total parameter count.")] = 4,
    train_length: Annotated[int, typer.Option(help="Training length (learned embeddings' size).")] = 256,
    plugin: PluginFiles = None,
) -> None:
    """List every position variant with its family, formula and parameter count.

    Example: relbench variants --heads 8 --head-dim 64 --layers 12
    """
    use_plugins(plugin)
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
    table.caption = ("Every variant also takes position_lr_scale=X (its position parameters' learning-rate multiplier) "
                     "and ssmax=true (Scalable-Softmax: each row's logits times s_h log n, s_h learned per layer and head; "
                     "ssmax_bias=false scales q.k only); the schemes that place tokens at chosen positions ("
                     + ", ".join(n for n in positions.names() if positions.get(n).takes_positions)
                     + ") also random_positions=N (randomized positions, Ruoss et al. 2023: each training sequence at a "
                     "sorted random subset of [0, N), N > the training length; evaluation at 0 .. L - 1); every layer "
                     "also window=W, chunk=C, sinks=true and temperature=llama4|logn, and a layout gives a scheme per layer, "
                     "\"rope:window=64*3,none\" (docs/api.md, \"Layouts\")")
    table.caption_justify = "left"
    console.print(table)


@app.command("presets")
def presets_command() -> None:
    """List the shipped presets (relbench/presets/*.toml): what each trains and on what.

    A preset is an experiment file: `--config my.toml` takes the same format, and may start from a
    preset with `preset = "quick"`. Example: relbench presets
    """
    table = Table(title="Presets (--preset NAME; relbench/presets/NAME.toml)", title_justify="left")
    table.add_column("name", no_wrap=True)      # a preset's name is what the user types: never cut
    for column in ("model", "training", "data", "description"):
        table.add_column(column)
    for name in config.preset_names():
        exp = config.experiment(name)
        m, t = exp.model, exp.train
        table.add_row(name + (" (default)" if name == config.DEFAULT_PRESET else ""),
                      f"{m.n_layers} layers, d {m.d_model}, {m.n_heads} heads, length {m.train_length}",
                      (f"up to {t.steps:,} steps (to {t.criterion_accuracy:.0%})" if t.criterion_accuracy > 0
                       else f"{t.steps:,} steps") + f" x {t.batch_size}, lr {t.lr:g}" + (f", {t.task}" if t.task != "lm" else ""),
                      f"{exp.data.dataset}, {exp.data.tokenizer}" + (" (stream)" if exp.data.stream else ""),
                      escape(exp.description))
    console.print(table)


@app.command("profile")
def profile_command(
    lengths: Annotated[list[int] | None, typer.Option(help="Lengths to profile.")] = None,
    variants: Variants = None,
    attention: Annotated[list[str] | None, typer.Option(help=f"Backends to profile: any of {', '.join(BACKENDS)}, "
                                                        "or all (default: auto, the path every command takes, "
                                                        "and reference; unbiased SDPA is `none`'s auto).")] = None,
    batch: Annotated[int, typer.Option(help="Batch size.")] = 1,
    heads: Annotated[int, typer.Option(help="Attention heads.")] = 8,
    head_dim: Annotated[int, typer.Option(help="Channels per head.")] = 64,
    repeats: Annotated[int, typer.Option(help="Timed repeats (median, min and max are reported).")] = 5,
    train_max: Annotated[int, typer.Option(help="Also time forward+backward at lengths up to this.")] = 2048,
    timeout: Annotated[float, typer.Option(help="Seconds allowed per configuration (with --memory).")] = 900.0,
    peak_memory: Annotated[bool, typer.Option("--memory/--no-memory", help="Also measure peak memory: on CPU each "
                                              "configuration then runs in a fresh process (slower).")] = False,
    run_dir: RunDir = results.DEFAULT_RUN_DIR,
    device: Device = "auto",
    plugin: PluginFiles = None,
    accept_plugin_change: AcceptPluginChange = False,
) -> None:
    """Time and peak memory of bias construction and attention, per variant x backend x length.

    No training needed. By default every variant's `auto` path (`none`'s is unbiased SDPA, the
    floor) and the reference path where it fits, timed in this process with a progress bar;
    `--attention all` for every backend, `--memory` for peak memory (each configuration then in a
    fresh process on CPU). One that runs out of memory is recorded as oom and the rest continue.
    Writes RUN/profile.csv, which `report` shows.

    Example: relbench profile --lengths 1024 4096 16384 --variants xl t5 alibi --attention reference split --memory
    """
    use_plugins(plugin, accept_plugin_change)
    from relbench.cost.profiling import PROFILE_CSV, profile_run
    from relbench.evaluation.perplexity import validate_lengths

    distributed.single_process("profile")   # it times this process; others beside it would skew the times
    if min(batch, heads, head_dim, repeats) < 1:
        raise UsageError("--batch, --heads, --head-dim and --repeats must be positive")
    lengths = validate_lengths(list(lengths) if lengths else [1024, 4096, 16384], 1 << 22)
    specs = all_variants(variants)
    backends = list(dict.fromkeys(attention or ["auto", "reference"]))
    if "all" in backends:
        backends = list(BACKENDS)
    for backend in backends:
        check(backend)
    target = resolve_device(device)
    with rundir.RunLock(run_dir):
        table = profile_run(Path(run_dir) / PROFILE_CSV, specs, backends, lengths, batch, heads, head_dim, str(target),
                            repeats, train_max, timeout, console, peak_memory)
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
    plugin: PluginFiles = None,
    accept_plugin_change: AcceptPluginChange = False,
) -> None:
    """Diagnostics of trained variants: bias size against q.k logits per layer and head, the
    gradient reaching the bias parameters at the end of training, and how far attention reaches.

    Example: relbench inspect runs/default --variants xl t5
    """
    use_plugins(plugin, accept_plugin_change)
    from relbench.cost.inspection import INSPECT_CSV, inspect_run, tables
    from relbench.data import load_run_splits
    from relbench.evaluation.perplexity import validate_lengths

    distributed.single_process("inspect")
    config = rundir.require_run(run)
    seed = config.get("seeds", [0])[0] if seed is None else seed
    specs = variants or config.get("variants", [])
    for spec in specs:
        positions.parse(spec)
        meta = checkpoints.read_meta(rundir.checkpoint_dir(run, spec, seed))
        if not meta or not meta.get("finished"):
            raise RelbenchError(f"variant {spec} seed {seed} has no finished checkpoint in {run}; "
                                f"run `relbench train --run-dir {run} --variants {spec} --seeds {seed}`")
    train_length = int(config["model"]["train_length"])
    splits = load_run_splits(config, console)
    lengths = validate_lengths(list(lengths) if lengths else [train_length, 16 * train_length], splits.test.size)
    with rundir.RunLock(run):
        frame = inspect_run(Path(run), specs, seed, lengths, torch.from_numpy(splits.test), resolve_device(device))
        results.write_csv(Path(run) / INSPECT_CSV, frame)
    for title, header, body in tables(frame, lengths):
        console.print(report.rich_table(title, header, body))
    console.print(f"wrote {Path(run) / INSPECT_CSV}")


@app.command("verify")
def verify_command(run_dir: RunDir = results.DEFAULT_RUN_DIR,
                   repair: Annotated[bool, typer.Option(help="Write a new checksums.json: the verified files kept, "
                                                        "the unrecorded CSVs that are whole by their structure added "
                                                        "(said so); a damaged file is never recorded.")] = False) -> None:
    """What of a run can still be proven whole: each CSV against checksums.json, each finished
    checkpoint against its meta.json; exit 1 while anything cannot be vouched for.

    Example: relbench verify --run-dir runs/default --repair
    """
    from relbench.runs import integrity

    rundir.require_run(run_dir)
    with rundir.RunLock(run_dir):
        findings, sums = integrity.verify(run_dir)
        for finding in findings:
            console.print(f"{finding.status:<18} {finding.path}: {finding.detail}", markup=False)
        if repair:
            added = integrity.repair(run_dir, findings, sums)
            console.print(f"wrote {Path(run_dir) / results.CHECKSUMS}: {len(added)} file(s) recorded on their structure "
                          f"alone ({', '.join(p.name for p in added) or 'none'})", markup=False)
    damaged = [f for f in findings if f.status == integrity.DAMAGED]
    unrecorded = [f for f in findings if f.status == integrity.WHOLE and not repair]
    if damaged or unrecorded:
        first = (damaged or unrecorded)[0]
        raise RelbenchError(f"{len(damaged)} damaged and {len(unrecorded)} unrecorded file(s) in {run_dir}, first "
                            f"{first.path}: {first.detail}; "
                            + ("restore or delete each damaged file and rerun the command that writes it"
                               if damaged else f"`relbench verify --run-dir {run_dir} --repair` records them"))
