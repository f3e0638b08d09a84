"""Training: one small causal LM per variant, same seed, same data order, same batches.

One step (schedule, optimiser, loss, forward and backward) is relbench/training/step.py's.
Batches are drawn from a generator seeded by (seed, step), independent of the model, so every
variant sees exactly the same sequences in the same order (relbench/training/batches.py: text windows, or
passkey trials for the retrieval preset). Validation uses fixed sequences from the validation split.

This module trains one variant (train_variant), step by step; where a run is between steps, what
resume.pt keeps of it, is relbench/training/state.py's, and relbench/training/pairs.py trains every
variant and seed of a `relbench train` with it and writes their checkpoints.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from relbench.config import ModelConfig, TrainConfig, to_dict
from relbench.cost.inspection import attention_logit_max
from relbench.data import Splits
from relbench.model import GPT
from relbench.positions import forms
from relbench.runs import checkpoints, distributed
from relbench.tasks import retrieval_task
from relbench.training.batches import random_positions, retrieval_accuracy, training_batch, validation_batches
from relbench.training.state import PACE_STEPS, Clock, TrainingState, resumed
from relbench.training.step import forward_backward, lr_at, make_optimizer, optimizer_step, position_lr, validation_loss
from relbench.training.stopping import Interrupted, StopRequest, learned_at


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


@dataclasses.dataclass(frozen=True)
class Loop:
    """What every step of one run reads: its variant and settings, the model (`trained`: the model
    in DistributedDataParallel under torchrun, itself in one process) and its optimiser, the data,
    and the length and data offset of the batches (step s trains on the batch of step data_offset + s)."""
    spec: str
    config: TrainConfig
    model: GPT
    trained: torch.nn.Module
    optimizer: torch.optim.Optimizer
    splits: Splits
    device: torch.device
    train_tokens: torch.Tensor
    val_batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]
    length: int
    data_offset: int

    @property
    def tokens_per_step(self) -> int:
        return self.config.batch_size * self.length


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
    `on_learned(model, step)` is called once, at the confirming step, before any consolidation. With
    `moments` K it trains (K - 1) * eval_every steps more at the rate it had, and the weights at the
    confirming step and every eval_every steps after it are saved into `folder` as moment files as they
    are taken (the summary's `moments` lists their steps and the last one's, model.pt's)."""
    loop, state, scale_source = prepare(spec, model_config, config, splits, device, folder, start)
    command = start.command if start else "relbench train"
    grad_norm, position_grads, seconds = train_steps(loop, state, progress, folder, stop, command, on_pace, on_row,
                                                     on_learned)
    return loop.model, state.rows, summarize(loop, state, seconds, scale_source, grad_norm, position_grads)


def prepare(spec: str, model_config: ModelConfig, config: TrainConfig, splits: Splits, device: torch.device,
            folder: Path | None, start: Continuation | None) -> tuple[Loop, TrainingState, str]:
    """The loop of train_variant: the model (from the seed's initialisation, or `start`'s weights under
    its form) and a fresh optimiser, both loaded from `folder`'s resume.pt when it holds one; returns
    the loop, its state and where the position learning-rate multiplier comes from (step.position_lr)."""
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
    state = resumed(folder, spec, identity, model, optimizer)
    trained = distributed.wrap(model, device)        # the model itself in one process
    train_tokens = torch.from_numpy(splits.train)
    length, data_offset = (start.length, start.data_offset) if start is not None else (model_config.train_length, 0)
    val_batches = validation_batches(torch.from_numpy(splits.validation), config, length, splits.tokenizer)
    loop = Loop(spec, config, model, trained, optimizer, splits, device, train_tokens, val_batches, length, data_offset)
    return loop, state, scale_source


def train_steps(loop: Loop, state: TrainingState, progress: Progress | None, folder: Path | None,
                stop: StopRequest | None, command: str, on_pace: Callable[[float], None] | None,
                on_row: Callable[[dict[str, Any]], None] | None,
                on_learned: Callable[[GPT, int], None] | None) -> tuple[torch.Tensor, dict[str, float], float]:
    """Train from state.step to the run's last step (the cap, the check that confirms the criterion,
    or the end of consolidation) as train_variant says: rows logged, progress shown, state saved, a
    stop request obeyed (Interrupted names `command`). Returns the last step's gradient norm, the
    norms of the gradients that reach the position parameters at the last step, and the seconds
    trained in all."""
    config, model = loop.config, loop.model
    task = progress.add_task(loop.spec, total=config.steps, completed=state.step, loss="-", val="-", speed="-") \
        if progress else None
    clock = Clock(state.step, on_pace)
    position_grads: dict[str, float] = {}
    grad_norm = torch.tensor(float("nan"))
    if folder is not None and state.step == 0 and distributed.is_main():
        checkpoints.clear_moments(folder)      # an earlier run's moments are not this one's
    for step in range(state.step, config.steps + config.after_criterion):
        x, lr, loss, grad_norm = train_step(loop, state, step)
        done = step + 1
        check, accuracy = validate(loop, state, done)
        newly = newly_learned(loop, state, done)
        if newly is not None and on_learned is not None:
            on_learned(model, done)
        if state.consolidate_from is None:     # not learned yet: the cap ends it
            last = done == config.steps
        else:                                  # learned (newly_learned set it): consolidation's end ends it
            last = done == state.consolidate_from + config.after_criterion
            take_moment(loop, state, folder, done, last)
        if last:  # what reaches the position parameters at the end, after clipping (step() keeps .grad)
            position_grads = {name: p.grad.norm().item()
                              for name, p in model.positions.named_parameters() if p.grad is not None}
        if done % max(1, config.steps // 50) == 0 or check or last:
            row = log_row(loop, state, clock, x, done, lr, check, accuracy)
            if on_row is not None:
                on_row(row)
        state.step = done
        clock.pace(done)
        if progress is not None:
            progress.update(task, completed=done, loss=f"{loss.item():.3f}",
                            val=f"{state.val:.3f}" if math.isfinite(state.val) else "-",
                            speed=f"{clock.rate(done, loop.tokens_per_step):,.0f}")
        save_or_stop(loop, state, clock, folder, stop, command, done, last)
        if last:
            break
    return grad_norm, position_grads, clock.seconds(state)


def take_moment(loop: Loop, state: TrainingState, folder: Path | None, done: int, last: bool) -> None:
    """With [train] moments, after step `done` of a learned run: save the weights when it is one of the
    run's earlier moments (the confirming step and every eval_every steps after it; the last moment is
    the finished model itself), and note its step."""
    since = done - state.consolidate_from
    if loop.config.moments < 2 or folder is None or last or since % loop.config.eval_every:
        return
    if distributed.is_main():
        checkpoints.save_moment(folder, since // loop.config.eval_every, loop.model)
    state.moments.append(done)


def train_step(loop: Loop, state: TrainingState, step: int) -> tuple[torch.Tensor, float, torch.Tensor, torch.Tensor]:
    """Step `step` (from 0): its learning rate, its batch (and drawn positions, for a model trained at
    randomized positions), forward, backward and the update; its loss joins the running sum. Returns the
    batch's inputs, the learning rate, the loss and the gradient norm."""
    model, optimizer, config, length = loop.model, loop.optimizer, loop.config, loop.length
    lr = lr_at(step, config, state.consolidate_from)
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_scale"]
    x, y, weights = training_batch(loop.train_tokens, loop.data_offset + step, config, length, loop.splits.tokenizer)
    chosen = random_positions(config.seed, loop.data_offset + step, x.shape[0], length, model.random_positions) \
        if model.random_positions else None                    # randomized positions; validation keeps 0 .. L - 1
    loss, grad_norm = forward_backward(loop.trained, optimizer, x, y, weights, loop.device, config, step, chosen)
    optimizer_step(model, optimizer)
    state.running += loss.item()
    state.running_n += 1
    return x, lr, loss, grad_norm


def validate(loop: Loop, state: TrainingState, done: int) -> tuple[bool, float]:
    """Whether step `done` is a check (every eval_every steps, and the cap) and, for a retrieval task,
    its validation accuracy at the training length (NaN otherwise). A check measures the validation
    loss into `state`, and a retrieval task's accuracy into its checks."""
    config = loop.config
    check = done % config.eval_every == 0 or done == config.steps
    accuracy = float("nan")
    if check:
        state.val = validation_loss(loop.model, loop.val_batches, loop.device)
        if config.task != "lm":
            accuracy = retrieval_accuracy(loop.model, config.task, loop.splits.validation, loop.length,
                                          loop.splits.tokenizer, loop.device, config.criterion_trials,
                                          retrieval_task(config.task).options(dataclasses.asdict(config)))
            state.checks.append((done, accuracy))
    return check, accuracy


def newly_learned(loop: Loop, state: TrainingState, done: int) -> int | None:
    """`done` when the criterion is met at this step for the first time (state.learned then holds the
    step it was met at, state.consolidate_from this one), else None."""
    if state.learned is not None:
        return None
    learned = learned_at(state.checks, loop.config.criterion_accuracy, loop.config.criterion_checks)
    # every rank measured the same model on the same trials; the decision is made the same everywhere
    if distributed.max_all(int(learned is not None), loop.device):
        state.learned, state.consolidate_from = learned, done
        return done
    return None


def log_row(loop: Loop, state: TrainingState, clock: Clock, x: torch.Tensor, done: int, lr: float, check: bool,
            accuracy: float) -> dict[str, Any]:
    """Append the loss-curve row of step `done` to state.rows and return it: the mean training loss
    since the last row (whose sum then starts again), a check's validation loss and accuracy, and the
    largest attention logit on the batch's first sequence (measured on every rank)."""
    max_logit = attention_logit_max(loop.model, x[:1].to(loop.device))   # the batch's first sequence, on every rank
    state.max_logit = max(state.max_logit, max_logit)
    elapsed = clock.seconds(state)
    state.rows.append({
        "variant": loop.spec, "seed": loop.config.seed, "step": done, "tokens": done * loop.tokens_per_step, "lr": lr,
        "train_loss": state.running / state.running_n,
        "val_loss": state.val if check else float("nan"), "val_accuracy": accuracy,
        "max_attention_logit": max_logit, "elapsed_s": elapsed,
        "tokens_per_s": clock.rate(done, loop.tokens_per_step)})
    state.running, state.running_n = 0.0, 0
    return state.rows[-1]


def save_or_stop(loop: Loop, state: TrainingState, clock: Clock, folder: Path | None, stop: StopRequest | None,
                 command: str, done: int, last: bool) -> None:
    """After step `done` (unless it is the last): save the resumable state into `folder` every
    checkpoint_every steps and on a stop request, and then stop (Interrupted, which names `command`)."""
    config, device = loop.config, loop.device
    # a signal to any rank stops every rank after this same step (the largest signal number wins)
    signum = distributed.max_all(stop.signum or 0, device) if stop is not None else 0
    if folder is not None and not last and (signum or done % config.checkpoint_every == 0):
        clock.restart(state, done)
        if distributed.is_main():
            checkpoints.save_resume(folder, loop.model, loop.optimizer, state.saved())
    if signum and not last:
        raise Interrupted(f"interrupted: {loop.spec} seed {config.seed} stopped at step {done} of {config.steps} and "
                          f"saved in {folder}; run the same `{command}` again to resume", signum)


def summarize(loop: Loop, state: TrainingState, seconds: float, scale_source: str, grad_norm: torch.Tensor,
              position_grads: dict[str, float]) -> dict[str, Any]:
    """The summary of a run that trained for `seconds` in all (meta.json's "summary")."""
    config = loop.config
    criterion = config.criterion_accuracy > 0
    learned = state.learned
    return {"variant": loop.spec, "seed": config.seed, "steps": state.step, "step_cap": config.steps,
            "val_loss": state.val,
            "val_accuracy": state.checks[-1][1] if state.checks else float("nan"),
            "criterion": config.criterion_accuracy if criterion else None,
            "learned": (learned is not None) if criterion else None, "learned_step": learned,
            "consolidated_steps": state.step - state.consolidate_from if state.consolidate_from else 0,
            "moments": state.moments + [state.step] if config.moments > 1 and learned is not None else [],
            "position_lr_scale": config.position_lr_scale, "position_lr_source": scale_source,
            "precision": config.precision, "grad_norm": float(grad_norm), "position_grad_norms": position_grads,
            "max_attention_logit": state.max_logit, "train_seconds": seconds,
            "tokens_per_s": state.step * loop.tokens_per_step / seconds,
            "n_params": loop.model.n_params(), "position_params": loop.model.n_params(positions_only=True)}


def learned_text(summary: dict[str, Any]) -> str:
    """"; learned at step 700 (accuracy >= 95% held)" or "; NOT learned within its 3000 steps" for a run
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
