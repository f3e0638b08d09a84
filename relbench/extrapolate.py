"""The `extrapolate` command's work: every trained variant x seed, at every length, for each task.

    perplexity  -> extrapolation.csv (one row per variant x seed x length x protocol: perplexity and bits
                   per byte, see relbench/evaluate.py), positions.csv and
                   attention.csv (how far the model looks at its training length, hard windows)
    copy        -> copy.csv     (one row per variant x seed x copy distance)
    passkey     -> passkey.csv  (one row per variant x seed x length x depth)

Rows are written as each finishes. A row already there for the same key (for perplexity the key
holds the protocol: mode, effective stride, scored tokens and segment length; for the tasks the
number of trials) is kept and not recomputed unless `force`, so an interrupted run computes only
the rest when run again, and rows of different protocols never replace each other. Every row
records the precision the model was trained in; evaluation is fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from relbench import checkpoints, evaluate, memory, results
from relbench.attention import path_label, recording
from relbench.config import EvalConfig
from relbench.evaluate import ScoredText, effective_stride, position_rows, windows
from relbench.model import GPT
from relbench.profile import profile_one
from relbench.tasks import copy as copy_task
from relbench.tasks import passkey

ROW_KEY = ["variant", "seed", "length", "mode", "stride", "n_tokens", "segment"]
POSITIONS_CSV = "positions.csv"
COPY_CSV = "copy.csv"
PASSKEY_CSV = "passkey.csv"
ATTENTION_CSV = "attention.csv"   # how far each model looks at its training length (inspect.window_diagnostics)
ATTENTION_KEY = ["variant", "seed", "length"]
COPY_KEY = ["variant", "seed", "distance", "trials"]
PASSKEY_KEY = ["variant", "seed", "length", "depth", "trials"]
PASSKEY_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
COST = ("bias_ms", "bias_peak_mb", "attention_ms", "attention_peak_mb")
LONG_COST = 16384   # from this length on, the layer cost is one timed call
DONE = ("ok", "unsupported")


@dataclass(frozen=True)
class Skipped:
    status: str     # "unsupported" or "oom"
    message: str


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


def copy_rows(model: GPT, base: dict[str, Any], stream: torch.Tensor, lengths: list[int], trials: int,
              max_batch_tokens: int, backend: str, device: torch.device, done: pd.DataFrame, force: bool) -> list[dict]:
    rows = []
    for distance, length in copy_task.distances(lengths):
        row = {**base, "distance": distance, "length": length, "trials": trials, "status": "ok",
               "loss_copy": float("nan"), "loss_plain": float("nan"), "ratio": float("nan"),
               "ratio_low": float("nan"), "ratio_high": float("nan"), "message": ""}
        if not force and _done(done, row, COPY_KEY):
            continue
        unfit = _unfit(model, length, max(1, max_batch_tokens // length), backend, device)
        if unfit is None:
            unfit = _guarded(lambda: copy_task.copy_losses(model, stream, distance, trials, device, max_batch_tokens),
                             length, device)
        if isinstance(unfit, Skipped):
            row.update(status=unfit.status, message=unfit.message)
        else:
            low, high = unfit.interval()
            row.update(loss_copy=float(unfit.loss_copy.mean()), loss_plain=float(unfit.loss_plain.mean()),
                       ratio=unfit.ratio, ratio_low=low, ratio_high=high)
        rows.append(row)
    return rows


def passkey_rows(model: GPT, base: dict[str, Any], stream: torch.Tensor, lengths: list[int], trials: int,
                 max_batch_tokens: int, backend: str, device: torch.device, tokenizer, done: pd.DataFrame,
                 force: bool) -> list[dict]:
    rows = []
    tokens = stream.numpy()
    for length in lengths:
        todo = [depth for depth in PASSKEY_DEPTHS if force or not _done(
            done, {**base, "length": length, "depth": depth, "trials": trials}, PASSKEY_KEY)]
        if not todo:
            continue
        unfit = _unfit(model, length, max(1, max_batch_tokens // length), backend, device)
        if unfit is None and length < passkey.min_length(tokenizer):
            unfit = Skipped("unsupported", f"a passkey trial needs at least {passkey.min_length(tokenizer)} tokens")
        # the full, fixed set of trials, of which the depths still to do are taken: the same keys and
        # filler whatever was computed before
        plan = [t for t in passkey.trials(tokens.size, length, list(PASSKEY_DEPTHS), trials) if t.depth in todo]
        if unfit is None:
            unfit = _guarded(lambda: passkey.accuracy(model, tokens, plan, length, tokenizer, device, max_batch_tokens),
                             length, device)
        for i, depth in enumerate(todo):
            row = {**base, "length": length, "depth": depth, "trials": trials, "status": "ok",
                   "correct": float("nan"), "accuracy": float("nan"), "message": ""}
            if isinstance(unfit, Skipped):
                row.update(status=unfit.status, message=unfit.message)
            else:
                correct = sum(unfit[i * trials: (i + 1) * trials])
                row.update(correct=correct, accuracy=correct / trials)
            rows.append(row)
    return rows


def attention_row(model: GPT, base: dict[str, Any], text: ScoredText, windows_used: int = 4) -> dict:
    """Attention reach at the training length, on the first window of up to `windows_used` segments."""
    from relbench.inspect import window_diagnostics

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


def extrapolate_run(run_dir: Path, pairs: list[tuple[str, int]], lengths: list[int], modes: list[str],
                    stride: int | None, text: ScoredText, eval_config: EvalConfig, backend: str,
                    device: torch.device, console, force: bool = False, tasks: tuple[str, ...] = ("perplexity",),
                    trials: int = 20, tokenizer=None) -> pd.DataFrame:
    """Evaluate every (variant, seed) in `pairs` for every task (see the module doc). The cost of bias
    and attention is measured once per variant and length (it depends on neither seed nor mode)."""
    run_dir = Path(run_dir)
    paths = {name: run_dir / name for name in (results.EXTRAPOLATION_CSV, POSITIONS_CSV, COPY_CSV, PASSKEY_CSV)}
    table = _read(paths[results.EXTRAPOLATION_CSV], ROW_KEY)
    bins = results.read_csv(paths[POSITIONS_CSV]) if paths[POSITIONS_CSV].is_file() else pd.DataFrame()
    copies, keys = _read(paths[COPY_CSV], COPY_KEY), _read(paths[PASSKEY_CSV], PASSKEY_KEY)
    reach = _read(run_dir / ATTENTION_CSV, ATTENTION_KEY)
    costs: dict[tuple[str, int], dict] = {}
    for spec, seed in pairs:
        folder = results.checkpoint_dir(run_dir, spec, seed)
        meta = checkpoints.read_meta(folder) or {}
        precision = meta.get("train", {}).get("precision") or meta.get("summary", {}).get("precision") or "unknown"
        base = {"variant": spec, "seed": seed, "train_length": meta.get("model", {}).get("train_length"),
                "precision": precision, "eval_precision": "fp32", "device": str(device)}
        todo = [(length, mode) for length in lengths for mode in modes if "perplexity" in tasks and (force or not _done(
            table, {**base, "length": length, "mode": mode, "stride": effective_stride(mode, stride, length),
                    "n_tokens": text.n_tokens, "segment": text.segment}, ROW_KEY))]
        if "perplexity" in tasks and len(todo) < len(lengths) * len(modes):
            console.print(f"{spec:<12} seed {seed}: {len(lengths) * len(modes) - len(todo)} perplexity row(s) already "
                          f"computed, kept", markup=False)
        model = None

        def loaded() -> GPT:
            nonlocal model
            if model is None:
                model = checkpoints.load_model(folder, device)
                model.config.attention = backend
            return model

        for length, mode in todo:
            row, result = perplexity_row(loaded(), base, text, length, mode, stride, eval_config.max_batch_tokens,
                                         backend, device)
            if result is not None:
                if (spec, length) not in costs:
                    costs[spec, length] = layer_cost(loaded(), length, backend, device)
                row.update(costs[spec, length])
                key = {k: row[k] for k in ROW_KEY}
                bins = results.replace_rows(bins, key, position_rows(result, key))
            shown = (f"ppl {row['ppl']:.3f}, {row['bits_per_byte']:.4f} bits/byte" if row["status"] == "ok"
                     else row["status"])
            console.print(f"{spec:<12} seed {seed} L={length:<6} {mode:<10} {shown:<32} "
                          + (f"{row['eval_s']:.1f}s" if row["status"] == "ok" else row["message"]), markup=False)
            table = results.upsert(table, row, ROW_KEY)
            results.write_csv(paths[POSITIONS_CSV], bins)
            results.write_csv(paths[results.EXTRAPOLATION_CSV], table)
        train_length = base["train_length"] or loaded().config.train_length
        if force or not _done(reach, {**base, "length": train_length}, ATTENTION_KEY):
            reach = results.upsert(reach, attention_row(loaded(), base, text), ATTENTION_KEY)
            results.write_csv(run_dir / ATTENTION_CSV, reach)
        if "copy" in tasks:
            for row in copy_rows(loaded(), base, text.tokens, lengths, trials, eval_config.max_batch_tokens, backend,
                                 device, copies, force):
                copies = results.upsert(copies, row, COPY_KEY)
                results.write_csv(paths[COPY_CSV], copies)
                shown = f"ratio {row['ratio']:.3f}" if row["status"] == "ok" else f"{row['status']} {row['message']}"
                console.print(f"{spec:<12} seed {seed} copy d={row['distance']:<6} {shown}", markup=False)
        if "passkey" in tasks:
            rows = passkey_rows(loaded(), base, text.tokens, lengths, trials,
                                eval_config.max_batch_tokens, backend, device, tokenizer, keys, force)
            for row in rows:
                keys = results.upsert(keys, row, PASSKEY_KEY)
            if rows:
                results.write_csv(paths[PASSKEY_CSV], keys)
                for length in dict.fromkeys(r["length"] for r in rows):
                    mine = [r for r in rows if r["length"] == length]
                    shown = " ".join(f"{r['depth']:.2f}:{r['accuracy']:.0%}" if r["status"] == "ok" else r["status"]
                                     for r in mine)
                    console.print(f"{spec:<12} seed {seed} passkey L={length:<6} {shown}", markup=False)
        del model
    return table
