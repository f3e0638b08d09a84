"""`relbench bench`: train, extrapolate and report in one go, the language-model track and the
retrieval track, with the expected time of each printed first."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from relbench.cli.common import (
    ConfigFile,
    Device,
    Lengths,
    Log,
    MaxTrainTokens,
    PluginFiles,
    PositionLR,
    Preset,
    RunDir,
    TokenizerName,
    TrainJobs,
    app,
    command_experiment,
    console,
    position_lr_overrides,
    resolve_device,
    resolve_jobs,
    trained_variants,
    use_plugins,
)
from relbench.cli.pipeline import extrapolate_runs, report_run, train_runs
from relbench.config import read_file, resolve_precision
from relbench.errors import UsageError, unknown
from relbench.runs import results, runconfig, rundir

TRACKS = ("all", "lm", "retrieval")
RETRIEVAL_PRESET = "retrieval"
# What `relbench bench` trains unless --variants (or an experiment file's list) names others: six schemes
# that span the shipped retrieval panel's tiers (README: fox:bias_init=5, kerple-log, alibi a; t5, xl,
# rope b), each of which learned passkey in every one of the panel's nine seeds but t5's seed 8, within
# 600-4,300 steps. `--variants all` trains the preset's whole list (quick: 16 language models and their retrieval
# models, about an hour on a 2-core CPU). docs/performance.md times both.
MAIN_PANEL = ("fox:bias_init=5", "alibi", "kerple-log", "t5", "xl", "rope")
BenchVariants = Annotated[list[str] | None, typer.Option(
    "--variants", help='Variant specs, e.g. xl alibi "t5:bidirectional=true"; all: every variant of the preset or '
                       f'file (default: the file\'s list, else {" ".join(MAIN_PANEL)}). See `relbench variants`.')]


@app.command("bench")
def bench_command(
    variants: BenchVariants = None,
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
    jobs: TrainJobs = "auto",
    against: Annotated[str | None, typer.Option("--against", help="A shipped panel (`retrieval`) or a retrieval run "
                                                "directory: train only --variants, under the panel's protocol and "
                                                "first six seeds, into --run-dir (default runs/against-NAME), and place them "
                                                "among its schemes (tiers, pairwise decisions). A preset, file or "
                                                "option that changes the protocol is refused.",
                                                show_default=False)] = None,
) -> None:
    """Train, extrapolate and report in one go: by default six schemes that span the shipped panel's
    tiers (fox:bias_init=5, alibi, kerple-log, t5, xl, rope), both tracks, on the embedded corpus.

    It prints its expected time, reports each track once measured (the language models first), and
    closes with three lines on what it found beside the shipped panel (kept in RUN/findings.md).

    Example: relbench bench        (six schemes, both tracks; docs/performance.md times it)
             relbench bench --variants all     (every variant of the preset: about an hour on 2 cores)
             relbench bench --track lm --config examples/three-schemes.toml
             relbench bench --track retrieval --variants alibi rope xl t5
             relbench bench --plugin mybias.py --variants mybias --against retrieval
    """
    use_plugins(plugin)
    rundir.check_folder(run_dir)
    if against is not None:
        refuse_protocol_options(against, track, retrieval_config, lengths)
        bench_against(against, variants, preset, config, run_dir, overrides_of(position_lr_scale, tokenizer,
                      max_train_tokens), device, log, jobs)
        return
    variants = bench_variants(variants, config)
    if track not in TRACKS:
        raise unknown("track", track, list(TRACKS))
    if retrieval_config is not None and track != "all":
        raise UsageError("--retrieval-config sets the retrieval track of --track all; with --track retrieval give "
                         "the file as --config")
    data = {"tokenizer": tokenizer, "max_train_tokens": max_train_tokens}
    overrides = position_lr_overrides(position_lr_scale)
    runs = track_runs(track, variants, preset, config, retrieval_config, run_dir, overrides, data)
    announce(runs, device, jobs)
    run_tracks(runs, track, lengths, device, log, jobs)


def bench_variants(variants: list[str] | None, config: Path | None) -> list[str] | None:
    """The variants bench trains: those named; `all`: the preset's or file's whole list (None); none
    named: the file's list when it has one, else MAIN_PANEL."""
    if variants and "all" in variants:
        if len(variants) > 1:
            raise UsageError("--variants all trains every variant of the preset; give it alone, or name variants")
        return None
    if variants:
        return variants
    if config is not None and read_file(config).get("variants"):
        return None
    return list(MAIN_PANEL)


def refuse_protocol_options(against: str, track: str, retrieval_config: Path | None, lengths: list[int] | None) -> None:
    """`bench --against` measures under the panel's protocol: refuse the options that would change it."""
    given = {"--track": track != "all", "--retrieval-config": retrieval_config is not None, "--lengths": bool(lengths)}
    for option, set_ in given.items():
        if set_:
            raise UsageError(f"--against {against} measures under the panel's protocol; {option} would change it")


def track_runs(track: str, variants: list[str] | None, preset: str | None, config: Path | None,
               retrieval_config: Path | None, run_dir: Path, overrides: dict, data: dict) -> list[tuple]:
    """What each track `track` names trains: (run directory, experiment, specs, seeds, eval overrides),
    the language-model track (in `run_dir`) first. With --track all the retrieval track goes to
    RUN/retrieval, with the language-model track's variants and seeds and its preset's retrieval preset
    (or `retrieval_config`); with --track retrieval, to `run_dir`, set up by `preset` and `config`."""
    from relbench.reporting.overview import RETRIEVAL_TRACK

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
    return runs


def run_tracks(runs: list[tuple], track: str, lengths: list[int] | None, device: str, log: str, jobs: str) -> None:
    """Train, extrapolate and report each of `runs` (track_runs'), the language models first, so that
    the first comparison is on screen while the retrieval models train; then the language-model
    report again (it reads the retrieval track) and what the run found."""
    for folder, exp, specs, seeds, evals in runs:
        with rundir.RunLock(folder):
            train_runs(folder, exp, trained_variants(specs), seeds, device, False, log, jobs)
            extrapolate_runs(folder, lengths if exp.train.task == "lm" or track == "retrieval" else None, specs, "auto",
                         None, device, seeds, eval_overrides=evals)
            report_run(folder)
    if len(runs) > 1:
        with rundir.RunLock(runs[0][0]):
            report_run(runs[0][0])
    closing_lines(runs)


def closing_lines(runs: list[tuple]) -> None:
    """What the run found, in three lines, and its retrieval seeds beside the shipped panel's (printed, and
    kept in the first run directory's findings.md)."""
    from relbench.reporting import findings, report

    tasks = {("lm" if exp.train.task == "lm" else "retrieval"): Path(folder) for folder, exp, *_ in runs}
    lines, table = findings.findings(tasks.get("lm"), tasks.get("retrieval"))
    if table is not None:
        console.print(report.rich_table("This run's retrieval seeds beside the shipped panel's (mean accuracy "
                                        "4x-64x)", *table))
    for line in lines:
        console.print(line, markup=False)
    console.print(f"wrote {findings.write(Path(runs[0][0]), lines, table)}", markup=False)


def overrides_of(position_lr_scale, tokenizer, max_train_tokens) -> dict:
    return {"train": position_lr_overrides(position_lr_scale),
            "data": {"tokenizer": tokenizer, "max_train_tokens": max_train_tokens}}


def bench_against(name: str, variants: list[str] | None, preset: str | None, config: Path | None, run_dir: Path,
                  overrides: dict, device: str, log: str, jobs: str) -> None:
    """`bench --against`: the user's variants trained and evaluated under a panel's protocol and seeds, in a
    run directory that starts as a copy of the panel, then the report with every scheme and one line per
    variant on where it stands."""
    from relbench.data import load_data
    from relbench.evaluation import decisions, reach
    from relbench.runs import panels

    label, folder = panels.locate(name)
    panel = results.read_json(folder / results.CONFIG)
    if not variants:
        raise UsageError(f"--against {name} needs --variants: the schemes of your own to place among the panel's "
                         f"({', '.join(panel.get('variants', []))})")
    exp, specs, _ = command_experiment(preset or panel.get("preset"), config, variants, train=overrides["train"],
                                       data=overrides["data"])
    if preset is None and config is None:
        exp = panels.experiment_of(panel, exp)
        exp.data = dataclasses.replace(exp.data, **{k: v for k, v in overrides["data"].items() if v is not None})
        exp.train = dataclasses.replace(exp.train, **{k: v for k, v in overrides["train"].items() if v is not None})
    seeds = panels.trained_seeds(panel)
    clash = [s for s in trained_variants(specs) if s in panel.get("variants", [])]
    if clash:
        raise UsageError(f"--against {name}: {clash[0]} is one of the panel's schemes already; name a variant of "
                         f"your own (or an option of a scheme, e.g. \"{clash[0]}:ssmax=true\")")
    splits = load_data(exp.data)
    exp.model.vocab_size = splits.tokenizer.vocab_size
    differs = panels.protocol_differences(panel, runconfig.run_config(exp, specs, seeds, splits))
    if differs:
        more = f" (and {len(differs) - 1} more)" if len(differs) > 1 else ""
        raise UsageError(f"--against {name}: the protocol differs from the panel's: {differs[0]}{more}; "
                         f"drop the option, preset or file that changes it")
    if Path(run_dir) == results.DEFAULT_RUN_DIR:
        run_dir = Path("runs") / f"against-{Path(label).name}"
    with rundir.RunLock(run_dir):
        panels.start_run(label, folder, run_dir)
        train_runs(run_dir, exp, trained_variants(specs), seeds, device, False, log, jobs)
        extrapolate_runs(run_dir, None, specs, "auto", None, device, seeds)
        report_run(run_dir)
    task = panels.task_of(panel)
    found = reach.run_reach(run_dir, panels.task_table(task))
    decided = decisions.decide(found, task, int(panel["model"]["train_length"]))
    for spec in specs:
        console.print(decisions.placement(decided, spec), markup=False)


def announce(runs: list, device: str, jobs: str = "1") -> None:
    """Print what each track will train and its expected training time, from one step of each of its
    variants measured on this machine now (a retrieval run trained to criterion stops early; its cap
    is the upper bound). With runs side by side (--jobs), each step is measured at a run's share of
    the threads and the sum divided among the jobs (uneven runs and shared memory bandwidth make it
    a rough figure)."""

    from relbench.cli import dryrun
    from relbench.training.jobs import share_of_threads

    target = resolve_device(device)
    for folder, exp, specs, seeds, _ in runs:
        probe = dataclasses.replace(exp, train=dataclasses.replace(
            exp.train, precision=resolve_precision(exp.train.precision, target)))
        trained = trained_variants(specs)
        side_by_side = min(resolve_jobs(jobs, trained, probe.model, probe.train, target), len(trained) * len(seeds))
        with share_of_threads(side_by_side):
            vocabulary = dryrun.vocabulary_seconds(probe, target, steps=1)     # once per track, not per variant
            per_step = [dryrun.measure(spec, probe, target, steps=1, vocabulary=vocabulary)["seconds_per_step"]
                        for spec in trained]
        total = sum(per_step) * exp.train.steps * len(seeds) / side_by_side
        what = (f"up to {exp.train.steps:,} steps each, stopping once {exp.train.task} accuracy at length "
                f"{exp.model.train_length} holds {exp.train.criterion_accuracy:.0%}" if exp.train.criterion_accuracy > 0
                else f"{exp.train.steps:,} steps each")
        bound = "at most " if exp.train.criterion_accuracy > 0 else "about "
        console.print(f"{'retrieval' if exp.train.task != 'lm' else 'language-model'} track (preset {exp.preset}, "
                      f"{folder}): {len(per_step)} variant(s) x {len(seeds)} seed(s), {what}; expected training "
                      f"{bound}{dryrun.human_time(total)} on {target} (one step of each variant measured now"
                      f"{f', {side_by_side} runs side by side' if side_by_side > 1 else ''}), then "
                      f"evaluation", markup=False)


