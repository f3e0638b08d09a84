"""Several training runs side by side on one CPU (`relbench train --jobs N`, `relbench bench`).

The models relbench trains on a laptop are small: at one thread a run of the retrieval preset keeps
a core busy, and two threads on one run buy far less than a second run on the second core does
(benchmarks/jobs.py measures it). So with N jobs, N runs train at once, each in a process of its
own (spawned, not forked: a fork of a process whose OpenMP pool has run can hang) with the
process's threads divided among them. A run's batches and initialisation depend on its seed alone,
so its weights and loss curve are those it gets trained alone at the same thread count.

This process stays the only writer of the run directory: a child trains, saves its resumable
state in its own checkpoint folder as training alone does, and sends its weights, loss curve and
summary back; the parent writes train.csv and the checkpoint in the order runs finish. A signal
(Ctrl-C, SIGTERM) reaches the parent, which passes one SIGTERM to every child: each stops after
its step, saves where it was, and the command ends with "interrupted:" (run it again to resume).
A child that dies (killed, out of memory) loses only its own run's last steps since its last
resumable save; the others finish and are written. A parent that dies without a word (SIGKILL)
leaves no orphan training: each child sees it gone, stops after its step and saves where it was.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from rich.console import Console

from relbench.config import ModelConfig, to_dict
from relbench.data import Splits
from relbench.errors import RelbenchError, one_line
from relbench.training.stopping import Interrupted, StopRequest

POLL_SECONDS = 0.2
STOP_SECONDS = 60   # how long a closed schedule waits for its children to save and exit


def threads_per_job(jobs: int) -> int:
    """The threads each of `jobs` side-by-side runs gets: this process's share, at least one."""
    return max(1, torch.get_num_threads() // max(1, jobs))


@contextmanager
def share_of_threads(jobs: int) -> Iterator[None]:
    """Run the block at one of `jobs` side-by-side runs' share of the threads (all of them for one),
    then give the threads back: how bench's announcement and the dry run time a step."""
    threads = torch.get_num_threads()
    torch.set_num_threads(threads_per_job(jobs) if jobs > 1 else threads)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def train_pairs(todo: list, jobs: int, model_config: ModelConfig, splits: Splits, device: torch.device,
                console: Console, trainer: Callable[..., dict[str, Any]]) -> Iterator[tuple[Any, dict[str, Any]]]:
    """Yield (pair, outcome) for every run of `todo` (relbench.training.pairs.Pair) as it finishes,
    `jobs` at a time, each in a child process; outcomes as pairs.train_pair's, the model as its
    state dict (with "model_config"). `trainer` is pairs.train_pair (passed in, by reference, to each
    child). Raises Interrupted after every child has saved on a signal,
    and RelbenchError for a child that failed, once the others have finished."""
    from relbench.positions import plugins

    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = context.Queue()
    threads = threads_per_job(jobs)
    files = [p.path for p in plugins.loaded() if p.path]
    pending, running, errors = list(enumerate(todo)), {}, []
    console.print(f"training {len(todo)} run(s), {jobs} side by side, each in its own process with {threads} "
                  f"thread(s)", markup=False)
    with StopRequest() as stop:
        try:
            yield from _schedule(pending, running, errors, jobs, stop, context, results, model_config, splits,
                                 device, threads, files, console, trainer)
        finally:   # closed early (an error writing a finished run): the others stop and save where they are
            for _, process in running.values():
                _signal(process, signal.SIGTERM)
            deadline = time.monotonic() + STOP_SECONDS
            while any(process.is_alive() for _, process in running.values()) and time.monotonic() < deadline:
                try:   # a child that sent its outcome exits once the pipe is read; nothing more is written
                    results.get(timeout=POLL_SECONDS)
                except queue.Empty:
                    pass
    if stop.signum:
        stopped = [text for kind, text in errors if kind == "interrupted"]
        raise Interrupted(f"interrupted: {len(stopped)} run(s) stopped and saved where they were "
                          f"({'; '.join(stopped) or 'none was running'}); run the same command again to resume",
                          stop.signum)
    failed = [text for kind, text in errors if kind == "error"]
    if failed:
        raise RelbenchError(f"{len(failed)} training run(s) failed, the others finished and are kept: "
                            + " | ".join(failed))


def _schedule(pending: list, running: dict, errors: list, jobs: int, stop: StopRequest, context, results,
              model_config: ModelConfig, splits: Splits, device: torch.device, threads: int, files: list[str],
              console: Console, trainer: Callable[..., dict[str, Any]]) -> Iterator[tuple[Any, dict[str, Any]]]:
    """Start runs as places free up, pass a stop request on once, and yield each finished outcome;
    `running` and `errors` are the caller's, so that it can stop what is still going."""
    forwarded = False
    while pending or running:
        while pending and len(running) < jobs and not stop.signum:
            index, pair = pending.pop(0)
            process = context.Process(target=_child, daemon=True, name=f"relbench-{pair.label}",
                                      args=(results, index, pair, model_config, splits, str(device), threads, files,
                                            trainer))
            process.start()
            running[index] = (pair, process)
            console.print(f"{pair.label}: started", markup=False)
        if stop.signum and not forwarded:   # one SIGTERM each: stop after this step, save, report
            forwarded = True
            pending.clear()
            for _, process in running.values():
                _signal(process, signal.SIGTERM)
        try:
            message = results.get(timeout=POLL_SECONDS)
        except queue.Empty:
            message = None
        if message is not None:
            index, kind, payload = message
            if kind == "line":
                console.print(payload, markup=False)
                continue
            pair, process = running.pop(index)
            process.join()
            if kind == "outcome":
                if payload["status"] == "finished":
                    payload["model"] = torch.load(io.BytesIO(payload["model"]), weights_only=True)
                yield pair, payload
            elif kind == "interrupted":
                errors.append(("interrupted", payload))
            else:
                console.print(f"{pair.label}: {payload}", markup=False)
                errors.append(("error", f"{pair.label}: {payload}"))
            continue
        for index, (pair, process) in list(running.items()):   # a child gone without a word
            if process.exitcode is not None and results.empty():
                time.sleep(POLL_SECONDS)          # what it sent just before exiting may still be in the pipe
                if not results.empty():
                    break
                running.pop(index)
                what = f"{pair.label}: its process ended with exit code {process.exitcode} before it finished; " \
                       f"its last resumable state is kept in {pair.folder}: run the same command again to resume"
                console.print(what, markup=False)
                errors.append(("error", what))


def _signal(process, signum: int) -> None:
    try:
        os.kill(process.pid, signum)
    except (ProcessLookupError, TypeError):   # already gone (or never started)
        pass


def _child(results, index: int, pair, model_config: ModelConfig, splits: Splits, device: str, threads: int,
           files: list[str], trainer: Callable[..., dict[str, Any]]) -> None:
    """One run in a child process: (index, "outcome", outcome), (index, "interrupted", where it
    stopped) or (index, "error", one line); (index, "line", text) for progress on the way."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C reaches the parent, which passes it on once
    torch.set_num_threads(threads)
    orphaned = watch_parent()
    try:
        from relbench.positions import plugins

        plugins.load_installed()
        plugins.load_files(files)
        every = max(pair.config.eval_every, pair.config.steps // 10)

        def on_row(row: dict[str, Any]) -> None:
            if row["step"] % every == 0:
                accuracy = row["val_accuracy"]
                shown = f", validation accuracy {accuracy:.0%}" if accuracy == accuracy else ""
                end = expected_end(row["step"], pair.config.steps, row["elapsed_s"], pair.config.criterion_accuracy > 0)
                results.put((index, "line", f"{pair.label}: step {row['step']:,} of {pair.config.steps:,}, "
                                            f"train loss {row['train_loss']:.3f}{shown}{end}"))

        with StopRequest() as stop:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            outcome = trainer(pair, model_config, splits, torch.device(device), None, stop, None, on_row)
        if outcome["status"] == "finished":
            model = outcome["model"]
            weights = io.BytesIO()   # as bytes: torch's own pickling of tensors shares them through the
            torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, weights)  # child's fds
            outcome = {**outcome, "model": weights.getvalue(), "model_config": to_dict(model.config)}
        results.put((index, "outcome", outcome))
    except Interrupted as error:
        results.put((index, "interrupted", f"{pair.label}: {str(error).removeprefix('interrupted: ')}"))
    except RelbenchError as error:
        results.put((index, "error", str(error)))
    except BaseException:
        results.put((index, "error", one_line(traceback.format_exc().strip().splitlines()[-1])))
    finally:
        if orphaned.is_set():          # nobody reads the queue: exit without waiting to hand it over
            results.cancel_join_thread()


def human_time(seconds: float) -> str:
    """"45 s", "12 min", "3.5 h", "2.1 days"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def expected_end(step: int, steps: int, elapsed: float, capped: bool, now: float | None = None) -> str:
    """"; ends about 14:32 (6 min more)": when a run at `step` of `steps`, `elapsed` seconds in (over
    every resume), ends at its pace so far; `capped` (trained to a criterion): when it reaches its cap,
    an upper bound. Empty before the first step and at the last."""
    if step <= 0 or elapsed <= 0 or step >= steps:
        return ""
    left = elapsed / step * (steps - step)
    clock = time.strftime("%H:%M", time.localtime((time.time() if now is None else now) + left))
    if capped:
        return f"; ends by {clock} at the latest (its {steps:,}-step cap, {human_time(left)} more; most stop earlier)"
    return f"; ends about {clock} ({human_time(left)} more)"


def watch_parent(every: float = 1.0) -> threading.Event:
    """In a child: when the parent dies (SIGKILL leaves no chance to stop its children), the child
    stops as on SIGTERM (after its step, saving where it was, so the same command resumes) instead of
    training on for no one. Returns the event set when that happened."""
    parent, orphaned = os.getppid(), threading.Event()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every)
        orphaned.set()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="relbench-parent-watch", daemon=True).start()
    return orphaned
