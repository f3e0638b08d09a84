"""`relbench train --dry-run`: what a training run would cost, from a few measured steps, without
training, loading the corpus or writing anything.

Per variant: parameters, the training memory estimate (relbench.cost.resident.training_bytes, the
figure the memory check uses), whether it fits the device (and if not, the largest --batch-size that
does), and the seconds per step at the configured batch.

A step is never timed on the configured model. Its time is composed from small real models, because
a step's cost is a sum of parts that each scale in a known way:
- **layers**: every block costs the same, so a model of n layers takes t(1) + (n - 1) (t(2) - t(1)),
  with t(1) and t(2) the steps of the variant's model at one and two layers and the vocabulary
  PROBE_VOCAB (what the model shares across layers, such as a bias planned once, is part of t(1));
- **vocabulary**: the embedding, the output projection, the loss and their optimiser state cost the
  same for every scheme, so their share is measured once per run shape, as the step of a one-layer
  model without position encoding at the configured vocabulary minus the same at PROBE_VOCAB (its
  work is per token, so it is timed on sequences of VOCABULARY_LENGTH tokens and scaled to the
  training length);
- **batch**: a step's work per token scales with its sequences; its fixed part (the optimiser step,
  and casting, clipping and allocating the gradients of every weight) does not. Each part is timed
  at a micro-batch at the training length and at SHORT_LENGTH tokens: what is left at no tokens is
  the fixed part, added once, and the rest is per token, times the configured batch's tokens. The
  micro-batch is the largest that fits in half the memory budget, made smaller when a warm-up step
  of one sequence through one block says that a step of the micro-batch through one block would
  take over MICRO_STEP_SECONDS.
Each part is the fastest of at least DRY_STEPS real optimiser steps (more for quick ones, until
their rounds took ROUND_SECONDS; after warm-up steps) on random tokens: the cost of a step does not
depend on the tokens, the fastest is the one least disturbed by other work on the machine, and the
shapes are timed in turn so that such work disturbs each alike. benchmarks/dry_run.py checks the
composed time against timed steps of the configured model. The projected wall time is the sum over
variants of seconds per step x steps x seeds.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from relbench.config import Experiment, ModelConfig, TrainConfig
from relbench.cost import memory, resident
from relbench.errors import RelbenchError, UsageError
from relbench.model import GPT
from relbench.training.batches import random_positions
from relbench.training.jobs import human_time
from relbench.training.step import forward_backward, make_optimizer, optimizer_step, position_lr

DRY_STEPS = 2
MICRO_STEP_SECONDS = 0.25   # a step of one block at the micro-batch takes at most about this long
VOCABULARY_LENGTH = 128     # the vocabulary's share is timed on sequences of at most this many tokens
SHORT_LENGTH = 8            # and every part on sequences this short too: what is left at no tokens is per step
ROUND_SECONDS = 1.0         # quick steps are repeated (up to MOST_ROUNDS) until their rounds took this long
MOST_ROUNDS = 10


def micro_batch(model_config, config, device: torch.device, one_step_seconds: float) -> int:
    """The batch the dry run times (see the module doc)."""
    have = memory.budget(device)
    fits = config.batch_size if have is None else resident.largest_batch(model_config, config.precision, have // 2,
                                                                           config.batch_size, device)
    quick = max(1, int(MICRO_STEP_SECONDS / max(one_step_seconds, 1e-9)))
    return max(1, min(config.batch_size, fits, quick))


def _step(model, optimizer, window, device, config) -> tuple[float, float]:
    """Seconds of one training step's forward and backward, and of its optimiser step."""
    def now() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    inputs = window[:, :-1]
    chosen = random_positions(0, 0, inputs.shape[0], inputs.shape[1], model.random_positions) \
        if model.random_positions else None     # randomized positions train on a dense bias
    started = now()
    forward_backward(model, optimizer, inputs, window[:, 1:], None, device, config, 0, chosen)
    backward = now()
    optimizer_step(model, optimizer)
    return backward - started, now() - backward


class StepTimer:
    """Steps of one small real model (the variant's, at `layers` layers and `vocab` tokens)."""

    def __init__(self, model_config, config, device: torch.device, layers: int, vocab: int):
        self.config, self.device = config, device
        self.model = GPT(dataclasses.replace(model_config, n_layers=layers, vocab_size=vocab), seed=config.seed)
        self.model.to(device).train()
        self.optimizer = make_optimizer(self.model, config)
        self.generator = torch.Generator().manual_seed(config.seed)

    def step(self, batch: int, length: int, layers: int | None = None) -> tuple[float, float]:
        """One step of `batch` sequences of `length` tokens over the first `layers` blocks (all by
        default). Fewer blocks share the model's other weights and its optimiser: blocks left out
        get no gradient, and AdamW skips them."""
        rows = torch.randint(0, self.model.config.vocab_size, (batch, length + 1), generator=self.generator)
        blocks = self.model.blocks
        if layers is not None:
            self.model.blocks = blocks[:layers]
        try:
            return _step(self.model, self.optimizer, rows.to(self.device), self.device, self.config)
        finally:
            self.model.blocks = blocks

    def warm(self, model_config, length: int, micro: int | None = None) -> int:
        """Warm-up steps of the first block (allocation, kernel choice: every block has the same
        shapes): of one sequence, which chooses the micro-batch unless `micro` is given, of the
        micro-batch, and of the short sequences cost() times. Returns the micro-batch."""
        if micro is None:
            micro = micro_batch(model_config, self.config, self.device, sum(self.step(1, length, layers=1)))
        if micro > 1:
            self.step(micro, length, layers=1)
        self.step(micro, min(SHORT_LENGTH, length), layers=1)
        return micro

    def cost(self, batch: int, length: int, steps: int, layers: tuple[int, ...]) -> list[tuple[float, float]]:
        """For each number of blocks in `layers`: (seconds of a step that do not depend on the
        batch, seconds per token of a sequence), from the fastest of `steps` steps of `batch`
        sequences at `length` tokens and at SHORT_LENGTH, all taken in turn so that other work on
        the machine disturbs each alike. A step's fixed part (the optimiser; casting, clipping and
        allocating the gradients of every weight) is what is left at no tokens; the rest is
        per sequence."""
        short = min(SHORT_LENGTH, length)
        shapes = [(count, n) for n in (length, short) for count in layers]
        runs, started = [], time.perf_counter()
        while len(runs) < steps or (len(runs) < MOST_ROUNDS and time.perf_counter() - started < ROUND_SECONDS):
            runs.append([self.step(batch, n, count) for count, n in shapes])
        fastest = [(min(run[i][0] for run in runs), min(run[i][1] for run in runs)) for i in range(len(shapes))]
        costs = []
        for (long, optimizer), (brief, _) in zip(fastest[:len(layers)], fastest[len(layers):]):
            per_token = max(0.0, long - brief) / (length - short) / batch if length > short else long / length / batch
            costs.append((max(0.0, long - per_token * length * batch) + optimizer, per_token))
        return costs


def vocabulary_seconds(exp: Experiment, device: torch.device, steps: int = DRY_STEPS) -> tuple[float, float]:
    """(seconds of a step that do not depend on the batch, seconds per token of a sequence) that
    the configured vocabulary adds to PROBE_VOCAB's (the module doc): zero for a vocabulary no
    larger. Its work per sequence is per token (the embedding, the output layer, the loss), so it
    is timed on sequences of at most VOCABULARY_LENGTH tokens."""
    model_config = dataclasses.replace(exp.model, position="none", position_options={}, attention="auto",
                                       n_layers=1)
    if model_config.vocab_size <= memory.PROBE_VOCAB:
        return 0.0, 0.0
    config = dataclasses.replace(exp.train, position_lr_scale=1.0)
    length = min(model_config.train_length, VOCABULARY_LENGTH)
    full = StepTimer(model_config, config, device, 1, model_config.vocab_size)
    micro = full.warm(model_config, length)
    (large,) = full.cost(micro, length, steps, (1,))
    del full
    small = StepTimer(model_config, config, device, 1, memory.PROBE_VOCAB)
    small.warm(model_config, length, micro)
    (base,) = small.cost(micro, length, steps, (1,))
    fixed, per_token = (max(0.0, a - b) for a, b in zip(large, base))
    return fixed, per_token


def measure(spec: str, exp: Experiment, device: torch.device, steps: int = DRY_STEPS,
            vocabulary: tuple[float, float] | None = None) -> dict[str, Any]:
    """One variant's parameters, memory estimate, the largest batch that fits, and the seconds per
    training step at the configured batch, composed from steps of its model at one and two layers
    (see the module doc). `vocabulary`: vocabulary_seconds, when already measured for this run."""
    model_config = dataclasses.replace(exp.model, position=spec, attention=exp.train.attention)
    config = dataclasses.replace(exp.train, position_lr_scale=position_lr(spec, exp.train)[0])
    layers, length = model_config.n_layers, model_config.train_length
    kinds = memory.layer_kinds(model_config)
    if len(kinds) > 1:    # a layout: each kind of layer timed as its own model, weighted by its share of the layers
        timed = [(share, measure(kind.position, dataclasses.replace(exp, model=dataclasses.replace(exp.model,
                  position=kind.position)), device, steps, vocabulary)) for kind, share in kinds]
        return {**timed[0][1], **budget_row(spec, model_config, config, device),
                "micro_batch": min(row["micro_batch"] for _, row in timed),
                "seconds_per_step": sum(share * row["seconds_per_step"] for share, row in timed)}
    timer = StepTimer(model_config, config, device, min(2, layers), min(model_config.vocab_size, memory.PROBE_VOCAB))
    micro = timer.warm(model_config, length)
    timed = timer.cost(micro, length, steps, (1, 2) if layers > 1 else (1,))
    one, two = timed[0], timed[-1]
    del timer
    vocabulary = vocabulary_seconds(exp, device, steps) if vocabulary is None else vocabulary
    fixed, per_token = (a + (layers - 1) * max(0.0, b - a) + v for a, b, v in zip(one, two, vocabulary))
    return {**budget_row(spec, model_config, config, device), "micro_batch": micro,
            "seconds_per_step": fixed + per_token * length * config.batch_size}


def budget_row(spec: str, model_config: ModelConfig, config: TrainConfig, device: torch.device) -> dict[str, Any]:
    """A variant's parameters, memory estimate and the largest batch that fits, from its configuration."""
    have = memory.budget(device)
    need = resident.training_bytes(model_config, config.batch_size, config.precision, device)
    fits = None if have is None or need <= have else resident.largest_batch(model_config, config.precision, have,
                                                                            config.batch_size, device)
    return {"variant": spec, "params": memory.parameter_count(model_config),
            "position_params": memory.parameter_count(model_config, positions_only=True), "memory_bytes": need,
            "fits_batch": fits}


def plan_vocabulary(exp: Experiment, console) -> None:
    """Set the model's vocabulary to the tokenizer's without a corpus (relbench.data.tokenizer.
    planned_vocab_size); a hub tokenizer out of reach leaves the configured one, with a note."""
    from relbench.data.tokenizer import planned_vocab_size

    try:
        exp.model.vocab_size = planned_vocab_size(exp.data.tokenizer)
    except UsageError:
        raise
    except RelbenchError as error:
        console.print(f"note: {error}; assuming the configured vocabulary of {exp.model.vocab_size:,}", markup=False)


def report(exp: Experiment, specs: list[str], seeds: list[int], device: torch.device, console,
           side_by_side: int = 1) -> None:
    """Measure every variant and print the table and the projected wall time. With runs side by side
    (`--jobs`), each step is measured at one run's share of the threads, and the wall time is the sum
    over the runs divided among them (a rough figure: runs are uneven, and they share memory bandwidth)."""
    from relbench.reporting.report import rich_table
    from relbench.training.jobs import share_of_threads, threads_per_job

    m, t = exp.model, exp.train
    tokens = t.steps * t.batch_size * m.train_length
    console.print(f"dry run of preset {exp.preset}: {m.n_layers} layers, d {m.d_model}, {m.n_heads} heads, vocabulary "
                  f"{m.vocab_size:,}, length {m.train_length}; {t.steps:,} steps x {t.batch_size} sequences = "
                  f"{tokens:,} tokens per run, {len(specs)} variant(s) x {len(seeds)} seed(s), {t.precision} on "
                  f"{device}; a step's time composed from each variant's model at one and two layers (x layers), the "
                  f"vocabulary's share measured once, each timed at a micro-batch (the fastest of at least {DRY_STEPS} "
                  f"steps after a warm-up) at the training length and at {SHORT_LENGTH} tokens: the per-token work "
                  f"scaled to the batch of {t.batch_size}, a step's fixed part added once (docs/configuration.md)")
    rows, total = [], 0.0
    threads = torch.get_num_threads()
    with share_of_threads(side_by_side):
        vocabulary = vocabulary_seconds(exp, device)
        measured = [(spec, measure(spec, exp, device, vocabulary=vocabulary)) for spec in specs]
    for spec, row in measured:
        projected = row["seconds_per_step"] * t.steps * len(seeds)
        total += projected
        fits = ("yes" if row["fits_batch"] is None else f"no ({row['fits_batch']})" if row["fits_batch"] else "no (0)")
        rows.append([spec, f"{row['params']:,}", f"{row['position_params']:,}", memory.human(row["memory_bytes"]),
                     fits, str(row["micro_batch"]), f"{row['seconds_per_step']:.3f}",
                     f"{tokens / t.steps / row['seconds_per_step']:,.0f}", human_time(projected)])
    table = rich_table("Dry run (nothing trained or written)", ["variant", "params", "position", "memory", "fits",
                                                                 "timed", "s/step", "tok/s", "projected"], rows)
    console.print(table)   # in a pipe the console is wide already (cli/common.py, PIPE_WIDTH) unless COLUMNS says
    console.print("memory: the estimated peak of a run (on CPU the process's resident set beyond Python and torch); "
                  "fits: whether it fits this device (in brackets, the largest "
                  "--batch-size that does); timed: the micro-batch the steps were timed at, scaled to the batch",
                  markup=False)
    parallel = (f"; {side_by_side} side by side (--jobs), each step measured at {threads_per_job(side_by_side)} of "
                f"{threads} threads: about {human_time(total / side_by_side)} of wall time" if side_by_side > 1 else "")
    console.print(f"projected: {human_time(total)} of training for {len(specs) * len(seeds)} run(s) on {device}, "
                  f"from steps measured on this machine now{parallel}", markup=False)
