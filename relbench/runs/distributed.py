"""Several processes under torchrun: the process group, who does what, and the few collectives.

    torchrun --nproc_per_node 2 -m relbench train --preset tiny

torchrun sets WORLD_SIZE, RANK and LOCAL_RANK in every process it starts; `session()` then opens
a process group for the length of the command (gloo for CPU tensors, NCCL for CUDA tensors, each
process on the GPU of its local rank). Without torchrun nothing here starts a group: rank() is 0,
world() is 1 and every helper returns its input, so a single process runs exactly as before.

Rank 0 owns the run directory (DESIGN.md): it takes the run lock, reads what the others need
(`on_main`) and writes every file; every other rank only computes. A rank that fails alone (out
of memory on one GPU) exits; torchrun then stops the others, whose collectives fail or who are
killed after its shutdown timeout (30 s), rather than waiting for a peer that is gone.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from relbench.errors import RelbenchError, UsageError

T = TypeVar("T")
TORCHRUN = ("WORLD_SIZE", "RANK", "LOCAL_RANK")  # what torchrun sets in each process it starts


def launched() -> bool:
    """Whether torchrun (or another launcher that speaks its environment) started this process."""
    return all(name in os.environ for name in TORCHRUN)


def active() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if active() else 0


def world() -> int:
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    return rank() == 0


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0")) if active() else 0


@contextlib.contextmanager
def session() -> Iterator[None]:
    """A process group for the length of a command when torchrun started this process; nothing otherwise."""
    if not launched() or active():
        yield
        return
    cuda = torch.cuda.is_available()
    if cuda and int(os.environ["LOCAL_RANK"]) < torch.cuda.device_count():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))  # NCCL's communicator and cuda:N agree
    # one backend per device type: CPU tensors and pickled objects go through gloo, CUDA tensors through NCCL
    dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo")
    try:
        yield
    finally:
        dist.destroy_process_group()


def local_device(device: torch.device) -> torch.device:
    """The device this process computes on: under torchrun a CUDA device is the GPU of the local rank."""
    if not active() or device.type != "cuda":
        return device
    if device.index is not None and device.index != local_rank():
        raise UsageError(f"under torchrun each process uses the GPU of its local rank (cuda:{local_rank()} for "
                         f"local rank {local_rank()}); use --device cuda or auto, and CUDA_VISIBLE_DEVICES to choose GPUs")
    return torch.device("cuda", local_rank())


def sharing(device: torch.device) -> int:
    """How many processes of this job share `device`'s memory: every process on this node share its
    RAM, each GPU belongs to one process."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if active() and device.type == "cpu" else 1


def per_rank(batch_size: int) -> int:
    """Sequences each process computes of a global batch of `batch_size`; a UsageError when the
    processes cannot share it evenly (uneven shares would weight rows differently)."""
    if batch_size % world():
        below, above = batch_size - batch_size % world(), batch_size + world() - batch_size % world()
        sizes = f"{below} or {above}" if below else str(above)
        raise UsageError(f"--batch-size {batch_size} cannot be split evenly over the {world()} processes of this "
                         f"torchrun job (it is the global batch); use a multiple of {world()}, such as {sizes}")
    return batch_size // world()


def batch_text(batch_size: int) -> str:
    """How a message names the batch: "--batch-size 8", under torchrun "--batch-size 8 (4 per process)"."""
    return f"--batch-size {batch_size}" + (f" ({batch_size // world()} per process)" if world() > 1 else "")


def share(batch: torch.Tensor | None) -> torch.Tensor | None:
    """This rank's rows of a global batch (B, ...): the rank-th of world() contiguous, equal blocks."""
    if batch is None:
        return None
    rows = per_rank(batch.shape[0])
    return batch[rank() * rows: (rank() + 1) * rows]


def on_main(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) run on rank 0, and its result, or the RelbenchError it raised, on every rank: for
    what rank 0 reads or decides in the run directory it owns, so that every rank takes the same branch."""
    if not active():
        return fn(*args)
    outcome: list[Any] = [None]
    if is_main():
        try:
            outcome = [(True, fn(*args))]
        except RelbenchError as error:
            outcome = [(False, error)]
    dist.broadcast_object_list(outcome, src=0)
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def all_gather(obj: T) -> list[T]:
    """Every rank's `obj`, in rank order, on every rank ([obj] in a single process)."""
    if not active():
        return [obj]
    out: list[Any] = [None] * world()
    dist.all_gather_object(out, obj)
    return out


def sum_all(value: torch.Tensor) -> torch.Tensor:
    """The sum over ranks of a tensor (every rank gets the same value); `value` itself in one process."""
    if not active():
        return value
    value = value.detach().clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def max_all(value: int, device: torch.device) -> int:
    """The largest of every rank's integer `value`, on every rank."""
    if not active():
        return value
    flag = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item())


def wrap(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """`model` in DistributedDataParallel (gradients averaged over ranks in backward) under
    torchrun, `model` itself otherwise. Buffers are synchronised once, not before every forward:
    every rank builds the same ones from the config and none changes in training."""
    if not active():
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, forward_sync_buffers=False)


def single_process(command: str) -> None:
    """Refuse a command that must not run once per process (it times this process, or writes files
    every rank would write again)."""
    if active() and world() > 1:
        raise UsageError(f"relbench {command} runs in one process; run it without torchrun")


def label() -> str:
    """'' on rank 0 (it speaks for the job), 'rank N: ' on the others, for the lines they print."""
    return f"rank {rank()}: " if rank() else ""
