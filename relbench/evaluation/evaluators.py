"""How `extrapolate` evaluates each registered task (relbench/tasks): for a variant x seed at one
length, which of the task's rows are still to do (`todo`), and those rows computed from the model
(`rows`), as updates of the task's CSV and the lines that report them. `EVALUATORS` holds one per
registered task; extrapolate.py plans units of work from them and never names a task.

    perplexity  -> extrapolation.csv (a row per length x protocol, see evaluation/perplexity.py) and
                   positions.csv (loss by position bin of each row)
    copy        -> copy.csv     (a row per copy distance; the inputs of the farthest copy of each
                   length have that length, the adjacent copy's go with the first length)
    passkey     -> passkey.csv  (a row per length x depth)
    mqar        -> mqar.csv     (per length x depth, a row per distance bin: the queries whose key
                   is that far back; bins of powers of two, see tasks/mqar.py)
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from relbench.attention import path_label, recording
from relbench.cost import memory
from relbench.cost.profiling import profile_one
from relbench.evaluation import perplexity as evaluate
from relbench.evaluation.perplexity import ScoredText, effective_stride, position_rows, windows
from relbench.model import GPT
from relbench.positions import forms
from relbench.stats import wilson
from relbench.tasks import Task, copying, mqar, passkey
from relbench.tasks.base import PERPLEXITY

POSITIONS_CSV = "positions.csv"
# a perplexity row's bins go with it: its key but n_tokens, which a bin row holds for the bin (the
# row's own count as the key made a forced re-evaluation add its bins beside the old ones)
POSITIONS_KEY = [k for k in PERPLEXITY.key if k != "n_tokens"]
PASSKEY_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
MQAR_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
COST = ("bias_ms", "bias_peak_mb", "attention_ms", "attention_peak_mb")
LONG_COST = 16384   # from this length on, the layer cost is one timed call

Update = tuple[str, dict, list]   # (CSV name, key, rows): the rows replace those that match every value of the key
Left = Callable[[dict], bool]     # whether the row with these fields (beside the pair's own) is still to do


@dataclass(frozen=True)
class Skipped:
    status: str     # "unsupported" or "oom"
    message: str


@dataclass(frozen=True)
class Job:
    """What every unit of one `extrapolate` command shares."""
    text: ScoredText
    lengths: tuple[int, ...]
    modes: tuple[str, ...]
    stride: int | None
    tasks: tuple[str, ...]
    trials: int
    max_batch_tokens: int
    backend: str
    device: torch.device
    tokenizer: Any
    force: bool = False
    mqar_pairs: int = 4     # mqar: key-value pairs per trial (the run's training value when it trained on mqar)
    not_learned: bool = False   # also evaluate a task on models trained to criterion on it that did not learn it
    announce: Callable[[str], None] | None = None   # prints, before a long retrieval cell, its cost per trial

    @staticmethod
    def trained_pairs(run_config: dict[str, Any]) -> int:
        """The mqar pairs a run's config.json says its models trained on; 4 for a run of another task."""
        train = run_config.get("train", {})
        return int(train.get("mqar_pairs", 4)) if train.get("task") == "mqar" else 4


ANNOUNCE_FROM = 16   # a retrieval cell at this many times the training length or more announces its cost first


def announce_cost(job: Job, task: str, label: str, base: dict[str, Any], length: int, trials: int,
                  one_trial: Callable[[], Any]) -> None:
    """Time `one_trial` (the cell's first trial, which the cell then runs again with the rest) and say
    what the cell will take, when `job.announce` is set and `length` is ANNOUNCE_FROM x the training
    length or more: at 512x one cell is minutes to hours, and the user learns which before it starts."""
    train_length = base.get("train_length") or length
    if job.announce is None or length < ANNOUNCE_FROM * train_length or trials < 2:
        return
    start = time.perf_counter()
    one_trial()
    seconds = time.perf_counter() - start
    total = seconds * trials
    job.announce(f"{label} {task} L={length}: {seconds:.2f} s for one trial (timed alone), {trials} trials: "
                 f"about {f'{total:.0f} s' if total < 120 else f'{total / 60:.1f} min'} for this length")


def update(task_csv: str, key: list[str] | tuple[str, ...], rows: list[dict[str, Any]]) -> Update:
    """The update that puts `rows`, which share one key, in place of those with that key."""
    shared = {k: rows[0][k] for k in key}
    if any({k: r[k] for k in key} != shared for r in rows):
        raise ValueError(f"rows of one {task_csv} update with different keys")
    return task_csv, shared, rows


def unfit(model: GPT, length: int, per_batch: int, backend: str, device: torch.device) -> Skipped | None:
    """Why `length` cannot run: beyond the scheme's positions, or more memory than the device has (on
    CPU the kernel would kill the process rather than raise); None when it can."""
    if model.max_length is not None and length > model.max_length:
        return Skipped("unsupported", f"no position representation beyond {model.max_length}")
    placed = any(enc.form is not None and enc.form.places for enc in model.positions)   # a dense bias per sequence
    biased = any(enc.adds_bias for enc in model.positions)
    need = memory.evaluation_bytes(model.config, backend, length, per_batch, biased, dense_bias=placed)
    have = memory.budget(device)
    if have is not None and need > have:
        return Skipped("oom", f"skipped: {backend} attention at length {length} needs about {memory.human(need)}, "
                              f"{memory.human(have)} available on {device}")
    return None


def guarded(compute, length: int, device: torch.device):
    """compute(), or Skipped("oom") when it runs out of memory."""
    try:
        return compute()
    except (RuntimeError, MemoryError) as error:
        if not memory.is_out_of_memory(error):
            raise
        return Skipped("oom", f"out of memory at length {length} on {device}")


def not_learned(meta: dict[str, Any], task: str, spec: str = "") -> str | None:
    """Why a checkpoint is not evaluated on `task`, or None: it was trained to criterion on that
    task and did not learn it, so its accuracy at longer lengths would say nothing (a model that
    never learned a task at 1x is *not learned*, not one that fails to extrapolate). A `spec` read at
    other positions than the criterion checked (the `drawn` form) is evaluated: its accuracy at the
    training length decides whether it learned (evaluation/reach.py)."""
    if spec and forms.places_positions(spec):
        return None
    train, summary = meta.get("train", {}), meta.get("summary", {})
    if train.get("task") != task or not train.get("criterion_accuracy") or summary.get("learned") is not False:
        return None
    accuracy = summary.get("val_accuracy")
    last = f"{accuracy:.0%} at its last check, " if accuracy is not None else ""
    return f"{task} not learned at its training length ({last}{summary.get('steps', '?')}-step cap): not evaluated"


class Evaluator(abc.ABC):
    """A task's evaluation. `todo` lists the work items of one variant x seed at `lengths[index]`
    still to do (protocols, distances, depths: hashable, picklable); `rows` computes them."""

    task: Task

    @abc.abstractmethod
    def todo(self, job: Job, index: int, left: Left) -> tuple:
        """The work items still to do at `job.lengths[index]`."""

    @abc.abstractmethod
    def rows(self, model: GPT, base: dict[str, Any], length: int, items: tuple, job: Job,
             costs: dict[tuple[str, int], dict], label: str) -> tuple[list[Update], list[str]]:
        """The updates of the task's CSV (and any other) and the lines that report them; `label` starts
        every line ("xl           seed 0")."""


def protocol_label(text: ScoredText, mode: str, stride: int | None) -> str:
    """What a perplexity row scored and how, e.g. "sliding, stride 128, 32,768 tokens in 8 segments of
    4,096": rows with different labels are different measurements."""
    how = f"{mode}, stride {stride}" if mode == "sliding" else mode
    return f"{how}, {text.n_tokens:,} tokens in {len(text.offsets)} segments of {text.segment:,}"


def perplexity_row(model: GPT, base: dict[str, Any], text: ScoredText, length: int, mode: str, stride: int | None,
                   max_batch_tokens: int, backend: str, device: torch.device) -> tuple[dict, evaluate.Perplexity | None]:
    """One tidy row (perplexity at `length` in `mode`) and the full result, or None if it did not run."""
    step = effective_stride(mode, stride, length)
    row = {**base, "length": length, "mode": mode, "protocol": protocol_label(text, mode, stride),
           "window": length, "stride": step, "segment": text.segment,
           "n_tokens": text.n_tokens, "n_windows": len(windows(text, length, mode, stride)), "attention": backend,
           "path": "",
           "status": "ok", "loss": float("nan"), "ppl": float("nan"), "ppl_low": float("nan"),
           "ppl_high": float("nan"), "n_bytes": float("nan"), "bits_per_byte": float("nan"), "eval_s": float("nan"),
           "tokens_per_s": float("nan"),
           **{k: float("nan") for k in COST}, "message": ""}
    outcome = unfit(model, length, max(1, max_batch_tokens // length), backend, device)
    if outcome is None:
        with recording() as taken:
            outcome = guarded(lambda: evaluate.perplexity(model, text, length, max_batch_tokens, device, mode, stride),
                              length, device)
        row["path"] = path_label(taken)
    if isinstance(outcome, Skipped):
        row.update(status=outcome.status, message=outcome.message)
        return row, None
    result = outcome
    row.update(loss=result.loss, ppl=result.ppl, ppl_low=result.ppl_low, ppl_high=result.ppl_high,
               n_bytes=result.n_bytes, bits_per_byte=result.bits_per_byte, eval_s=result.seconds,
               tokens_per_s=result.n_tokens / result.seconds)
    return row, result


def layer_cost(model: GPT, length: int, backend: str, device: torch.device) -> dict:
    """Cost of one layer of this model's shape (batch 1): bias construction and attention, the median
    of 3 calls after a warm-up; from 16384 on one call (each takes as long as the perplexity pass
    of a layer, and the calls differ by a few percent there)."""
    config = model.config
    cost = profile_one(config.position, backend, length, batch=1, heads=config.n_heads, head_dim=config.head_dim,
                       device=str(device), repeats=3 if length < LONG_COST else 1, train_max=0,
                       train_length=config.train_length)
    return {k: float("nan") if cost.get(k) is None else cost[k] for k in COST}


class PerplexityEvaluator(Evaluator):
    task = PERPLEXITY

    def todo(self, job: Job, index: int, left: Left) -> tuple:
        length = job.lengths[index]
        return tuple(mode for mode in job.modes if left(
            {"length": length, "mode": mode, "stride": effective_stride(mode, job.stride, length),
             "n_tokens": job.text.n_tokens, "segment": job.text.segment}))

    def rows(self, model, base, length, items, job, costs, label):
        """The perplexity rows (with the layer cost, measured once per trained scheme and length) and
        their position bins."""
        updates, lines = [], []
        for mode in items:
            row, result = perplexity_row(model, base, job.text, length, mode, job.stride, job.max_batch_tokens,
                                         job.backend, job.device)
            if result is not None:
                # the trained scheme's cost, measured once for it and every evaluation form of it
                cost_key = (forms.scheme_spec(base["variant"]), length)
                if cost_key not in costs:
                    costs[cost_key] = layer_cost(model, length, job.backend, job.device)
                row.update(costs[cost_key])
                key = {k: row[k] for k in POSITIONS_KEY}
                updates.append((POSITIONS_CSV, key, position_rows(result, key)))
            updates.append(update(self.task.csv, self.task.key, [row]))
            shown = (f"ppl {row['ppl']:.3f}, {row['bits_per_byte']:.4f} bits/byte" if row["status"] == "ok"
                     else row["status"])
            lines.append(f"{label} L={length:<6} {mode:<10} {shown:<32} "
                         + (f"{row['eval_s']:.1f}s" if row["status"] == "ok" else row["message"]))
        return updates, lines


class CopyEvaluator(Evaluator):
    task = copying.TASK

    def todo(self, job: Job, index: int, left: Left) -> tuple:
        length = job.lengths[index]
        mine = [(d, n) for d, n in copying.distances(list(job.lengths))
                if n == length or (index == 0 and n not in job.lengths)]
        return tuple((d, n) for d, n in mine if left({"distance": d, "trials": job.trials}))

    def rows(self, model, base, length, items, job, costs, label):
        updates, lines = [], []
        for distance, inputs in items:
            row = self.row(model, base, distance, inputs, job)
            updates.append(update(self.task.csv, self.task.key, [row]))
            shown = f"ratio {row['ratio']:.3f}" if row["status"] == "ok" else f"{row['status']} {row['message']}"
            lines.append(f"{label} copy d={distance:<6} {shown}")
        return updates, lines

    @staticmethod
    def row(model: GPT, base: dict[str, Any], distance: int, length: int, job: Job) -> dict:
        """The copy row at `distance` (inputs of `length` tokens)."""
        row = {**base, "distance": distance, "length": length, "trials": job.trials, "status": "ok",
               "loss_copy": float("nan"), "loss_control": float("nan"), "ratio": float("nan"),
               "ratio_low": float("nan"), "ratio_high": float("nan"), "message": ""}
        outcome = unfit(model, length, max(1, job.max_batch_tokens // length), job.backend, job.device)
        if outcome is None:
            outcome = guarded(lambda: copying.copy_losses(model, job.text.tokens, distance, job.trials, job.device,
                                                          job.max_batch_tokens), length, job.device)
        if isinstance(outcome, Skipped):
            row.update(status=outcome.status, message=outcome.message)
        else:
            low, high = outcome.interval()
            row.update(loss_copy=float(outcome.loss_copy.mean()), loss_control=float(outcome.loss_control.mean()),
                       ratio=outcome.ratio, ratio_low=low, ratio_high=high)
        return row


class PasskeyEvaluator(Evaluator):
    task = passkey.TASK

    def todo(self, job: Job, index: int, left: Left) -> tuple:
        return tuple(d for d in PASSKEY_DEPTHS if left({"length": job.lengths[index], "depth": d, "trials": job.trials}))

    def rows(self, model, base, length, items, job, costs, label):
        rows = self.depth_rows(model, base, length, items, job)
        shown = " ".join(f"{r['depth']:.2f}:{r['accuracy']:.0%}" if r["status"] == "ok" else r["status"] for r in rows)
        return ([update(self.task.csv, self.task.key, [row]) for row in rows],
                [f"{label} passkey L={length:<6} {shown}"])

    @staticmethod
    def depth_rows(model: GPT, base: dict[str, Any], length: int, depths: tuple[float, ...], job: Job) -> list[dict]:
        """The passkey rows at `length`, one per depth in `depths`."""
        tokens = job.text.tokens.numpy()
        outcome = unfit(model, length, max(1, job.max_batch_tokens // length), job.backend, job.device)
        if outcome is None and length < passkey.min_length(job.tokenizer):
            outcome = Skipped("unsupported", f"a passkey trial needs at least {passkey.min_length(job.tokenizer)} tokens")
        # the full, fixed set of trials, of which the depths still to do are taken: the same keys and
        # filler whatever was computed before
        plan = [t for t in passkey.trials(tokens.size, length, list(PASSKEY_DEPTHS), job.trials) if t.depth in depths]
        if outcome is None:
            announce_cost(job, "passkey", f"{base['variant']:<12} seed {base['seed']}", base, length, len(plan),
                          lambda: passkey.accuracy(model, tokens, plan[:1], length, job.tokenizer, job.device,
                                                   job.max_batch_tokens))
            outcome = guarded(lambda: passkey.accuracy(model, tokens, plan, length, job.tokenizer, job.device,
                                                       job.max_batch_tokens), length, job.device)
        rows = []
        for i, depth in enumerate(depths):
            row = {**base, "length": length, "depth": depth, "trials": job.trials, "status": "ok",
                   "correct": float("nan"), "accuracy": float("nan"), "acc_low": float("nan"),
                   "acc_high": float("nan"), "message": ""}
            if isinstance(outcome, Skipped):
                row.update(status=outcome.status, message=outcome.message)
            else:
                correct = sum(outcome[i * job.trials: (i + 1) * job.trials])
                low, high = wilson(correct, job.trials)
                row.update(correct=correct, accuracy=correct / job.trials, acc_low=low, acc_high=high)
            rows.append(row)
        return rows


class MqarEvaluator(Evaluator):
    task = mqar.TASK

    def todo(self, job: Job, index: int, left: Left) -> tuple:
        return tuple(d for d in MQAR_DEPTHS if left({"length": job.lengths[index], "depth": d, "trials": job.trials,
                                                     "n_pairs": job.mqar_pairs}))

    def rows(self, model, base, length, items, job, costs, label):
        per_depth = self.depth_rows(model, base, length, items, job)
        shown = " ".join(f"{rows[0]['depth']:.2f}:{sum(r['correct'] for r in rows) / sum(r['queries'] for r in rows):.0%}"
                         if rows[0]["status"] == "ok" else rows[0]["status"] for rows in per_depth)
        return ([update(self.task.csv, self.task.key, rows) for rows in per_depth],
                [f"{label} mqar L={length:<6} {shown}"])

    @staticmethod
    def depth_rows(model: GPT, base: dict[str, Any], length: int, depths: tuple[float, ...], job: Job) -> list[list[dict]]:
        """The mqar rows at `length`, for each depth in `depths` one row per distance bin that holds
        queries (one row with the reason when the length did not run)."""
        tokens = job.text.tokens.numpy()
        outcome = unfit(model, length, max(1, job.max_batch_tokens // length), job.backend, job.device)
        if outcome is None and length < mqar.min_length(job.mqar_pairs):
            outcome = Skipped("unsupported", f"an mqar trial of {job.mqar_pairs} pairs needs at least "
                                             f"{mqar.min_length(job.mqar_pairs)} tokens")
        # the full, fixed set of trials, of which the depths still to do are taken (as for passkey)
        plan = [t for t in mqar.trials(tokens.size, length, list(MQAR_DEPTHS), job.trials, job.mqar_pairs,
                                       vocab_size=job.tokenizer.vocab_size) if t.depth in depths]
        if outcome is None:
            announce_cost(job, "mqar", f"{base['variant']:<12} seed {base['seed']}", base, length, len(plan),
                          lambda: mqar.accuracy(model, tokens, plan[:1], length, job.tokenizer, job.device,
                                                job.max_batch_tokens))
            outcome = guarded(lambda: mqar.accuracy(model, tokens, plan, length, job.tokenizer, job.device,
                                                    job.max_batch_tokens), length, job.device)
        out = []
        for i, depth in enumerate(depths):
            common = {**base, "length": length, "depth": depth, "trials": job.trials, "n_pairs": job.mqar_pairs}
            if isinstance(outcome, Skipped):
                out.append([{**common, "distance_low": float("nan"), "distance_high": float("nan"), "queries": 0,
                             "correct": float("nan"), "accuracy": float("nan"), "acc_low": float("nan"),
                             "acc_high": float("nan"), "status": outcome.status, "message": outcome.message}])
                continue
            answers = [a for a in outcome if i * job.trials <= a.trial < (i + 1) * job.trials]
            bins: dict[tuple[int, int], list[bool]] = {}
            for answer in answers:
                bins.setdefault(mqar.distance_bin(answer.distance), []).append(answer.correct)
            rows = []
            for (low, high), correct in sorted(bins.items()):
                acc_low, acc_high = wilson(sum(correct), len(correct))
                rows.append({**common, "distance_low": low, "distance_high": high, "queries": len(correct),
                             "correct": sum(correct), "accuracy": sum(correct) / len(correct), "acc_low": acc_low,
                             "acc_high": acc_high, "status": "ok", "message": ""})
            out.append(rows)
        return out


# in the order a unit evaluates them (and prints their lines); every registered task has one
EVALUATORS: dict[str, Evaluator] = {e.task.name: e for e in (PerplexityEvaluator(), CopyEvaluator(),
                                                            PasskeyEvaluator(), MqarEvaluator())}
