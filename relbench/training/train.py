"""Training: one small causal LM per variant, same seed, same data order, same batches.

One step (schedule, optimiser, loss, forward and backward) is relbench/training/step.py's.
Batches are drawn from a generator seeded by (seed, step), independent of the model, so every
variant sees exactly the same sequences in the same order (relbench/training/batches.py: text windows, or
passkey trials for the retrieval preset). Validation uses fixed sequences from the validation split.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from relbench import positions
from relbench.config import ModelConfig, TrainConfig, to_dict
from relbench.cost.inspection import attention_logit_max
from relbench.cost.memory import is_out_of_memory
from relbench.data import Splits
from relbench.errors import RelbenchError, UsageError
from relbench.model import GPT
from relbench.positions import forms, plugins
from relbench.runs import checkpoints, distributed, results, tracking
from relbench.training.batches import random_positions, retrieval_accuracy, training_batch, validation_batches
from relbench.training.step import forward_backward, lr_at, make_optimizer, optimizer_step, position_lr, validation_loss
from relbench.training.stopping import Diverged, Interrupted, StopRequest, learned_at


@dataclasses.dataclass(frozen=True)
class Continuation:
    """Training that starts from a finished model instead of the seed's initialisation (`relbench
    finetune`, relbench/training/finetune.py): its weights, the length of every batch (the model's own
    train_length, which shapes its scheme, stays as trained) and where the batches continue the data
    order: step s trains on the batch of the training rule's step `data_offset + s` at `length`.
    `identity` joins the resume check, so a resume.pt saved for other settings is refused."""
    weights: dict[str, torch.Tensor]
    length: int
    data_offset: int
    identity: dict[str, Any]
    command: str = "relbench finetune"
    form: str = ""      # a spec whose evaluation form the model trains under ("rope@pi:factor=4+ft1024")


def train_variant(spec: str, model_config: ModelConfig, config: TrainConfig, splits: Splits, device: torch.device,
                  progress: Progress | None = None, folder: Path | None = None,
                  stop: StopRequest | None = None,
                  on_pace: Callable[[float], None] | None = None,
                  on_row: Callable[[dict[str, Any]], None] | None = None,
                  start: Continuation | None = None,
                  on_learned: Callable[[GPT, int], None] | None = None) -> tuple[GPT, list[dict[str, Any]], dict[str, Any]]:
    """Train variant `spec`; returns the model, the loss-curve rows and a summary.

    With a checkpoint `folder`, a resumable state is saved there every `checkpoint_every` steps and
    when `stop` is requested, and training resumes from it when present. The batch and learning rate
    of a step depend on the step alone, so a resumed run ends with exactly the weights of an
    uninterrupted one. `on_pace(seconds_per_step)` is called once, after the first PACE_STEPS steps
    that follow a warm-up step; `on_row(row)` with every loss-curve row as it is logged.

    Under torchrun every rank draws the whole batch of a step and computes its share of the rows
    (DistributedDataParallel averages the gradients), so N processes make the update one process
    makes, up to the order of float sums. The loss they log and test for divergence, the validation
    loss and the decision to stop are the same on every rank; rank 0 saves.

    With `start` (a Continuation) the model starts from its weights, with a fresh optimiser, and
    trains and validates at its length; steps, rows and the schedule count from 0 as in training.

    Trained to criterion, a run stops at the check that confirms it, or with `consolidate_steps`
    trains that many steps more with its rate decayed (step.lr_at), the cap notwithstanding;
    `on_learned(model, step)` is called once, at the confirming step, before any consolidation."""
    model_config = dataclasses.replace(model_config, position=spec, attention=config.attention)
    scale, scale_source = position_lr(spec, config)
    config = dataclasses.replace(config, position_lr_scale=scale)
    model = GPT(model_config, seed=config.seed).to(device)
    if start is not None:
        model.load_state_dict(start.weights)
        if start.form:
            forms.apply(model, start.form)
    model.train()
    optimizer = make_optimizer(model, config)
    identity = {"model": to_dict(model_config), "train": to_dict(config),
                **({"start": start.identity} if start is not None else {})}
    state: dict[str, Any] = {"step": 0, "rows": [], "running": 0.0, "running_n": 0, "val": float("nan"),
                             "elapsed": 0.0, "max_logit": 0.0, "identity": identity}
    resume = distributed.on_main(checkpoints.load_resume, folder) if folder is not None else None
    if resume is not None:
        if resume["state"].get("identity") != identity:
            raise RelbenchError(f"{folder}/{checkpoints.RESUME_FILE} was saved with another configuration; "
                                f"delete it to train {spec} from step 0")
        model.load_state_dict(resume["model"])
        optimizer.load_state_dict(resume["optimizer"])
        state = resume["state"]
    trained = distributed.wrap(model, device)        # the model itself in one process
    train_tokens = torch.from_numpy(splits.train)
    length, data_offset = (start.length, start.data_offset) if start is not None else (model_config.train_length, 0)
    val_batches = validation_batches(torch.from_numpy(splits.validation), config, length, splits.tokenizer)
    tokens_per_step = config.batch_size * length
    log_every = max(1, config.steps // 50)
    task = progress.add_task(spec, total=config.steps, completed=state["step"], loss="-", val="-", speed="-") \
        if progress else None
    started, first_step = time.perf_counter(), state["step"]
    pace_from = first_step
    position_grads: dict[str, float] = {}
    grad_norm = torch.tensor(float("nan"))
    retrieval = config.task != "lm"
    state.setdefault("checks", [])           # (step, validation accuracy at the training length) of a retrieval task
    state.setdefault("learned", None)        # the step the criterion was met at, kept once it was
    state.setdefault("consolidate_from", None)   # the step that confirmed it, where consolidation starts
    for step in range(state["step"], config.steps + config.consolidate_steps):
        lr = lr_at(step, config, state["consolidate_from"])
        for group in optimizer.param_groups:
            group["lr"] = lr * group["lr_scale"]
        x, y, weights = training_batch(train_tokens, data_offset + step, config, length, splits.tokenizer)
        chosen = random_positions(config.seed, data_offset + step, x.shape[0], length, model.random_positions) \
            if model.random_positions else None                    # randomized positions; validation keeps 0 .. L - 1
        loss, grad_norm = forward_backward(trained, optimizer, x, y, weights, device, config, step, chosen)
        optimizer_step(model, optimizer)
        done = step + 1
        state["running"] += loss.item()
        state["running_n"] += 1
        check = done % config.eval_every == 0 or done == config.steps
        accuracy = float("nan")
        if check:
            state["val"] = validation_loss(model, val_batches, device)
            if retrieval:
                accuracy = retrieval_accuracy(model, config.task, splits.validation, length, splits.tokenizer, device,
                                              config.criterion_trials, config.mqar_pairs)
                state["checks"].append((done, accuracy))
        newly = None
        if state["learned"] is None:
            learned = learned_at(state["checks"], config.criterion_accuracy, config.criterion_checks)
            # every rank measured the same model on the same trials; the decision is made the same everywhere
            if distributed.max_all(int(learned is not None), device):
                state["learned"], state["consolidate_from"], newly = learned, done, done
        if newly is not None and on_learned is not None:
            on_learned(model, done)
        if state["consolidate_from"] is None:
            last = done == config.steps or newly is not None
        else:
            last = done == state["consolidate_from"] + config.consolidate_steps
        if last:  # what reaches the position parameters at the end, after clipping (step() keeps .grad)
            position_grads = {name: p.grad.norm().item()
                              for name, p in model.positions.named_parameters() if p.grad is not None}
        if done % log_every == 0 or check or last:
            max_logit = attention_logit_max(model, x[:1].to(device))   # the batch's first sequence, on every rank
            state["max_logit"] = max(state["max_logit"], max_logit)
            elapsed = state["elapsed"] + time.perf_counter() - started
            state["rows"].append({
                "variant": spec, "seed": config.seed, "step": done, "tokens": done * tokens_per_step, "lr": lr,
                "train_loss": state["running"] / state["running_n"],
                "val_loss": state["val"] if check else float("nan"), "val_accuracy": accuracy,
                "max_attention_logit": max_logit, "elapsed_s": elapsed,
                "tokens_per_s": (done - first_step) * tokens_per_step / (time.perf_counter() - started)})
            if on_row is not None:
                on_row(state["rows"][-1])
            state["running"], state["running_n"] = 0.0, 0
        state["step"] = done
        if on_pace is not None and done - pace_from == 1:
            paced = time.perf_counter()                     # the first step (warm-up) is not counted
        elif on_pace is not None and done - pace_from == 1 + PACE_STEPS:
            on_pace((time.perf_counter() - paced) / PACE_STEPS)
            on_pace = None
        if progress is not None:
            rate = (done - first_step) * tokens_per_step / (time.perf_counter() - started)
            progress.update(task, completed=done, loss=f"{loss.item():.3f}",
                            val=f"{state['val']:.3f}" if math.isfinite(state["val"]) else "-", speed=f"{rate:,.0f}")
        # a signal to any rank stops every rank after this same step (the largest signal number wins)
        signum = distributed.max_all(stop.signum or 0, device) if stop is not None else 0
        if folder is not None and not last and (signum or done % config.checkpoint_every == 0):
            state["elapsed"] += time.perf_counter() - started
            started, first_step = time.perf_counter(), done
            if distributed.is_main():
                checkpoints.save_resume(folder, model, optimizer, state)
        if signum and not last:
            raise Interrupted(f"interrupted: {spec} seed {config.seed} stopped at step {done} of {config.steps} and "
                              f"saved in {folder}; run the same `{start.command if start else 'relbench train'}` again to resume",
                              signum)
        if last:
            break
    seconds = state["elapsed"] + time.perf_counter() - started
    criterion = config.criterion_accuracy > 0
    learned = state["learned"]
    summary = {"variant": spec, "seed": config.seed, "steps": state["step"], "step_cap": config.steps,
               "val_loss": state["val"],
               "val_accuracy": state["checks"][-1][1] if state["checks"] else float("nan"),
               "criterion": config.criterion_accuracy if criterion else None,
               "learned": (learned is not None) if criterion else None, "learned_step": learned,
               "consolidated_steps": state["step"] - state["consolidate_from"] if state["consolidate_from"] else 0,
               "position_lr_scale": scale, "position_lr_source": scale_source, "precision": config.precision,
               "grad_norm": float(grad_norm), "position_grad_norms": position_grads,
               "max_attention_logit": state["max_logit"], "train_seconds": seconds,
               "tokens_per_s": state["step"] * tokens_per_step / seconds,
               "n_params": model.n_params(), "position_params": model.n_params(positions_only=True)}
    return model, state["rows"], summary


def learned_text(summary: dict[str, Any]) -> str:
    """"; learned at step 700 (95% at 2 checks)" or "; NOT learned within its 3000 steps" for a run
    trained to criterion; "" otherwise."""
    if summary.get("learned") is None:
        return ""
    if summary["learned"]:
        return f"; learned at step {summary['learned_step']} (accuracy >= {summary['criterion']:.0%} held)"
    return (f"; NOT learned within its {summary['step_cap']} steps (last validation accuracy "
            f"{summary['val_accuracy']:.0%}): reported as not learned, not as a failure to extrapolate")


def make_progress(console: Console) -> Progress:
    return Progress(TextColumn("[bold]{task.description:<12}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TextColumn("loss {task.fields[loss]}"), TextColumn("val {task.fields[val]}"),
                    TextColumn("{task.fields[speed]} tok/s"), TimeRemainingColumn(), console=console)


PACE_STEPS = 10   # steps timed (after one warm-up step) for the expected time printed before a run goes on


def expected_time_message(seconds_per_step: float, steps_left: int, runs_left: int, spec: str,
                          capped: bool = False) -> str:
    """One line: how long the runs still to train should take, from the pace of the first one
    (`capped`: trained to criterion, so the steps are a cap and the time an upper bound)."""
    minutes = seconds_per_step * steps_left / 60
    when = (f"at most {minutes:.0f} min (every run to its cap; criterion stopping ends most earlier)" if capped
            else f"about {minutes:.0f} min") if minutes >= 1 else "under a minute"
    return (f"expected: {when} of training for the {runs_left} run(s) to go ({spec} took {seconds_per_step:.2f} s "
            f"per step over its first {PACE_STEPS}; variants on the chunked path are slower). For a faster first "
            f"result: --variants alibi rope xl, or --preset tiny")


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
        positions.build_spec(spec, **model_config.position_shape)
    summaries, failures, failed, todo = [], [], [], []
    for seed in seeds:
        for spec in specs:
            label = spec if len(seeds) == 1 else f"{spec} seed {seed}"
            folder = results.checkpoint_dir(run_dir, spec, seed)
            meta = distributed.on_main(checkpoints.read_meta, folder)
            if meta and meta.get("finished") and not force:
                console.print(f"{label}: already trained ({folder}); --force trains it again", markup=False)
                summaries.append(meta["summary"])
                continue
            if force and meta is not None and distributed.is_main():
                (folder / checkpoints.RESUME_FILE).unlink(missing_ok=True)
            todo.append(Pair(spec, seed, label, folder, dataclasses.replace(base, seed=seed)))
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
        lower = base.lr / 3
        retry = (f"the same settings diverge again (training is deterministic); to retry at a lower rate, train "
                 f"into a new run directory, as `relbench train --preset {run_config.get('preset')} --run-dir "
                 f"{run_dir}-lr{lower:g} --lr {lower:g} --variants {' '.join(dict.fromkeys(failed))} --seeds "
                 f"{' '.join(map(str, sorted({p.seed for p in todo if p.spec in failed})))}` (a run directory holds "
                 f"one configuration; what finished in {run_dir} is kept)")
        raise RelbenchError(f"{len(failures)} training run(s) diverged, the others finished: " + " | ".join(failures)
                            + "; " + retry)
    return summaries


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
            progress.console.print(expected_time_message(seconds_per_step, len(todo) * base.steps, len(todo), spec,
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


