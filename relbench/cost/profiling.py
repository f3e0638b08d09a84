"""Timing and peak memory of position-bias construction and of attention.

Method: warm up, synchronise the device before reading the clock, take the median (and min/max) of
repeats, and reset/read peak memory around exactly the measured call. CPU peak memory is the VmHWM
high-water mark (reset through /proc/self/clear_refs: torch's CPU allocations are invisible to
tracemalloc); `relbench profile` runs each configuration in a fresh process and, before the peak-memory
run, lowers glibc's mmap threshold to 64 KiB so that freed buffers leave the resident set. CUDA peak
memory is torch.cuda.max_memory_allocated.

What is measured, per variant x backend x length, for one layer with random q, k, v:
- `bias`: building the position terms: the bias plan (a per-distance vector, or Shaw's
  query-vector products), the rotation of q and k, the absolute embedding; never cached.
- `attention`: the attention call given those terms, and the path it really took (`path`: the
  `split` backend on a sequence too short for far keys runs the chunked path, and says so); it
  includes materialising whatever part of the bias the backend needs. Cached across repeats:
  flex's compiled kernel and causal block mask (per length); the first call, compilation included, is reported as first_call_s.
- `train`: forward + backward of position terms and attention together, where the backend can
  train on the device and the length is at most `train_max`. A layout: each layer, the row their mean.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    import pandas as pd

from relbench import positions
from relbench.attention import check, flush_denormals, path_label, recording, scheme_attention
from relbench.cost import memory
from relbench.errors import RelbenchError
from relbench.positions.base import PositionEncoding

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def rss_kb(field: str) -> int | None:
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

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            self._base = None
            try:
                _CLEAR_REFS.write_text("5")  # resets VmHWM to the current RSS
                self._base = rss_kb("VmRSS")
            except OSError:
                pass
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.mb = (torch.cuda.max_memory_allocated(self.device) - self._base) / 2**20
        elif self._base is not None:
            peak = rss_kb("VmHWM")
            self.mb = None if peak is None else max(0, peak - self._base) / 1024


ISOLATED = False  # set in the fresh process that `relbench profile` runs per configuration


def _small_mmap_threshold() -> None:
    """In an isolated profiling process, before the peak-memory run only (timed runs use the normal
    allocator): serve every allocation above 64 KiB with mmap, so freed buffers leave the resident
    set and the high-water mark sees each buffer the measured call allocates."""
    if not ISOLATED:
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, 65536)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def synchronize(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    peak_mb: float | None
    first_s: float          # the first (warm-up) call, compilation included


def measure(fn: Callable[[], object], device: torch.device | str, repeats: int = 5, warmup: int = 1,
            peak: bool = True) -> Timing:
    """Median/min/max wall time of fn() over `repeats` runs after `warmup` runs, and (with `peak`)
    the peak extra memory of one more run, measured on its own."""
    first = None
    for _ in range(max(1, warmup)):
        start = time.perf_counter()
        fn()
        synchronize(device)
        first = first if first is not None else time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append((time.perf_counter() - start) * 1000)
    if not peak:
        return Timing(statistics.median(times), min(times), max(times), None, first)
    _small_mmap_threshold()
    with PeakMemory(device) as extra:
        fn()
    return Timing(statistics.median(times), min(times), max(times), extra.mb, first)


def interleaved(calls: dict[str, Callable[[int], object]], repeats: int, warmup: int = 1,
                device: torch.device | str = "cpu") -> dict[str, list[float]]:
    """Seconds per call of each function, called in turn every round (round r calls each with r;
    the order reversed every other round), the device synchronised around each call, so that load
    from other processes and a shared CPU's drift fall on all of them alike; warm-up rounds are not
    recorded. Ratios of the same round's times (`paired`) are what the benchmarks compare."""
    times: dict[str, list[float]] = {key: [] for key in calls}
    for round_ in range(warmup + repeats):
        order = list(calls.items()) if round_ % 2 == 0 else list(reversed(calls.items()))
        for key, fn in order:
            synchronize(device)
            start = time.perf_counter()
            fn(round_)
            synchronize(device)
            if round_ >= warmup:
                times[key].append(time.perf_counter() - start)
    return times


def paired(numerator: list[float], denominator: list[float]) -> list[float]:
    """The per-round ratios of two `interleaved` time lists, sorted."""
    return sorted(a / b for a, b in zip(numerator, denominator))


def position_terms(position: PositionEncoding, q: torch.Tensor, k: torch.Tensor, length: int,
                   x: torch.Tensor | None = None):
    """Everything the scheme computes before attention: absolute embedding, bias plan, rotation
    (`x`, the layer input, for a scheme that declares `input_dependent`)."""
    position.embed(length)
    return position.prepare(q, k, x=x)


def profile_one(spec: str, backend: str, length: int, batch: int = 1, heads: int = 8, head_dim: int = 64,
                device: str = "cpu", repeats: int = 5, train_max: int = 2048, seed: int = 0,
                train_length: int | None = None, peak: bool = True) -> dict[str, Any]:
    """One row: cost of bias construction, attention forward and (where sensible) forward+backward;
    peak memory too with `peak` (on the CPU only trustworthy in a fresh process: `run_isolated`)."""
    parsed = positions.parse(spec)
    if parsed.is_layout:
        rows = {text: profile_one(text, backend, length, batch, heads, head_dim, str(device), repeats, train_max, seed,
                                  train_length, peak) for text in dict.fromkeys(layer.text for layer in parsed.pattern)}
        return layout_row(spec, [rows[layer.text] for layer in parsed.pattern])
    layer = parsed.single()
    device = torch.device(device)
    row: dict[str, Any] = {"variant": spec, "backend": backend, "path": "", "length": length, "batch": batch,
                           "heads": heads, "head_dim": head_dim, "device": str(device), "status": "ok",
                           "message": "", "repeats": repeats,
                           "cached": "compiled kernel, causal block mask" if backend == "flex" else ""}
    train_length = length if train_length is None else train_length
    position = layer.build(n_heads=heads, head_dim=head_dim, train_length=train_length).to(device)
    limits = {"window": layer.window, "chunk": layer.chunk, "sinks": torch.zeros(heads, device=device) if layer.sinks else None}
    position.reset_parameters(torch.Generator().manual_seed(seed))
    if position.max_length is not None and length > position.max_length:
        return {**row, "status": "unsupported", "message": f"no positions beyond {position.max_length}"}
    check(backend, position, device, training=False)
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, heads, length, head_dim)
    q, k, v = (torch.randn(shape, generator=generator).to(device) for _ in range(3))
    x = (torch.randn(batch, length, position.d_model, generator=generator).to(device)
         if position.input_dependent else None)                      # drawn after q, k, v: theirs unchanged
    try:
        with torch.no_grad():
            build = measure(lambda: position_terms(position, q, k, length, x), device, repeats, peak=peak)
            q_rot, k_rot, plan = position_terms(position, q, k, length, x)
            with recording() as taken:
                attend = measure(lambda plan=plan: scheme_attention(position, q_rot, k_rot, v, plan, backend, **limits),
                                 device, repeats, peak=peak)
            row["path"] = path_label(taken)
        del plan
        row.update(bias_ms=build.median_ms, bias_min_ms=build.min_ms, bias_max_ms=build.max_ms,
                   bias_peak_mb=build.peak_mb, attention_ms=attend.median_ms, attention_min_ms=attend.min_ms,
                   attention_max_ms=attend.max_ms, attention_peak_mb=attend.peak_mb, first_call_s=attend.first_s)
        if length <= train_max and _can_train(backend, position, device):
            with recording() as taken:
                train = measure(lambda: _forward_backward(position, q, k, v, length, backend, x, limits), device,
                                max(1, repeats // 2), peak=peak)
            row.update(train_path=path_label(taken), train_ms=train.median_ms, train_min_ms=train.min_ms,
                       train_max_ms=train.max_ms, train_peak_mb=train.peak_mb)
    except (RuntimeError, MemoryError) as error:
        if not memory.is_out_of_memory(error):
            raise
        row.update(status="oom", message=f"out of memory at length {length} on {device}")
    return row


def _can_train(backend: str, position: PositionEncoding, device: torch.device) -> bool:
    try:
        check(backend, position, device, training=True)
        return True
    except RelbenchError:
        return False


def layout_row(spec: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A layout's row from its layers' rows, one per layer of its pattern: times their mean per layer (the
    sum over the pattern over its length), peaks the largest, each path taken, the first status not ok."""
    row = {**rows[0], "variant": spec, **{key: "+".join(dict.fromkeys(r[key] for r in rows if r.get(key)))
                                          for key in ("path", "train_path")}}
    bad = next((r for r in rows if r["status"] != "ok"), None)
    if bad is not None:
        return {**row, "status": bad["status"], "message": bad["message"]}
    for key in {k for r in rows for k in r if k.endswith(("_ms", "_peak_mb", "first_call_s"))}:
        values = [r.get(key) for r in rows]
        if key.endswith("_ms"):
            row[key] = None if None in values else sum(values) / len(values)
        else:
            row[key] = max((v for v in values if v is not None), default=None)
    return row


def _forward_backward(position, q, k, v, length, backend, x=None, limits=None) -> None:
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    q_rot, k_rot, plan = position_terms(position, q, k, length, x)
    out = scheme_attention(position, q_rot, k_rot, v, plan, backend, **(limits or {}))
    out.sum().backward()
    position.zero_grad(set_to_none=True)


# ---- `relbench profile`: every configuration in a fresh process -------------------------------------
PROFILE_CSV = "profile.csv"
PROFILE_KEY = ["variant", "backend", "length", "batch", "heads", "head_dim", "device"]
SHAPE = ["batch", "heads", "head_dim", "device"]  # profile.csv keeps the rows of every shape profiled


def shape_label(batch: int, heads: int, head_dim: int, device: str) -> str:
    return f"B={batch} H={heads} d={head_dim} {device}"


def shape_labels(rows: pd.DataFrame) -> pd.Series:
    """Each row's shape as a label (see shape_label)."""
    import pandas as pd

    return pd.Series([shape_label(*r) for r in rows[SHAPE].itertuples(index=False)], index=rows.index, dtype=object)


def run_isolated(config: dict[str, Any], timeout: float) -> dict[str, Any]:
    """profile_one(**config) in a fresh Python process (clean peak memory; a crash or the kernel's
    OOM killer takes only that process)."""
    import json
    import os
    import subprocess
    import sys

    from relbench.positions import plugins

    env = {**os.environ, plugins.ENV: os.pathsep.join(p.path for p in plugins.loaded() if p.path)}
    base = {k: config[k] for k in ("variant", "backend", "length", "batch", "heads", "head_dim", "device")}
    try:
        done = subprocess.run([sys.executable, "-m", "relbench.cost.profiling", json.dumps(config)], capture_output=True,
                              text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**base, "status": "timeout", "message": f"did not finish in {timeout:.0f} s"}
    if done.returncode == 0 and done.stdout.strip():
        return json.loads(done.stdout.strip().splitlines()[-1])
    if done.returncode in (-9, 137):
        return {**base, "status": "oom", "message": "killed (out of memory)"}
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    status = "oom" if "memory" in last.lower() else "error"
    return {**base, "status": status, "message": last[:300]}


def profile_run(out_path: Path, specs: list[str], backends: list[str], lengths: list[int], batch: int, heads: int,
                head_dim: int, device: str, repeats: int, train_max: int, timeout: float, console,
                peak_memory: bool = True) -> pd.DataFrame:
    """Every variant x backend x length; each row is written to `out_path` as soon as it is measured
    (replacing an earlier row of the same configuration), so an interrupted run keeps its rows.
    With `peak_memory` on the CPU each configuration runs in a fresh process (a clean resident-set
    high-water mark); without it, in this process, times only. A progress bar shows the ETA."""
    import pandas as pd
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from relbench.runs import results

    table = results.read_csv(out_path) if Path(out_path).is_file() else pd.DataFrame()
    available = memory.budget(device)
    isolated = peak_memory and torch.device(device).type == "cpu"
    todo = [(spec, backend, length) for spec in specs for backend in backends for length in lengths]
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("profiling", total=len(todo))
        for spec, backend, length in todo:
            progress.update(task, description=f"{spec} {backend} L={length}")
            config = {"variant": spec, "backend": backend, "length": length, "batch": batch, "heads": heads,
                          "head_dim": head_dim, "device": device, "repeats": repeats if length < 16384 else min(repeats, 3),
                          "train_max": train_max}
            need = memory.qkv_bytes(length, batch, heads, head_dim)
            if available is None or need <= available:
                biased = any(cls.adds_bias for cls in positions.parse(spec).schemes)
                need += memory.scores_bytes(backend, length, batch, heads, biased)
            if available is not None and need > 0.8 * available:
                row = {**{k: config[k] for k in PROFILE_KEY}, "status": "oom",
                       "message": f"skipped: needs about {memory.human(need)}, {memory.human(available)} available"}
            elif isolated:
                row = run_isolated(config, timeout)
            else:
                row = _in_process(config, peak_memory)
            table = results.upsert(table, row, PROFILE_KEY)
            results.write_csv(out_path, table)
            progress.console.print(describe(row), markup=False)
            progress.advance(task)
    return table


def _in_process(config: dict[str, Any], peak: bool = True) -> dict[str, Any]:
    config = dict(config)
    spec = config.pop("variant")
    try:
        return profile_one(spec, **config, peak=peak)
    except RelbenchError as error:
        return {"variant": spec, **config, "status": "unsupported", "message": str(error)}


def describe(row: dict[str, Any]) -> str:
    head = f"{row['variant']:<12} {row['backend']:<9} L={row['length']:<6}"
    if row.get("status") != "ok":
        return f"{head} {row.get('status')}: {row.get('message', '')}"
    train = f"  train {row['train_ms']:.1f} ms" if row.get("train_ms") == row.get("train_ms") and "train_ms" in row else ""
    peak = row.get("attention_peak_mb")
    peak = f", peak {peak:.0f} MB" if peak is not None and peak == peak else ""
    return (f"{head} bias {row['bias_ms']:.2f} ms  attention {row['attention_ms']:.1f} ms "
            f"({row.get('path')}{peak}){train}")


def _limit_address_space() -> None:
    """Let an allocation that cannot fit fail with an error instead of waking the OOM killer."""
    import resource

    available = memory.budget("cpu")
    size = rss_kb("VmSize")
    if available and size:
        limit = int(size * 1024 + 0.9 * available)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _main(argv: list[str]) -> None:
    import json
    import os

    global ISOLATED
    ISOLATED = True
    from relbench.positions import plugins

    config = json.loads(argv[0])
    spec = config.pop("variant")
    plugins.load_installed()
    plugins.load_files([p for p in os.environ.get(plugins.ENV, "").split(os.pathsep) if p])   # the parent's
    if config.get("device", "cpu") == "cpu":
        _limit_address_space()
    try:
        with flush_denormals():
            row = profile_one(spec, **config)
    except RelbenchError as error:
        row = {"variant": spec, **config, "status": "unsupported", "message": str(error)}
    print(json.dumps(row))


if __name__ == "__main__":
    import sys

    _main(sys.argv[1:])
