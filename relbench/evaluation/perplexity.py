"""Perplexity at evaluation lengths on the test split, in two protocols, with intervals.

The scored text: `n` segments of M scored predictions each (M = the longest evaluated length,
n = eval_tokens // M), spread evenly over the whole test split (every part of it, not its first
documents), each preceded by M tokens of context that are read but never scored. Every length and
both modes score exactly these n x M predictions, each once, so lengths and modes differ only in
the context each prediction sees:

- `nonoverlap`: each segment is cut into windows of L tokens; every prediction in a window is
  scored. A share of the predictions sit near the start of a window with little context (the
  "early-token curse" of Press et al. 2022), so longer windows look better for a reason unrelated
  to extrapolation.
- `sliding` with stride S: windows of L tokens end S tokens apart and score only their last S
  predictions, so every scored prediction sees at least L - S tokens of context (the segment's
  context reaches back far enough for the first window too).

Bits per byte: the total loss in bits over the scored predictions divided by the UTF-8 bytes of the
scored targets (each target token's byte length, tokenizer.token_bytes): per-token perplexity
depends on how much text a token holds, bits per byte does not, so it is the figure that compares
tokenizers. For byte tokens it is loss / ln 2.

Uncertainty from the text: a bootstrap over the scored windows (1,000 resamples, fixed seed) gives
a 95% interval of the perplexity (`ppl_low`, `ppl_high`), so a single seed shows how much the
figure depends on which text was scored. Loss by position: the summed loss in log-spaced bins of
the position inside the window, which shows where a variant breaks (the loss jumps right after the
training length) and where it gains from context.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from relbench.errors import UsageError
from relbench.model import GPT

MODES = ("nonoverlap", "sliding")
BOOTSTRAP_SAMPLES = 1000


@dataclass(frozen=True)
class ScoredText:
    """Where the scored predictions are: segment k's inputs start at offsets[k] + context."""

    tokens: torch.Tensor     # the whole test split, int64
    offsets: list[int]       # first context token of each segment
    segment: int             # scored predictions per segment (M)
    context: int             # unscored tokens before each segment's scored part
    token_bytes: torch.Tensor  # (V,) int64: UTF-8 bytes of each token id (tokenizer.token_bytes)

    @property
    def n_tokens(self) -> int:
        return len(self.offsets) * self.segment


def scored_text(test: np.ndarray, lengths: list[int], eval_tokens: int, token_bytes: np.ndarray) -> ScoredText:
    """n = eval_tokens // M segments (at least one, at most what the test split holds without
    overlap) of M = max(lengths) scored predictions, each after M context tokens, spread evenly
    from the start to the end of the test split. `token_bytes`: the tokenizer's bytes per token id
    (tokenizer.token_bytes; no default: byte counts of another tokenizer would be silently wrong)."""
    longest = max(lengths)
    span = 2 * longest + 1
    if test.size < span:
        raise UsageError(f"length {longest} needs {span:,} test tokens ({longest:,} of context before {longest:,} "
                         f"scored); the test split has {test.size:,}: use lengths up to {(test.size - 1) // 2:,}")
    count = max(1, min(eval_tokens // longest, test.size // span))
    offsets = np.linspace(0, test.size - span, count).round().astype(int).tolist() if count > 1 else [0]
    return ScoredText(torch.from_numpy(test.astype(np.int64)), offsets, longest, longest,
                      torch.tensor(np.asarray(token_bytes), dtype=torch.int64))


def validate_lengths(lengths: list[int], available: int) -> list[int]:
    """Sorted lengths, or a UsageError that says what is wrong with them. `available`: the longest
    length the text allows."""
    if not lengths:
        raise UsageError("give at least one evaluation length, e.g. --lengths 256 1024 4096")
    bad = [n for n in lengths if n < 1]
    if bad:
        raise UsageError(f"evaluation lengths must be positive integers, got {bad[0]}")
    if len(set(lengths)) != len(lengths):
        dup = next(n for n in lengths if lengths.count(n) > 1)
        raise UsageError(f"evaluation length {dup} is given twice; give each length once")
    if max(lengths) > available:
        raise UsageError(f"length {max(lengths)} is longer than the evaluation text allows ({available:,} tokens); "
                         f"use lengths up to {available:,} or a dataset with a larger test split")
    return sorted(lengths)


def longest_length(test_size: int) -> int:
    """The longest evaluation length a test split of `test_size` tokens allows (context + scored)."""
    return (test_size - 1) // 2


@dataclass(frozen=True)
class Window:
    start: int        # first input token (index into the test split)
    size: int         # inputs start .. start + size - 1, targets shifted by one
    score_from: int   # predictions at positions score_from .. size - 1 are scored


def windows(text: ScoredText, length: int, mode: str = "nonoverlap", stride: int | None = None) -> list[Window]:
    """The windows that score each of the text's predictions exactly once."""
    if mode not in MODES:
        raise UsageError(f'unknown evaluation mode "{mode}"; choose from: {", ".join(MODES)}')
    out = []
    for offset in text.offsets:
        first, last = offset + text.context, offset + text.context + text.segment   # scored input positions
        if mode == "nonoverlap":
            out += [Window(s, min(length, last - s), 0) for s in range(first, last, length)]
            continue
        step = effective_stride(mode, stride, length)
        done = first
        while done < last:
            end = min(done + step, last)
            out.append(Window(end - length, length, length - (end - done)))
            done = end
    return out


def effective_stride(mode: str, stride: int | None, length: int) -> int:
    """The number of predictions each window scores: L without overlap, min(S, L) when sliding."""
    if mode == "nonoverlap":
        return length
    if stride is None or stride < 1:
        raise UsageError(f"the sliding mode needs a stride between 1 and the window length, got {stride}")
    return min(stride, length)


@dataclass
class Perplexity:
    loss: float              # mean negative log-likelihood per scored token, nats
    ppl: float
    ppl_low: float           # bootstrap 95% interval over windows
    ppl_high: float
    n_tokens: int
    n_windows: int
    seconds: float
    n_bytes: int             # UTF-8 bytes of the scored targets
    bits_per_byte: float     # total loss in bits / n_bytes
    position_sum: np.ndarray    # (L,) summed loss of the predictions at each position in the window
    position_count: np.ndarray  # (L,) how many predictions were scored there


def bootstrap_interval(window_loss: np.ndarray, window_count: np.ndarray, samples: int = BOOTSTRAP_SAMPLES,
                       seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of exp(total loss / total count) over windows resampled with replacement."""
    n = len(window_loss)
    picks = np.random.default_rng(seed).integers(0, n, size=(samples, n))
    ppl = np.exp(window_loss[picks].sum(1) / window_count[picks].sum(1))
    low, high = np.percentile(ppl, [2.5, 97.5])
    return float(low), float(high)


@torch.no_grad()
def perplexity(model: GPT, text: ScoredText, length: int, max_batch_tokens: int, device: torch.device | str,
               mode: str = "nonoverlap", stride: int | None = None) -> Perplexity:
    """Perplexity of `model` over the scored text in windows of `length` (see the module doc)."""
    model.eval()
    plan = windows(text, length, mode, stride)
    per_batch = max(1, max_batch_tokens // length)
    position_sum = np.zeros(length)
    position_count = np.zeros(length, dtype=np.int64)
    window_loss = np.zeros(len(plan))
    window_bytes = np.zeros(len(plan), dtype=np.int64)   # UTF-8 bytes of each window's scored targets
    window_count = np.array([w.size - w.score_from for w in plan], dtype=np.float64)
    start_time = time.perf_counter()
    groups: dict[tuple[int, int], list[int]] = {}
    for index, window in enumerate(plan):  # windows of the same shape batch together
        groups.setdefault((window.size, window.score_from), []).append(index)
    for (size, score_from), members in groups.items():
        for b in range(0, len(members), per_batch):
            batch = members[b: b + per_batch]
            rows = torch.stack([text.tokens[plan[i].start: plan[i].start + size + 1] for i in batch])   # (B, size+1)
            idx = rows.to(device)
            logits = model(idx[:, :-1])[:, score_from:]                                        # (B, scored, V)
            nll = F.cross_entropy(logits.float().flatten(0, 1), idx[:, score_from + 1:].flatten(),
                                  reduction="none").view(len(batch), -1).double().cpu().numpy()  # (B, scored)
            position_sum[score_from:size] += nll.sum(0)
            position_count[score_from:size] += len(batch)
            window_loss[batch] = nll.sum(1)
            window_bytes[batch] = text.token_bytes[rows[:, score_from + 1:]].sum(1).numpy()
    seconds = time.perf_counter() - start_time
    assert int(position_count.sum()) == text.n_tokens, "every prediction is scored exactly once"
    loss = float(window_loss.sum() / text.n_tokens)
    low, high = bootstrap_interval(window_loss, window_count)
    n_bytes = int(window_bytes.sum())
    # loss x tokens is the total loss; written as a ratio of counts so that byte tokens give loss / ln 2 exactly
    bits_per_byte = loss * (text.n_tokens / n_bytes) / math.log(2)
    return Perplexity(loss, math.exp(loss), low, high, text.n_tokens, len(plan), seconds, n_bytes, bits_per_byte,
                      position_sum, position_count)


def position_bins(length: int) -> list[tuple[int, int]]:
    """Log-spaced bins [0, 1), [1, 2), [2, 4), ... of positions inside a window of `length`."""
    edges = [0] + [2 ** i for i in range(int(math.log2(length)) + 1) if 2 ** i < length] + [length]
    return list(itertools.pairwise(edges))


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
