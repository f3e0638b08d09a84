"""The `extrapolate` command's work: every trained variant x seed, at every length, for each task.

    perplexity  -> extrapolation.csv (one row per variant x seed x length x protocol: perplexity and bits
                   per byte, see relbench/evaluation/perplexity.py), positions.csv and
                   attention.csv (how far the model looks at its training length, hard windows)
    copy        -> copy.csv     (one row per variant x seed x copy distance)
    passkey     -> passkey.csv  (one row per variant x seed x length x depth)
    mqar        -> mqar.csv     (one row per variant x seed x length x depth x distance bin: the
                   queries whose key is that far back; bins of powers of two, see tasks/mqar.py)

Rows are written as each unit of work (a variant x seed at one length) finishes; under torchrun
the processes share the units and rank 0 writes the rows of each round (extrapolate_run). A row
already there for the same key (for perplexity the key holds the protocol: mode, effective
stride, scored tokens and segment length; for the tasks the number of trials, and for mqar the
number of pairs) is kept and not recomputed unless `force`, so an interrupted run computes only
the rest when run again, and rows of different protocols never replace each other. Every row
records the precision the model was trained in; evaluation is fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import torch

from relbench.attention import path_label, recording
from relbench.cost import memory
from relbench.cost.profiling import profile_one
from relbench.errors import RelbenchError
from relbench.evaluation import perplexity as evaluate
from relbench.evaluation.perplexity import ScoredText, effective_stride, position_rows, windows
from relbench.model import GPT
from relbench.positions import forms
from relbench.runs import checkpoints, distributed, results
from relbench.stats import wilson
from relbench.tasks import copying as copy_task
from relbench.tasks import mqar, passkey

ROW_KEY = ["variant", "seed", "length", "mode", "stride", "n_tokens", "segment"]
POSITIONS_CSV = "positions.csv"
COPY_CSV = "copy.csv"
PASSKEY_CSV = "passkey.csv"
MQAR_CSV = "mqar.csv"
ATTENTION_CSV = "attention.csv"   # how far each model looks at its training length (inspect.window_diagnostics)
ATTENTION_KEY = ["variant", "seed", "length"]
COPY_KEY = ["variant", "seed", "distance", "trials"]
PASSKEY_KEY = ["variant", "seed", "length", "depth", "trials"]
PASSKEY_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
MQAR_KEY = ["variant", "seed", "length", "depth", "trials", "n_pairs"]   # a depth's rows (every distance bin) go together
MQAR_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
COST = ("bias_ms", "bias_peak_mb", "attention_ms", "attention_peak_mb")
LONG_COST = 16384   # from this length on, the layer cost is one timed call
DONE = ("ok", "unsupported")


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

    @staticmethod
    def trained_pairs(run_config: dict[str, Any]) -> int:
        """The mqar pairs a run's config.json says its models trained on; 4 for a run of another task."""
        train = run_config.get("train", {})
        return int(train.get("mqar_pairs", 4)) if train.get("task") == "mqar" else 4


def _unfit(model: GPT, length: int, per_batch: int, backend: str, device: torch.device) -> Skipped | None:
    """Why `length` cannot run: beyond the scheme's positions, or more memory than the device has (on
    CPU the kernel would kill the process rather than raise); None when it can."""
    if model.max_length is not None and length > model.max_length:
        return Skipped("unsupported", f"no position representation beyond {model.max_length}")
    need = memory.evaluation_bytes(model.config, backend, length, per_batch, model.positions[0].adds_bias)
    have = memory.budget(device)
    if have is not None and need > have:
        return Skipped("oom", f"skipped: {backend} attention at length {length} needs about {memory.human(need)}, "
                              f"{memory.human(have)} available on {device}")
    return None


def _guarded(compute, length: int, device: torch.device):
    """compute(), or Skipped("oom") when it runs out of memory."""
    try:
        return compute()
    except (RuntimeError, MemoryError) as error:
        if not memory.is_out_of_memory(error):
            raise
        return Skipped("oom", f"out of memory at length {length} on {device}")


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
    unfit = _unfit(model, length, max(1, max_batch_tokens // length), backend, device)
    if unfit is None:
        with recording() as taken:
            unfit = _guarded(lambda: evaluate.perplexity(model, text, length, max_batch_tokens, device, mode, stride),
                             length, device)
        row["path"] = path_label(taken)
    if isinstance(unfit, Skipped):
        row.update(status=unfit.status, message=unfit.message)
        return row, None
    result = unfit
    row.update(loss=result.loss, ppl=result.ppl, ppl_low=result.ppl_low, ppl_high=result.ppl_high,
               n_bytes=result.n_bytes, bits_per_byte=result.bits_per_byte, eval_s=result.seconds,
               tokens_per_s=result.n_tokens / result.seconds)
    return row, result


def copy_row(model: GPT, base: dict[str, Any], distance: int, length: int, job: Job) -> dict:
    """The copy row at `distance` (inputs of `length` tokens)."""
    row = {**base, "distance": distance, "length": length, "trials": job.trials, "status": "ok",
           "loss_copy": float("nan"), "loss_control": float("nan"), "ratio": float("nan"),
           "ratio_low": float("nan"), "ratio_high": float("nan"), "message": ""}
    unfit = _unfit(model, length, max(1, job.max_batch_tokens // length), job.backend, job.device)
    if unfit is None:
        unfit = _guarded(lambda: copy_task.copy_losses(model, job.text.tokens, distance, job.trials, job.device,
                                                       job.max_batch_tokens), length, job.device)
    if isinstance(unfit, Skipped):
        row.update(status=unfit.status, message=unfit.message)
    else:
        low, high = unfit.interval()
        row.update(loss_copy=float(unfit.loss_copy.mean()), loss_control=float(unfit.loss_control.mean()),
                   ratio=unfit.ratio, ratio_low=low, ratio_high=high)
    return row


def passkey_rows(model: GPT, base: dict[str, Any], length: int, depths: tuple[float, ...], job: Job) -> list[dict]:
    """The passkey rows at `length`, one per depth in `depths`."""
    tokens = job.text.tokens.numpy()
    unfit = _unfit(model, length, max(1, job.max_batch_tokens // length), job.backend, job.device)
    if unfit is None and length < passkey.min_length(job.tokenizer):
        unfit = Skipped("unsupported", f"a passkey trial needs at least {passkey.min_length(job.tokenizer)} tokens")
    # the full, fixed set of trials, of which the depths still to do are taken: the same keys and
    # filler whatever was computed before
    plan = [t for t in passkey.trials(tokens.size, length, list(PASSKEY_DEPTHS), job.trials) if t.depth in depths]
    if unfit is None:
        unfit = _guarded(lambda: passkey.accuracy(model, tokens, plan, length, job.tokenizer, job.device,
                                                  job.max_batch_tokens), length, job.device)
    rows = []
    for i, depth in enumerate(depths):
        row = {**base, "length": length, "depth": depth, "trials": job.trials, "status": "ok",
               "correct": float("nan"), "accuracy": float("nan"), "acc_low": float("nan"), "acc_high": float("nan"),
               "message": ""}
        if isinstance(unfit, Skipped):
            row.update(status=unfit.status, message=unfit.message)
        else:
            correct = sum(unfit[i * job.trials: (i + 1) * job.trials])
            low, high = wilson(correct, job.trials)
            row.update(correct=correct, accuracy=correct / job.trials, acc_low=low, acc_high=high)
        rows.append(row)
    return rows


def mqar_rows(model: GPT, base: dict[str, Any], length: int, depths: tuple[float, ...], job: Job) -> list[list[dict]]:
    """The mqar rows at `length`, for each depth in `depths` one row per distance bin that holds
    queries (one row with the reason when the length did not run)."""
    tokens = job.text.tokens.numpy()
    unfit = _unfit(model, length, max(1, job.max_batch_tokens // length), job.backend, job.device)
    if unfit is None and length < mqar.min_length(job.mqar_pairs):
        unfit = Skipped("unsupported", f"an mqar trial of {job.mqar_pairs} pairs needs at least "
                                       f"{mqar.min_length(job.mqar_pairs)} tokens")
    # the full, fixed set of trials, of which the depths still to do are taken (as for passkey)
    plan = [t for t in mqar.trials(tokens.size, length, list(MQAR_DEPTHS), job.trials, job.mqar_pairs,
                                   vocab_size=job.tokenizer.vocab_size) if t.depth in depths]
    if unfit is None:
        unfit = _guarded(lambda: mqar.accuracy(model, tokens, plan, length, job.tokenizer, job.device,
                                               job.max_batch_tokens), length, job.device)
    out = []
    for i, depth in enumerate(depths):
        common = {**base, "length": length, "depth": depth, "trials": job.trials, "n_pairs": job.mqar_pairs}
        if isinstance(unfit, Skipped):
            out.append([{**common, "distance_low": float("nan"), "distance_high": float("nan"), "queries": 0,
                         "correct": float("nan"), "accuracy": float("nan"), "acc_low": float("nan"),
                         "acc_high": float("nan"), "status": unfit.status, "message": unfit.message}])
            continue
        answers = [a for a in unfit if i * job.trials <= a.trial < (i + 1) * job.trials]
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


def attention_row(model: GPT, base: dict[str, Any], text: ScoredText, windows_used: int = 4) -> dict:
    """Attention reach at the training length, on the first window of up to `windows_used` segments."""
    from relbench.cost.inspection import window_diagnostics

    length = model.config.train_length
    starts = [offset + text.context for offset in text.offsets[:windows_used]]
    tokens = torch.stack([text.tokens[s: s + length] for s in starts]).to(next(model.parameters()).device)
    return {**base, "length": length, "windows": len(starts), "status": "ok", **window_diagnostics(model, tokens)}


def layer_cost(model: GPT, length: int, backend: str, device: torch.device) -> dict:
    """Cost of one layer of this model's shape (batch 1): bias construction and attention, the median
    of 3 calls after a warm-up; from 16384 on one call (each takes as long as the perplexity pass
    of a layer, and the calls differ by a few percent there)."""
    config = model.config
    cost = profile_one(config.position, backend, length, batch=1, heads=config.n_heads, head_dim=config.head_dim,
                       device=str(device), repeats=3 if length < LONG_COST else 1, train_max=0,
                       train_length=config.train_length)
    return {k: float("nan") if cost.get(k) is None else cost[k] for k in COST}


def _read(path: Path, key: list[str]) -> pd.DataFrame:
    return results.read_csv(path, set(key) | {"status"}) if path.is_file() else pd.DataFrame()


def _done(table: pd.DataFrame, row: dict[str, Any], key: list[str]) -> bool:
    """Whether `table` holds a finished row (ok or unsupported) with `row`'s values in every key column."""
    if table.empty or any(k not in table.columns for k in key):
        return False
    same = table["status"].isin(DONE)
    for k in key:
        same &= table[k].astype(str) == str(row[k])
    return bool(same.any())


@dataclass(frozen=True)
class Unit:
    """The work on one variant x seed at one length: a perplexity row per mode, the copy rows whose
    inputs have this length, the passkey depths; the pair's first unit also takes the adjacent copy
    (its inputs match no evaluated length) and the attention row. Under torchrun the units are what
    the processes share. `depths` are passkey's, `mqar_depths` mqar's."""
    spec: str
    seed: int
    length: int
    base: dict          # the fields every row of this variant x seed starts with (the device comes later)
    modes: tuple[str, ...] = ()
    copies: tuple[tuple[int, int], ...] = ()     # (distance, input length)
    depths: tuple[float, ...] = ()
    attention: bool = False
    mqar_depths: tuple[float, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.modes or self.copies or self.depths or self.attention or self.mqar_depths)


Update = tuple[str, dict, list]   # (CSV name, key, rows): the rows replace those that match every value of the key


class Tables:
    """The CSVs `extrapolate` adds rows to, read once. Every rank merges every update (so all hold
    the same tables); only rank 0 writes the CSVs an update changed."""

    KEYS: ClassVar[dict[str, list[str]]] = {results.EXTRAPOLATION_CSV: ROW_KEY, ATTENTION_CSV: ATTENTION_KEY, COPY_CSV: COPY_KEY,
            PASSKEY_CSV: PASSKEY_KEY, MQAR_CSV: MQAR_KEY}

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.frames = {name: _read(self.run_dir / name, key) for name, key in self.KEYS.items()}
        bins = self.run_dir / POSITIONS_CSV
        self.frames[POSITIONS_CSV] = results.read_csv(bins) if bins.is_file() else pd.DataFrame()

    def done(self, name: str, row: dict[str, Any]) -> bool:
        return _done(self.frames[name], row, self.KEYS[name])

    def row(self, name: str, row: dict[str, Any]) -> Update:
        """The update that puts `row` in place of the one with its key."""
        return name, {k: row[k] for k in self.KEYS[name]}, [row]

    def rows(self, name: str, rows: list[dict[str, Any]]) -> Update:
        """The update that puts `rows`, which share one key, in place of those with that key."""
        key = {k: rows[0][k] for k in self.KEYS[name]}
        if any({k: r[k] for k in key} != key for r in rows):
            raise ValueError(f"rows of one {name} update with different keys")
        return name, key, rows

    def merge(self, updates: list[Update]) -> None:
        for name, key, rows in updates:
            self.frames[name] = results.replace_rows(self.frames[name], key, rows)
        if distributed.is_main():
            for name in dict.fromkeys(name for name, _, _ in updates):
                results.write_csv(self.run_dir / name, self.frames[name])


def checkpoint_of(run_dir: Path, spec: str, seed: int) -> Path:
    """The checkpoint a spec evaluates: the trained variant's ("rope" for "rope@yarn:factor=16")."""
    return results.checkpoint_dir(run_dir, forms.trained_spec(spec), seed)


def _base(run_dir: Path, spec: str, seed: int) -> dict[str, Any]:
    """The fields every row of a spec x seed starts with. `variant` is the spec as given, evaluation
    form included ("rope@yarn:factor=16": its own rows, table rows and plot lines); `form` is the
    form alone ("yarn:factor=16", or the one a checkpoint was fine-tuned under; "" for the variant as
    trained); `finetune_length` and
    `finetune_steps` say how a fine-tuned checkpoint ("rope+ft1024") was made (0 and 0: zero-shot)."""
    meta = checkpoints.read_meta(checkpoint_of(run_dir, spec, seed)) or {}
    precision = meta.get("train", {}).get("precision") or meta.get("summary", {}).get("precision") or "unknown"
    tuned = meta.get("finetune", {})
    return {"variant": spec, "form": forms.form_text(spec), "seed": seed,
            "finetune_length": tuned.get("length", 0), "finetune_steps": tuned.get("steps", 0),
            "train_length": meta.get("model", {}).get("train_length"), "precision": precision, "eval_precision": "fp32"}


def not_learned(meta: dict[str, Any], task: str) -> str | None:
    """Why a checkpoint is not evaluated on `task`, or None: it was trained to criterion on that
    task and did not learn it, so its accuracy at longer lengths would say nothing (a model that
    never learned a task at 1x is *not learned*, not one that fails to extrapolate)."""
    train, summary = meta.get("train", {}), meta.get("summary", {})
    if train.get("task") != task or not train.get("criterion_accuracy") or summary.get("learned") is not False:
        return None
    accuracy = summary.get("val_accuracy")
    last = f"{accuracy:.0%} at its last check, " if accuracy is not None else ""
    return f"{task} not learned at its training length ({last}{summary.get('steps', '?')}-step cap): not evaluated"


def pair_units(tables: Tables, spec: str, seed: int, base: dict[str, Any], job: Job,
               skipped: tuple[str, ...] = ()) -> list[Unit]:
    """The units of one variant x seed, one per length, holding only the rows still to do (every
    row with `job.force`) of the tasks not `skipped`."""
    def todo(name: str, **fields) -> bool:
        return job.force or not tables.done(name, {**base, **fields})

    copies = copy_task.distances(list(job.lengths)) if "copy" in job.tasks else []
    units = []
    for i, length in enumerate(job.lengths):
        modes = [mode for mode in job.modes if "perplexity" in job.tasks and todo(
            results.EXTRAPOLATION_CSV, length=length, mode=mode, stride=effective_stride(mode, job.stride, length),
            n_tokens=job.text.n_tokens, segment=job.text.segment)]
        mine = [(d, n) for d, n in copies if n == length or (i == 0 and n not in job.lengths)]
        depths = [d for d in PASSKEY_DEPTHS if "passkey" in job.tasks and "passkey" not in skipped and todo(
            PASSKEY_CSV, length=length, depth=d, trials=job.trials)]
        mqar_depths = [d for d in MQAR_DEPTHS if "mqar" in job.tasks and "mqar" not in skipped and todo(
            MQAR_CSV, length=length, depth=d, trials=job.trials, n_pairs=job.mqar_pairs)]
        units.append(Unit(spec, seed, length, base, tuple(modes),
                          tuple((d, n) for d, n in mine if todo(COPY_CSV, distance=d, trials=job.trials)),
                          tuple(depths), i == 0 and todo(ATTENTION_CSV, length=base["train_length"]),
                          tuple(mqar_depths)))
    return units


def plan(run_dir: Path, pairs: list[tuple[str, int]], job: Job, console) -> tuple[Tables, list[Unit]]:
    """The CSVs as they are and the units with work left, in the order one process does them."""
    tables, units = Tables(run_dir), []
    for spec, seed in pairs:
        meta = checkpoints.read_meta(checkpoint_of(run_dir, spec, seed)) or {}
        reasons = {task: not_learned(meta, task) for task in ("passkey", "mqar") if task in job.tasks}
        skipped = tuple(task for task, reason in reasons.items() if reason and not job.not_learned)
        for task in skipped:
            console.print(f"{spec:<12} seed {seed}: {reasons[task]} (--not-learned evaluates it)", markup=False)
        mine = pair_units(tables, spec, seed, _base(run_dir, spec, seed), job, skipped)
        kept = len(job.lengths) * len(job.modes) - sum(len(u.modes) for u in mine)
        if "perplexity" in job.tasks and kept:
            console.print(f"{spec:<12} seed {seed}: {kept} perplexity row(s) already computed, kept", markup=False)
        units += [u for u in mine if not u.empty]
    return tables, units


def perplexity_updates(unit: Unit, model: GPT, base: dict[str, Any], job: Job, tables: Tables,
                       costs: dict[tuple[str, int], dict]) -> tuple[list[Update], list[str]]:
    """The unit's perplexity rows (with the layer cost, measured once per variant and length) and
    their position bins, as updates, and the lines that report them."""
    updates, lines = [], []
    for mode in unit.modes:
        row, result = perplexity_row(model, base, job.text, unit.length, mode, job.stride, job.max_batch_tokens,
                                     job.backend, job.device)
        if result is not None:
            # the trained scheme's cost, measured once for it and every evaluation form of it
            cost_key = (forms.scheme_spec(unit.spec), unit.length)
            if cost_key not in costs:
                costs[cost_key] = layer_cost(model, unit.length, job.backend, job.device)
            row.update(costs[cost_key])
            key = {k: row[k] for k in ROW_KEY}
            updates.append((POSITIONS_CSV, key, position_rows(result, key)))
        updates.append(tables.row(results.EXTRAPOLATION_CSV, row))
        shown = (f"ppl {row['ppl']:.3f}, {row['bits_per_byte']:.4f} bits/byte" if row["status"] == "ok"
                 else row["status"])
        lines.append(f"{unit.spec:<12} seed {unit.seed} L={unit.length:<6} {mode:<10} {shown:<32} "
                     + (f"{row['eval_s']:.1f}s" if row["status"] == "ok" else row["message"]))
    return updates, lines


def unit_updates(unit: Unit, model: GPT, job: Job, tables: Tables,
                 costs: dict[tuple[str, int], dict]) -> tuple[list[Update], list[str]]:
    """Every row of `unit`, as updates of the CSVs, and the lines that report them."""
    base = {**unit.base, "device": str(job.device)}
    updates, lines = perplexity_updates(unit, model, base, job, tables, costs)
    if unit.attention:
        updates.append(tables.row(ATTENTION_CSV, attention_row(model, base, job.text)))
    for distance, length in unit.copies:
        row = copy_row(model, base, distance, length, job)
        updates.append(tables.row(COPY_CSV, row))
        shown = f"ratio {row['ratio']:.3f}" if row["status"] == "ok" else f"{row['status']} {row['message']}"
        lines.append(f"{unit.spec:<12} seed {unit.seed} copy d={distance:<6} {shown}")
    if unit.depths:
        rows = passkey_rows(model, base, unit.length, unit.depths, job)
        updates += [tables.row(PASSKEY_CSV, row) for row in rows]
        shown = " ".join(f"{r['depth']:.2f}:{r['accuracy']:.0%}" if r["status"] == "ok" else r["status"] for r in rows)
        lines.append(f"{unit.spec:<12} seed {unit.seed} passkey L={unit.length:<6} {shown}")
    if unit.mqar_depths:
        per_depth = mqar_rows(model, base, unit.length, unit.mqar_depths, job)
        updates += [tables.rows(MQAR_CSV, rows) for rows in per_depth]
        shown = " ".join(f"{rows[0]['depth']:.2f}:{sum(r['correct'] for r in rows) / sum(r['queries'] for r in rows):.0%}"
                         if rows[0]["status"] == "ok" else rows[0]["status"] for rows in per_depth)
        lines.append(f"{unit.spec:<12} seed {unit.seed} mqar L={unit.length:<6} {shown}")
    return updates, lines


def extrapolate_run(run_dir: Path, pairs: list[tuple[str, int]], job: Job, console) -> pd.DataFrame:
    """Evaluate every (variant, seed) in `pairs` for every task of `job` (see the module doc) and
    return the perplexity table.

    The work is a list of units (variant x seed x length). Under torchrun the processes take them
    round-robin, one unit each per round; after each round every rank's rows are gathered in unit
    order, so rank 0 writes the same CSVs, rows in the same order, as one process would (one
    process: rounds of one unit). A RelbenchError in any unit stops every rank after that round."""
    tables, units = distributed.on_main(plan, Path(run_dir), pairs, job, console)
    costs: dict[tuple[str, int], dict] = {}
    model, loaded = None, None
    for start in range(0, len(units), distributed.world()):
        index = start + distributed.rank()
        updates, lines, error = [], [], None
        if index < len(units):
            unit = units[index]
            try:
                if loaded != (unit.spec, unit.seed):   # the previous model is dropped before the next loads
                    model, loaded = None, (unit.spec, unit.seed)
                    model = checkpoints.load_model(checkpoint_of(run_dir, unit.spec, unit.seed), job.device)
                    model.config.attention = job.backend
                    forms.apply(model, unit.spec)      # an evaluation form: the weights stay as trained
                updates, lines = unit_updates(unit, model, job, tables, costs)
            except RelbenchError as failure:
                error = failure
        gathered = distributed.all_gather((updates, lines, error))   # rank order: unit order
        for rank_updates, rank_lines, _ in gathered:
            tables.merge(rank_updates)
            for line in rank_lines:
                console.print(line, markup=False)
        for _, _, rank_error in gathered:
            if rank_error is not None:
                raise rank_error
    return tables.frames[results.EXTRAPOLATION_CSV]
