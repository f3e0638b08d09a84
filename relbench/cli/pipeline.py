"""What the commands that make and read a run do once their options are parsed: train (or dry-run)
the variants of an experiment, evaluate them, report. cli/__init__.py (train, tune-lr, extrapolate,
finetune, report) and cli/bench.py (bench) call these."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relbench.attention import check, flush_denormals
from relbench.cli.common import (
    check_training_memory,
    check_variant_backend,
    console,
    resolve_device,
    resolve_jobs,
    unique,
)
from relbench.comparisons import MARGIN
from relbench.config import EvalConfig, Experiment, ModelConfig, resolve_precision
from relbench.cost import memory
from relbench.errors import RelbenchError, UsageError, unknown
from relbench.positions import forms
from relbench.reporting import report
from relbench.runs import checkpoints, distributed, runconfig, rundir, tracking


def train_runs(run_dir: Path, exp: Experiment, specs: list[str], seeds: list[int], device: str, force: bool,
           log: str = "none", jobs: str = "1") -> dict[str, Any]:
    from relbench.data import load_data
    from relbench.training.pairs import train_run

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
    side_by_side = resolve_jobs(jobs, specs, model_config, train_config, target)
    run_config = distributed.on_main(runconfig.record_run, run_dir, runconfig.run_config(exp, specs, seeds, splits), specs,
                                     seeds, target, exp.description)
    console.print(f"training {len(specs)} variant(s) x {len(seeds)} seed(s) on {splits.description}: "
                  f"{splits.sizes()['train']:,} train tokens; run directory {run_dir}"
                  + (f"; {distributed.world()} processes" if distributed.world() > 1 else ""))
    train_run(Path(run_dir), specs, seeds, run_config, splits, target, force, console, logger, side_by_side)
    return run_config


def dry_run_experiment(exp: Experiment, specs: list[str], seeds: list[int], device: str, jobs: str = "1") -> None:
    from relbench.cli import dryrun

    target = resolve_device(device)
    exp.train.precision = resolve_precision(exp.train.precision, target)
    dryrun.plan_vocabulary(exp, console)
    for spec in specs:
        check_variant_backend(exp.train.attention, spec, exp.model, target, training=True)
    memory.require(memory.model_bytes(exp.model), target, f"a model of d_model {exp.model.d_model} x "
                   f"{exp.model.n_layers} layers", "use a smaller preset")   # the batch's fit is in the table
    side_by_side = min(resolve_jobs(jobs, specs, exp.model, exp.train, target), len(specs) * len(seeds))
    dryrun.report(exp, specs, seeds, target, console, side_by_side)


def extrapolate_runs(run_dir: Path, lengths: list[int] | None, variants: list[str] | None, attention: str,
                 eval_tokens: int | None, device: str, seeds: list[int] | None = None,
                 modes: list[str] | None = None, stride: int | None = None, force: bool = False,
                 tasks: list[str] | None = None, trials: int | None = None,
                 eval_overrides: dict[str, Any] | None = None, not_learned: bool = False) -> None:
    from relbench.data import load_run_splits
    from relbench.evaluation.extrapolate import Job, extrapolate_run
    from relbench.evaluation.perplexity import MODES, longest_length, scored_text, validate_lengths
    from relbench.tasks import get_task

    config = rundir.require_run(run_dir)
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
    trained = distributed.on_main(finished_pairs, run_dir, pairs, bool(variants or config.get("seeds") != seeds))
    model_config = ModelConfig(**config["model"])
    for spec in specs:
        forms.check_spec(spec, **model_config.position_shape)
    for spec in dict.fromkeys(forms.scheme_spec(s) for s, _ in trained):
        check_variant_backend(attention, spec, model_config, target, training=False)
    splits = load_run_splits(config, console)
    for spec, seed in trained:
        checkpoints.check_tokenizer(rundir.checkpoint_dir(run_dir, forms.trained_spec(spec), seed), splits.tokenizer)
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
              target, splits.tokenizer, force, train=dict(config.get("train", {})), not_learned=not_learned,
              announce=(lambda line: console.print(line, markup=False)) if distributed.is_main() else None)
    with flush_denormals():
        extrapolate_run(Path(run_dir), trained, job, console)


def finished_pairs(run_dir: Path, pairs: list[tuple[str, int]], named: bool) -> list[tuple[str, int]]:
    """The (variant, seed) pairs with a finished checkpoint; an error when there is none, or when
    one that was `named` (by --variants or --seeds) has not finished."""
    trained = [(s, seed) for s, seed in pairs
               if (checkpoints.read_meta(rundir.checkpoint_dir(run_dir, forms.trained_spec(s), seed)) or {}).get("finished")]
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


def report_run(run_dir: Path, margin: float = MARGIN) -> None:
    distributed.on_main(render_report, run_dir, margin)   # rank 0 writes; under torchrun the others wait for it


def render_report(run_dir: Path, margin: float = MARGIN) -> None:
    written = report.render(run_dir, console, margin=margin)
    console.print("wrote " + ", ".join(str(path) for path in written.values()))


