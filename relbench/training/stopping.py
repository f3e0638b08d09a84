"""Stopping a training loop: on a signal (after saving where it was), or when its loss diverges."""

from __future__ import annotations

import signal
import threading
from typing import Any

from relbench.errors import RelbenchError


class StopRequest:
    """While active, SIGINT (Ctrl-C) and SIGTERM ask training to stop at the end of the current step,
    after saving a resumable checkpoint; a second signal stops at once."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)


class Interrupted(RelbenchError):
    """Training stopped on a signal after saving where it was; running it again resumes."""

    prefix = ""  # the message starts with "interrupted:"

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum   # 130 for SIGINT, 143 for SIGTERM


class Diverged(Exception):
    def __init__(self, step: int, loss: float):
        super().__init__(f"loss {loss} at step {step}")
        self.step, self.loss = step, loss


def learned_at(checks: list[tuple[int, float]], accuracy: float, consecutive: int) -> int | None:
    """Training to criterion: the step at which a model counts as having learned its retrieval task,
    given its validation checks so far ((step, accuracy) in step order), or None while it has not.
    A model has learned when the last `consecutive` checks all reach `accuracy`; the step returned is
    the first of those checks (when it got there, not when it was confirmed). A criterion of 0 never
    stops training."""
    if accuracy <= 0 or len(checks) < consecutive:
        return None
    held = checks[-consecutive:]
    return int(held[0][0]) if all(a >= accuracy for _, a in held) else None
