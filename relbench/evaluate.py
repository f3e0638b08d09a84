"""Perplexity at evaluation lengths on the test split, in two protocols.

Both score the same N tokens (the first N + 1 test tokens; N a multiple of the longest length),
each exactly once, so lengths and modes are comparable:

- `nonoverlap`: window w feeds tokens [wL, (w+1)L) and scores every prediction in it. A share of
  the predictions sit near the start of a window with little context (the "early-token curse" of
  Press et al. 2022), so longer windows look better for a reason unrelated to extrapolation.
- `sliding` with stride S: after the first window, each window of L tokens ends S tokens after
  the previous one and scores only those last S predictions, which therefore see at least L - S
  tokens of context. Context tokens are not scored.

Loss by position: the mean loss in log-spaced bins of the position inside the window, which
shows where a variant breaks (the loss jumps right after the training length) and where it gains
from context.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from relbench import checkpoints, memory, results
from relbench.config import EvalConfig
from relbench.errors import UsageError
from relbench.model import GPT
from relbench.profile import profile_one


MODES = ("nonoverlap", "sliding")


@dataclass
class Perplexity:
    loss: float              # mean negative log-likelihood per scored token, nats
    ppl: float
    n_tokens: int
    n_windows: int
    seconds: float
    position_sum: np.ndarray    # (L,) summed loss of the predictions at each position in the window
    position_count: np.ndarray  # (L,) how many predictions were scored there


def validate_lengths(lengths: list[int], available: int) -> list[int]:
    """Sorted lengths, or a UsageError that says what is wrong with them."""
    if not lengths:
        raise UsageError("give at least one evaluation length, e.g. --lengths 256 1024 4096")
    bad = [n for n in lengths if n < 1]
    if bad:
        raise UsageError(f"evaluation lengths must be positive integers, got {bad[0]}")
    if len(set(lengths)) != len(lengths):
        dup = next(n for n in lengths if lengths.count(n) > 1)
        raise UsageError(f"evaluation length {dup} is given twice; give each length once")
    if max(lengths) > available:
        raise UsageError(f"length {max(lengths)} is longer than the evaluation text ({available:,} scorable "
                         f"tokens); use lengths up to {available:,} or a dataset with a larger test split")
    return sorted(lengths)


def scored_stream(test: np.ndarray, lengths: list[int], eval_tokens: int) -> torch.Tensor:
    """The first N + 1 test tokens, N scored: the largest multiple of max(lengths) that is at most
    `eval_tokens` (at least one longest window) and fits in the test split."""
    longest = max(lengths)
    available = test.size - 1
    n = min(max(eval_tokens, longest), available)
    n = max(longest, n - n % longest) if n >= longest else n
    return torch.from_numpy(test[: n + 1].astype(np.int64))


@dataclass(frozen=True)
class Window:
    start: int        # first input token
    size: int         # inputs start .. start + size - 1, targets shifted by one
    score_from: int   # predictions at positions score_from .. size - 1 are scored


def windows(n_scored: int, length: int, mode: str = "nonoverlap", stride: int | None = None) -> list[Window]:
    """The windows that score each of n_scored predictions exactly once."""
    if mode == "nonoverlap":
        return [Window(start, min(length, n_scored - start), 0) for start in range(0, n_scored, length)]
    if mode != "sliding":
        raise UsageError(f'unknown evaluation mode "{mode}"; choose from: {", ".join(MODES)}')
    stride = validate_stride(stride, length)
    out = [Window(0, min(length, n_scored), 0)]
    done = out[0].size
    while done < n_scored:
        end = min(done + stride, n_scored)
        start = max(0, end - length)
        out.append(Window(start, end - start, done - start))
        done = end
    return out


def validate_stride(stride: int | None, length: int) -> int:
    if stride is None or stride < 1:
        raise UsageError(f"the sliding mode needs a stride between 1 and the window length, got {stride}")
    return min(stride, length)


@torch.no_grad()
def perplexity(model: GPT, stream: torch.Tensor, length: int, max_batch_tokens: int, device: torch.device | str,
               mode: str = "nonoverlap", stride: int | None = None) -> Perplexity:
    """Perplexity of `model` over `stream` (N + 1 tokens) in windows of `length` (see module doc)."""
    model.eval()
    n_scored = stream.numel() - 1
    plan = windows(n_scored, length, mode, stride)
    per_batch = max(1, max_batch_tokens // length)
    position_sum = np.zeros(length)
    position_count = np.zeros(length, dtype=np.int64)
    start_time = time.perf_counter()
    groups: dict[tuple[int, int], list[Window]] = {}
    for window in plan:  # windows of the same shape batch together
        groups.setdefault((window.size, window.score_from), []).append(window)
    for (size, score_from), group in groups.items():
        for b in range(0, len(group), per_batch):
            batch = group[b: b + per_batch]
            idx = torch.stack([stream[w.start: w.start + size + 1] for w in batch]).to(device)  # (B, size + 1)
            logits = model(idx[:, :-1])[:, score_from:]                                        # (B, scored, V)
            nll = F.cross_entropy(logits.float().flatten(0, 1), idx[:, score_from + 1:].flatten(),
                                  reduction="none").view(len(batch), -1)                         # (B, scored)
            position_sum[score_from:size] += nll.double().sum(0).cpu().numpy()
            position_count[score_from:size] += len(batch)
    seconds = time.perf_counter() - start_time
    assert int(position_count.sum()) == n_scored, "every prediction is scored exactly once"
    loss = float(position_sum.sum() / n_scored)
    return Perplexity(loss, math.exp(loss), n_scored, len(plan), seconds, position_sum, position_count)


def position_bins(length: int) -> list[tuple[int, int]]:
    """Log-spaced bins [0, 1), [1, 2), [2, 4), ... of positions inside a window of `length`."""
    edges = [0] + [2 ** i for i in range(int(math.log2(length)) + 1) if 2 ** i < length] + [length]
    return list(zip(edges[:-1], edges[1:]))


def position_rows(result: Perplexity, base: dict) -> list[dict]:
    """One row per position bin: scored predictions, summed and mean loss."""
    rows = []
    for lo, hi in position_bins(len(result.position_sum)):
        count = int(result.position_count[lo:hi].sum())
        if count:
            total = float(result.position_sum[lo:hi].sum())
            rows.append({**base, "bin_start": lo, "bin_end": hi, "n_tokens": count, "loss_sum": total,
                         "loss": total / count})
    return rows


# ---- the `extrapolate` command's work: every trained variant x seed at every length and mode --------
ROW_KEY = ["variant", "seed", "length", "mode"]
POSITIONS_CSV = "positions.csv"
COST = ("bias_ms", "bias_peak_mb", "attention_ms", "attention_peak_mb")


def evaluate_variant(model: GPT, spec: str, seed: int, stream: torch.Tensor, length: int, mode: str,
                     stride: int | None, max_batch_tokens: int, backend: str,
                     device: torch.device) -> tuple[dict, Perplexity | None]:
    """One tidy row (perplexity at `length` in `mode`) and the full result, or None if it did not run."""
    n_scored = stream.numel() - 1
    stride = length if mode == "nonoverlap" else validate_stride(stride, length)
    row = {"variant": spec, "seed": seed, "length": length, "mode": mode, "window": length, "stride": stride,
           "train_length": model.config.train_length, "attention": backend, "device": str(device),
           "status": "ok", "loss": float("nan"), "ppl": float("nan"), "n_tokens": n_scored,
           "n_windows": len(windows(n_scored, length, mode, stride)), "eval_s": float("nan"),
           "tokens_per_s": float("nan"), **{k: float("nan") for k in COST}, "message": ""}
    if model.max_length is not None and length > model.max_length:
        row.update(status="unsupported", message=f"no position representation beyond {model.max_length}")
        return row, None
    per_batch = max(1, max_batch_tokens // length)
    need = memory.evaluation_bytes(model.config, backend, length, per_batch, model.positions[0].adds_bias())
    have = memory.budget(device)
    if have is not None and need > have:  # the kernel would kill the process instead of raising
        row.update(status="oom", message=f"skipped: {backend} attention at length {length} needs about "
                                         f"{memory.human(need)}, {memory.human(have)} available on {device}")
        return row, None
    try:
        result = perplexity(model, stream, length, max_batch_tokens, device, mode, stride)
    except (RuntimeError, MemoryError) as error:
        if not memory.is_out_of_memory(error):
            raise
        row.update(status="oom", message=f"out of memory at length {length} on {device}")
        return row, None
    row.update(loss=result.loss, ppl=result.ppl, eval_s=result.seconds, tokens_per_s=result.n_tokens / result.seconds)
    return row, result


def layer_cost(model: GPT, length: int, backend: str, device: torch.device) -> dict:
    """Cost of one layer of this model's shape (batch 1): bias construction and attention."""
    config = model.config
    cost = profile_one(config.position, backend, length, batch=1, heads=config.n_heads, head_dim=config.head_dim,
                       device=str(device), repeats=3, train_max=0, train_length=config.train_length)
    return {k: float("nan") if cost.get(k) is None else cost[k] for k in COST}


def extrapolate_run(run_dir: Path, pairs: list[tuple[str, int]], lengths: list[int], modes: list[str],
                    stride: int | None, stream: torch.Tensor, eval_config: EvalConfig, backend: str,
                    device: torch.device, console, force: bool = False) -> pd.DataFrame:
    """Evaluate every (variant, seed) in `pairs` at every length and mode. Rows are written to
    extrapolation.csv and positions.csv as each finishes, replacing earlier rows with the same key;
    rows already there for the same protocol (stride, scored tokens) are kept and not recomputed
    unless `force`, so an interrupted run computes only the rest when run again. The cost of bias
    and attention is measured once per variant and length (it depends on neither seed nor mode)."""
    path, bins_path = Path(run_dir) / results.EXTRAPOLATION_CSV, Path(run_dir) / POSITIONS_CSV
    table = results.read_csv(path, set(ROW_KEY) | {"status", "stride", "n_tokens"}) if path.is_file() else pd.DataFrame()
    bins = results.read_csv(bins_path, set(ROW_KEY)) if bins_path.is_file() else pd.DataFrame()
    n_scored = stream.numel() - 1
    costs: dict[tuple[str, int], dict] = {}
    for spec, seed in pairs:
        todo = [(length, mode) for length in lengths for mode in modes
                if force or not _done(table, spec, seed, length, mode, length if mode == "nonoverlap" else stride, n_scored)]
        if len(todo) < len(lengths) * len(modes):
            console.print(f"{spec:<12} seed {seed}: {len(lengths) * len(modes) - len(todo)} row(s) already computed, kept",
                          markup=False)
        if not todo:
            continue
        model = checkpoints.load_model(results.checkpoint_dir(run_dir, spec, seed), device)
        model.config.attention = backend
        for length, mode in todo:
            row, result = evaluate_variant(model, spec, seed, stream, length, mode, stride,
                                           eval_config.max_batch_tokens, backend, device)
            if result is not None:
                if (spec, length) not in costs:
                    costs[spec, length] = layer_cost(model, length, backend, device)
                row.update(costs[spec, length])
                key = {"variant": spec, "seed": seed, "length": length, "mode": mode}
                bins = results.replace_rows(bins, key, position_rows(result, key))
            shown = f"ppl {row['ppl']:.3f}" if row["status"] == "ok" else row["status"]
            console.print(f"{spec:<12} seed {seed} L={length:<6} {mode:<10} {shown:<14} "
                          + (f"{row['eval_s']:.1f}s" if row["status"] == "ok" else row["message"]), markup=False)
            table = results.upsert(table, row, ROW_KEY)
            results.write_csv(bins_path, bins)
            results.write_csv(path, table)
        del model
    return table


def _done(table: pd.DataFrame, spec: str, seed: int, length: int, mode: str, stride: int | None, n_scored: int) -> bool:
    if table.empty:
        return False
    same = table[(table["variant"] == spec) & (table["seed"] == seed) & (table["length"] == length)
                 & (table["mode"] == mode)]
    return bool(((same["status"].isin(["ok", "unsupported"])) & (same["stride"] == stride)
                 & (same["n_tokens"] == n_scored)).any())
