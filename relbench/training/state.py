"""Where a training run is (relbench/training/train.py's train_variant): its progress, which resume.pt
keeps beside the weights and the optimiser and a resumed run starts from (TrainingState, `resumed`),
and its wall time in this process, which is not saved (Clock).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from relbench.errors import RelbenchError
from relbench.model import GPT
from relbench.runs import checkpoints, distributed, runconfig

PACE_STEPS = 10   # steps timed (after one warm-up step) for the expected time printed before a run goes on


@dataclasses.dataclass
class TrainingState:
    """A run's progress: the steps done, the loss-curve rows so far, the training loss summed over
    the `running_n` steps since the last row, the last validation loss, the seconds trained up to the
    last save, the largest attention logit logged and the settings trained with (`identity`, checked
    on resume); for a retrieval task its checks, (step, validation accuracy at the training length),
    the step the criterion was met at (kept once it was) and the step that confirmed it, where
    consolidation starts; the steps of the moments saved so far ([train] moments). resume.pt keeps it as
    the plain dict `saved()` makes, in this field order."""
    step: int = 0
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    running: float = 0.0
    running_n: int = 0
    val: float = float("nan")
    elapsed: float = 0.0
    max_logit: float = 0.0
    identity: dict[str, Any] = dataclasses.field(default_factory=dict)
    checks: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    learned: int | None = None
    consolidate_from: int | None = None
    moments: list[int] = dataclasses.field(default_factory=list)

    def saved(self) -> dict[str, Any]:
        """The state as resume.pt holds it (checkpoints load plain containers only)."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}


def same_identity(saved: dict[str, Any], identity: dict[str, Any]) -> bool:
    """Whether a resume.pt's settings are `identity`: a [model] or [train] key it lacks (saved before the
    key existed) counts at its default, as the run directory's config does (runconfig.with_defaults)."""
    filled = {k: runconfig.with_defaults(k, v, identity.get(k, {})) if k in ("model", "train") else v for k, v in saved.items()}
    return filled == identity


def resumed(folder: Path | None, spec: str, identity: dict[str, Any], model: GPT,
            optimizer: torch.optim.Optimizer) -> TrainingState:
    """The state `folder`'s resume.pt holds, with `model` and `optimizer` loaded from it (refused when
    it was saved with settings other than `identity`), or a fresh state at step 0 when there is none.
    Under torchrun rank 0 reads the file and the other ranks learn what it read."""
    resume = distributed.on_main(checkpoints.load_resume, folder) if folder is not None else None
    if resume is None:
        return TrainingState(identity=identity)
    if not same_identity(resume["state"].get("identity") or {}, identity):
        raise RelbenchError(f"{folder}/{checkpoints.RESUME_FILE} was saved with another configuration; "
                            f"delete it to train {spec} from step 0")
    model.load_state_dict(resume["model"])
    optimizer.load_state_dict(resume["optimizer"])
    return TrainingState(**resume["state"])   # an older resume.pt may lack the last four: their defaults


@dataclasses.dataclass
class Clock:
    """A run's wall time in this process: since `started`, taken at step `first_step` (both move on at
    every save, when the seconds before it join TrainingState.elapsed); and `on_pace`, called once with
    the seconds per step of the PACE_STEPS steps that follow the first step trained here (a warm-up)."""
    first_step: int
    on_pace: Callable[[float], None] | None = None
    started: float = dataclasses.field(default_factory=time.perf_counter)
    paced: float = 0.0           # when the timed steps began

    def __post_init__(self) -> None:
        self.pace_from = self.first_step

    def seconds(self, state: TrainingState) -> float:
        """Seconds trained in all, in this process and before."""
        return state.elapsed + time.perf_counter() - self.started

    def rate(self, done: int, tokens_per_step: int) -> float:
        """Tokens per second since `started`, after step `done`."""
        return (done - self.first_step) * tokens_per_step / (time.perf_counter() - self.started)

    def restart(self, state: TrainingState, done: int) -> None:
        """At a save after step `done`: the seconds so far join state.elapsed and the clock starts again."""
        state.elapsed += time.perf_counter() - self.started
        self.started, self.first_step = time.perf_counter(), done

    def pace(self, done: int) -> None:
        """After step `done`: start timing after the first step, and report the pace PACE_STEPS later."""
        if self.on_pace is not None and done - self.pace_from == 1:
            self.paced = time.perf_counter()                     # the first step (warm-up) is not counted
        elif self.on_pace is not None and done - self.pace_from == 1 + PACE_STEPS:
            self.on_pace((time.perf_counter() - self.paced) / PACE_STEPS)
            self.on_pace = None
