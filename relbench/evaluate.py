"""Perplexity at evaluation lengths on the test split.

Non-overlapping windows: the same N scored tokens at every length L. Window w feeds tokens
[wL, (w+1)L) and scores the next token at each position, so each of the N tokens is predicted
exactly once at every length; N is a multiple of the longest length, and a length that does not
divide N ends with one shorter window. Lengths are therefore comparable: only the context
available to each prediction changes.
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

from relbench import results
from relbench.config import EvalConfig
from relbench.errors import UsageError
from relbench.model import GPT
from relbench.profile import is_out_of_memory, profile_one


@dataclass
class Perplexity:
    loss: float          # mean negative log-likelihood per scored token, nats
    ppl: float
    n_tokens: int
    n_windows: int
    seconds: float


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


def window_starts(n_scored: int, length: int) -> list[tuple[int, int]]:
    """(start, size) of each non-overlapping window covering n_scored predictions."""
    return [(start, min(length, n_scored - start)) for start in range(0, n_scored, length)]


@torch.no_grad()
def perplexity(model: GPT, stream: torch.Tensor, length: int, max_batch_tokens: int,
               device: torch.device | str) -> Perplexity:
    """Perplexity of `model` over `stream` (N + 1 tokens) in non-overlapping windows of `length`."""
    model.eval()
    n_scored = stream.numel() - 1
    windows = window_starts(n_scored, length)
    per_batch = max(1, max_batch_tokens // length)
    total_nll = 0.0
    start_time = time.perf_counter()
    # equal-size windows batch together; the one shorter tail window runs alone
    groups = [[w for w in windows if w[1] == length], [w for w in windows if w[1] != length]]
    for group in groups:
        for b in range(0, len(group), per_batch):
            batch = group[b: b + per_batch]
            size = batch[0][1]
            idx = torch.stack([stream[s: s + size + 1] for s, _ in batch]).to(device)  # (B, size + 1)
            logits = model(idx[:, :-1])                                                 # (B, size, V)
            nll = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1),
                                  reduction="sum")
            total_nll += float(nll)
    seconds = time.perf_counter() - start_time
    loss = total_nll / n_scored
    return Perplexity(loss, math.exp(loss), n_scored, len(windows), seconds)


# ---- the `extrapolate` command's work: every trained variant at every length ----------------------
ROW_KEY = ["variant", "seed", "length", "mode"]


def evaluate_variant(model: GPT, spec: str, seed: int, stream: torch.Tensor, length: int, max_batch_tokens: int,
                     backend: str, device: torch.device) -> dict:
    """One tidy row: perplexity at `length` and the cost of bias construction and attention."""
    row = {"variant": spec, "seed": seed, "length": length, "mode": "nonoverlap",
           "train_length": model.config.train_length, "attention": backend, "device": str(device),
           "status": "ok", "loss": float("nan"), "ppl": float("nan"), "n_tokens": stream.numel() - 1,
           "n_windows": len(window_starts(stream.numel() - 1, length)), "eval_s": float("nan"),
           "tokens_per_s": float("nan"), "bias_ms": float("nan"), "bias_peak_mb": float("nan"),
           "attention_ms": float("nan"), "attention_peak_mb": float("nan"), "message": ""}
    if model.max_length is not None and length > model.max_length:
        row.update(status="unsupported", message=f"no position representation beyond {model.max_length}")
        return row
    try:
        result = perplexity(model, stream, length, max_batch_tokens, device)
        row.update(loss=result.loss, ppl=result.ppl, eval_s=result.seconds,
                   tokens_per_s=result.n_tokens / result.seconds)
        cost = layer_cost(model, length, backend, device)
        row.update({k: (float("nan") if cost.get(k) is None else cost[k])
                    for k in ("bias_ms", "bias_peak_mb", "attention_ms", "attention_peak_mb")})
    except (RuntimeError, MemoryError) as error:
        if not is_out_of_memory(error):
            raise
        row.update(status="oom", message=f"out of memory at length {length} on {device}")
    return row


def layer_cost(model: GPT, length: int, backend: str, device: torch.device) -> dict:
    """Cost of one layer of this model's shape (batch 1): bias construction and attention."""
    config = model.config
    return profile_one(config.position, backend, length, batch=1, heads=config.n_heads, head_dim=config.head_dim,
                       device=str(device), repeats=3, train_max=0, train_length=config.train_length)


def extrapolate_run(run_dir: Path, specs: list[str], seed: int, lengths: list[int], stream: torch.Tensor,
                    eval_config: EvalConfig, backend: str, device: torch.device, console) -> pd.DataFrame:
    """Evaluate every variant in `specs` at every length; rows are written to extrapolation.csv as
    each finishes, replacing earlier rows with the same (variant, seed, length, mode)."""
    path = Path(run_dir) / results.EXTRAPOLATION_CSV
    table = results.read_csv(path) if path.is_file() else pd.DataFrame()
    for spec in specs:
        model = results.load_model(results.checkpoint_dir(run_dir, spec, seed), device)
        model.config.attention = backend
        for length in lengths:
            row = evaluate_variant(model, spec, seed, stream, length, eval_config.max_batch_tokens, backend, device)
            shown = f"ppl {row['ppl']:.3f}" if row["status"] == "ok" else row["status"]
            console.print(f"{spec:<12} L={length:<6} {shown:<14} "
                          + (f"{row['eval_s']:.1f}s" if row["status"] == "ok" else row["message"]))
            table = results.upsert(table, row, ROW_KEY)
            results.write_csv(path, table)
        del model
    return table
