"""The runs of a `relbench train`: every variant once per seed (each a Pair), trained one after
another in this process or side by side in processes of their own (relbench/training/jobs.py), each
with relbench/training/train.py's train_variant; a finished run's loss curve goes into train.csv and
its checkpoint into its folder as soon as it finishes.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from rich.console import Console
from rich.progress import Progress

from relbench import positions
from relbench.config import ModelConfig, TrainConfig, to_dict
from relbench.cost.memory import is_out_of_memory
from relbench.data import Splits
from relbench.errors import RelbenchError, UsageError
from relbench.positions import plugins
from relbench.runs import checkpoints, distributed, results, rundir, tracking
from relbench.training.stopping import Diverged, StopRequest
from relbench.training.train import expected_time_message, learned_text, make_progress, train_variant


def train_run(run_dir: Path, specs: list[str], seeds: list[int], run_config: dict[str, Any], splits: Splits,
              device: torch.device, force: bool, console: Console,
              logger: tracking.TensorBoard | None = None, jobs: int = 1) -> list[dict[str, Any]]:
    """Train every variant in `specs` once per seed, skipping those with a finished checkpoint (unless
    `force`), and save each checkpoint and loss curve as soon as it finishes. Seeds run in order,
    every variant per seed. Ctrl-C or SIGTERM saves a resumable state and stops (see StopRequest); a
    variant whose loss stops being finite keeps its last good state and the others go on. Under
    torchrun rank 0 reads the checkpoints and writes every file; the others learn what it read.
    `logger`: a tracker (relbench.runs.tracking) that mirrors the loss curves. `jobs` > 1 (CPU, one
    process): that many runs train side by side, each in a process of its own (relbench/training/jobs.py)
    with the same weights and curve as alone at its thread count; this process writes every file."""
    model_config = ModelConfig(**run_config["model"])
    base = TrainConfig(**run_config["train"])
    needed = 2 * (model_config.train_length + 1)     # a training window, and room to draw where it starts
    if len(splits.train) < needed:
        raise UsageError(f"the training split holds {len(splits.train):,} tokens, too few to draw sequences of "
                         f"{model_config.train_length + 1} from; give --max-train-tokens {needed:,} or more")
    for spec in specs:  # fail on a bad variant or option before any training starts
        positions.parse(spec).layers(model_config.n_layers)   # the depth is one the layout repeats to
        for layer in positions.parse(spec).pattern:
            layer.build(**model_config.position_shape)
    summaries, todo = pairs_to_train(run_dir, specs, seeds, base, force, console)
    failures, failed = [], []
    apart = jobs > 1 and len(todo) > 1
    closing = contextlib.closing(logger) if logger is not None else contextlib.nullcontext()
    with closing:
        if apart:
            from relbench.training import jobs as side_by_side

            outcomes = side_by_side.train_pairs(todo, min(jobs, len(todo)), model_config, splits, device, console,
                                                 train_pair)
        else:
            outcomes = train_in_turn(todo, model_config, base, splits, device, console, logger)
        with contextlib.closing(outcomes) as runs:   # an error writing one ends the runs still going first
            for pair, outcome in runs:
                if outcome["status"] == "diverged":
                    failures.append(outcome["message"])
                    failed.append(pair.spec)
                    continue
                if logger is not None and apart:   # alone, the rows reached it as they were logged
                    for row in outcome["rows"]:
                        logger.row(row)
                summaries.append(finish_pair(run_dir, pair, outcome, run_config, splits, console))
    if failures:
        raise diverged_error(run_dir, run_config, base, todo, failures, failed)
    return summaries


def pairs_to_train(run_dir: Path, specs: list[str], seeds: list[int], base: TrainConfig, force: bool,
                   console: Console) -> tuple[list[dict[str, Any]], list[Pair]]:
    """The summaries of the runs already finished, each said so and skipped (unless `force`: then every
    run with a meta.json trains again from step 0, its resume.pt deleted), and the runs to train, seed
    by seed."""
    summaries, todo = [], []
    for seed in seeds:
        for spec in specs:
            label = spec if len(seeds) == 1 else f"{spec} seed {seed}"
            folder = rundir.checkpoint_dir(run_dir, spec, seed)
            meta = distributed.on_main(checkpoints.read_meta, folder)
            if meta and meta.get("finished") and not force:
                console.print(f"{label}: already trained ({folder}); --force trains it again", markup=False)
                summaries.append(meta["summary"])
                continue
            if force and meta is not None and distributed.is_main():
                (folder / checkpoints.RESUME_FILE).unlink(missing_ok=True)
            todo.append(Pair(spec, seed, label, folder, dataclasses.replace(base, seed=seed)))
    return summaries, todo


def diverged_error(run_dir: Path, run_config: dict[str, Any], base: TrainConfig, todo: list[Pair],
                   failures: list[str], failed: list[str]) -> RelbenchError:
    """The error that ends a `relbench train` in which runs diverged (`failures`: their messages,
    `failed`: their variants), with the command that retries them at a third of the rate."""
    lower = base.lr / 3
    retry = (f"the same settings diverge again (training is deterministic); to retry at a lower rate, train "
             f"into a new run directory, as `relbench train --preset {run_config.get('preset')} --run-dir "
             f"{run_dir}-lr{lower:g} --lr {lower:g} --variants {' '.join(dict.fromkeys(failed))} --seeds "
             f"{' '.join(map(str, sorted({p.seed for p in todo if p.spec in failed})))}` (a run directory holds "
             f"one configuration; what finished in {run_dir} is kept)")
    return RelbenchError(f"{len(failures)} training run(s) diverged, the others finished: " + " | ".join(failures)
                         + "; " + retry)


@dataclasses.dataclass(frozen=True)
class Pair:
    """One training run of a `relbench train`: a variant, a seed, its label and folder, its settings."""
    spec: str
    seed: int
    label: str
    folder: Path
    config: TrainConfig


def train_in_turn(todo: list[Pair], model_config: ModelConfig, base: TrainConfig, splits: Splits,
                  device: torch.device, console: Console, logger: tracking.TensorBoard | None):
    """Yield (pair, outcome) for each run of `todo`, trained one after another in this process,
    with a progress bar and, after the first run's first steps, the expected time of the rest."""
    with StopRequest() as stop, make_progress(console) as progress:
        def pace(seconds_per_step: float, spec: str = "") -> None:
            steps = len(todo) * (base.steps + base.after_criterion)   # a run trained to criterion may go past its cap
            progress.console.print(expected_time_message(seconds_per_step, steps, len(todo), spec,
                                                         base.criterion_accuracy > 0), markup=False)

        for index, pair in enumerate(todo):
            on_pace = (lambda s, spec=pair.spec: pace(s, spec)) if index == 0 else None
            yield pair, train_pair(pair, model_config, splits, device, progress, stop, on_pace,
                                   logger and logger.row)


def train_pair(pair: Pair, model_config: ModelConfig, splits: Splits, device: torch.device,
               progress: Progress | None, stop: StopRequest | None,
               on_pace: Callable[[float], None] | None = None,
               on_row: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train one run: {"status": "finished", "model", "rows", "summary"}, or {"status": "diverged",
    "message"} with the run's last good state kept in its folder. Out of memory is an error naming
    what fits; a stop request raises Interrupted after saving where it was."""
    try:
        model, rows, summary = train_variant(pair.spec, model_config, pair.config, splits, device, progress,
                                             pair.folder, stop, on_pace, on_row)
    except (RuntimeError, MemoryError) as error:
        if not is_out_of_memory(error):
            raise
        raise RelbenchError(
            f"out of memory training {pair.label} at {distributed.batch_text(pair.config.batch_size)} x --train-length "
            f"{model_config.train_length} on {device}; finished variants and the last resumable state of "
            f"this one are kept in {pair.folder.parent.parent}; use a smaller --batch-size or --train-length") from None
    except Diverged as error:
        saved = checkpoints.load_resume(pair.folder) if distributed.is_main() else None   # rank 0 owns the folder
        kept = (f"its last resumable state (step {saved['state']['step']}) is kept in {pair.folder}" if saved
                else f"no state of it was saved (it diverged before its first checkpoint, step "
                     f"{pair.config.checkpoint_every})")
        message = f"{pair.label} diverged: loss {error.loss} at step {error.step + 1}; {kept}"
        if distributed.is_main():
            checkpoints.write_status(pair.folder, {"variant": pair.spec, "seed": pair.seed, "finished": False,
                                                   "status": "diverged", "message": message})
        if progress is not None:
            progress.console.print(message, markup=False)
        return {"status": "diverged", "message": message}
    model.config.attention = "auto"  # the backend is a runtime choice, not part of the model
    return {"status": "finished", "model": model, "rows": rows, "summary": summary}


def finish_pair(run_dir: Path, pair: Pair, outcome: dict[str, Any], run_config: dict[str, Any], splits: Splits,
                console: Console) -> dict[str, Any]:
    """Write a finished run: its loss curve into train.csv, then its checkpoint (weights and meta,
    the meta last), and print its line; returns its summary."""
    summary, model = outcome["summary"], outcome["model"]
    model_dict = outcome.get("model_config") or to_dict(model.config)
    meta = {"variant": pair.spec, "seed": pair.seed, "finished": True, "status": "finished", "summary": summary,
            "model": model_dict, "data": run_config["data"],
            "tokenizer": splits.tokenizer.name, "tokenizer_fingerprint": splits.tokenizer.fingerprint,
            "train": to_dict(dataclasses.replace(pair.config, position_lr_scale=summary["position_lr_scale"]))}
    own = plugins.records_for([pair.spec])
    if own:   # a scheme from the user's own file: which file, which bytes
        meta["plugin"] = own[0]
    if distributed.is_main():
        if len(summary.get("moments") or []) > 1:   # the earlier moments' files, saved as they were taken
            meta["moments"] = checkpoints.moment_records(pair.folder, len(summary["moments"]) - 1)
        append_rows(Path(run_dir) / results.TRAIN_CSV, pair.spec, pair.seed, outcome["rows"])
        checkpoints.save_checkpoint(pair.folder, model, meta)
    console.print(f"{pair.label}: validation loss {summary['val_loss']:.4f} after {summary['steps']} "
                  f"steps, {summary['train_seconds']:.0f} s, {summary['tokens_per_s']:,.0f} tokens/s"
                  + learned_text(summary), markup=False)
    return summary


def append_rows(path: Path, spec: str, seed: int, rows: list[dict[str, Any]]) -> None:
    new = pd.DataFrame(rows)
    if path.is_file():
        old = results.read_csv(path)
        old = old[~((old["variant"] == spec) & (old["seed"] == seed))]
        new = pd.concat([old, new], ignore_index=True)
    results.write_csv(path, new)


