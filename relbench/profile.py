"""Timing and peak memory of position-bias construction and of attention.

Method (see ../shared/STYLE.md): warm up, synchronise the device before reading the clock, take
the median (and min/max) of repeats, and reset/read peak memory around exactly the measured call.
CPU peak memory is the process's resident-set high-water mark (VmHWM, reset through
/proc/self/clear_refs), because torch's CPU allocations are invisible to tracemalloc; CUDA peak
memory is torch.cuda.max_memory_allocated. Nothing is cached between repeats: every repeat
builds the bias again.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from relbench.attention import attention
from relbench.positions.base import PositionEncoding

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _rss_kb(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class PeakMemory:
    """Context manager: extra peak memory (MB) of the enclosed code on `device`, or None where the
    platform cannot tell (CPU off Linux)."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.mb: float | None = None

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            self._base = None
            try:
                _CLEAR_REFS.write_text("5")  # resets VmHWM to the current RSS
                self._base = _rss_kb("VmRSS")
            except OSError:
                pass
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.mb = (torch.cuda.max_memory_allocated(self.device) - self._base) / 2**20
        elif self._base is not None:
            peak = _rss_kb("VmHWM")
            self.mb = None if peak is None else max(0, peak - self._base) / 1024


def synchronize(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    peak_mb: float | None
    repeats: int


def measure(fn: Callable[[], object], device: torch.device | str, repeats: int = 5, warmup: int = 1) -> Timing:
    """Median/min/max wall time of fn() over `repeats` runs after `warmup` runs, and the peak
    extra memory of one run (measured on its own, after the timed runs)."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append((time.perf_counter() - start) * 1000)
    with PeakMemory(device) as peak:
        fn()
    return Timing(statistics.median(times), min(times), max(times), peak.mb, repeats)


def position_terms(position: PositionEncoding, q: torch.Tensor, k: torch.Tensor, length: int):
    """Everything the scheme computes before attention: absolute embedding, rotation, bias."""
    position.embed(length)
    q, k = position.rotate(q, k)
    return q, k, position.bias(length, length)


@torch.no_grad()
def bias_and_attention_cost(position: PositionEncoding, length: int, backend: str, device: torch.device | str,
                            batch: int = 1, repeats: int = 3, warmup: int = 1, seed: int = 0) -> dict[str, float | None]:
    """Forward cost, at one length, of building the position terms and of the attention call
    (given those terms), for one layer of `position` with random q, k, v of (batch, H, L, Dh)."""
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, position.n_heads, length, position.head_dim)
    q, k, v = (torch.randn(shape, generator=generator).to(device) for _ in range(3))
    build = measure(lambda: position_terms(position, q, k, length), device, repeats, warmup)
    q_rot, k_rot, bias = position_terms(position, q, k, length)
    attend = measure(lambda: attention(q_rot, k_rot, v, position=position, backend=backend, bias=bias),
                     device, repeats, warmup)
    del bias
    return {"bias_ms": build.median_ms, "bias_peak_mb": build.peak_mb,
            "attention_ms": attend.median_ms, "attention_peak_mb": attend.peak_mb}
