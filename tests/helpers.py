"""Small helpers shared by the tests (not part of the package)."""

from __future__ import annotations

from pathlib import Path

import torch

from relbench import positions
from relbench.contract import layer_input  # noqa: F401  (the tests' random layer input is the contract's)
from relbench.runs import checkpoints


def full_bias(enc: positions.PositionEncoding, q_len: int, k_len: int, q: torch.Tensor | None = None,
              k: torch.Tensor | None = None, x: torch.Tensor | None = None):
    """The bias `enc` adds to the logits of q_len queries over k_len keys, materialised: (H, q_len,
    k_len), (B, H, q_len, k_len) for data-dependent schemes (pass the projected queries q, keys k
    and the layer input x (B, k_len, d_model) that they read), or None when the scheme adds no bias."""
    if not enc.adds_bias:
        return None
    return enc.plan(q_len, k_len, q, k, x).full()


def resume_step(folder: Path) -> int:
    """The step of the resumable state saved in a checkpoint folder; -1 when there is none, or while
    it is being written (a test that interrupts training polls it)."""
    try:
        payload = checkpoints.load_resume(folder)
    except Exception:  # being written at this instant
        return -1
    return -1 if payload is None else payload["state"]["step"]
