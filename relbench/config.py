"""Configuration dataclasses and named presets.

A preset fills every field; command-line options override single fields. The whole resolved
configuration is written to the run directory's config.json, so a run can be reproduced.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from relbench.errors import UsageError, unknown

INIT_STD = 0.02  # std of the token embeddings and weight matrices at initialisation (GPT-2)


@dataclass
class ModelConfig:
    vocab_size: int = 256           # bytes
    d_model: int = 128              # residual width
    n_layers: int = 4
    n_heads: int = 4
    mlp_ratio: float = 4.0          # MLP hidden width = mlp_ratio * d_model
    position: str = "none"          # variant spec: "alibi", "xl:k=64", ...
    position_options: dict[str, Any] = field(default_factory=dict)  # merged over the spec's options
    train_length: int = 256         # context the model is trained at (learned embeddings stop here)
    attention: str = "auto"         # attention backend, see relbench.attention

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise UsageError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "train_length"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


PRECISIONS = ("auto", "bf16", "fp32")


def resolve_precision(precision: str, device) -> str:
    """"auto" -> "bf16" where the device computes bf16 natively (CUDA with bf16; a CPU with
    AVX512-BF16 or AMX), else "fp32". Not the default: the same command must give the same science
    on every host, and bf16 moved some variants' extrapolation (README, "Precision"). Measured on
    the quick preset (2-core CPU, AVX512-BF16): bf16 trained 1.3-1.5x faster (xl 80 -> 55 s); on
    an AVX2-only CPU bf16 is emulated and 12x slower than fp32."""
    import torch

    if precision != "auto":
        return precision
    if getattr(device, "type", str(device)).startswith("cuda"):
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    try:
        return "bf16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "fp32"
    except (AttributeError, RuntimeError):
        return "fp32"


@dataclass
class TrainConfig:
    steps: int = 600                # optimiser steps
    batch_size: int = 16            # sequences of train_length + 1 tokens per step
    lr: float = 3e-3                # peak learning rate
    min_lr_ratio: float = 0.1       # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 50
    weight_decay: float = 0.1       # on matrices only, not on norms, biases or position tables
    grad_clip: float = 1.0          # max global gradient norm
    position_lr_scale: float | None = None  # learning-rate multiplier of every variant's position parameters;
                                    # None: each variant's own from position_lr_scales (see position_lr)
    position_lr_scales: dict[str, float] = field(default_factory=dict)  # per variant name: the multiplier
                                    # that gave the best validation loss at the training length in a sweep
                                    # (`relbench tune-lr`); 1 for a variant not in it
    attention: str = "auto"         # attention backend for training (relbench.attention.BACKENDS)
    precision: str = "fp32"         # "fp32", "bf16" (autocast of matrix products), or "auto": bf16 where
                                    # the hardware has native bf16, else fp32 (see resolve_precision)
    task: str = "lm"                # what the sequences are: "lm" (text windows) or "passkey" (relbench/batches.py)
    answer_weight: float = 1.0      # passkey: loss weight of the answer's digits
    text_weight: float = 1.0        # passkey: loss weight of every other prediction (0: answers only)
    depth_curriculum: int = 0       # passkey: over this many steps the key moves from near the question to anywhere
    eval_every: int = 100           # validation loss every this many steps (and at the end)
    checkpoint_every: int = 100     # resumable checkpoint every this many steps (and on Ctrl-C / SIGTERM)
    eval_batches: int = 4           # validation batches (fixed, the same for every variant)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "eval_every", "eval_batches", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name} must be positive, got {getattr(self, name)}")
        if not self.lr > 0:
            raise UsageError(f"lr must be positive, got {self.lr}")
        scales = ([] if self.position_lr_scale is None else [self.position_lr_scale]) + list(self.position_lr_scales.values())
        if any(not (isinstance(x, (int, float)) and 0 < x < float("inf")) for x in scales):
            raise UsageError(f"position learning-rate multipliers must be positive numbers, got {scales}")
        if self.precision not in PRECISIONS:
            raise unknown("precision", self.precision, list(PRECISIONS))
        if self.task not in ("lm", "passkey"):
            raise unknown("training task", self.task, ["lm", "passkey"])
        if min(self.answer_weight, self.text_weight) < 0 or self.answer_weight + self.text_weight <= 0 \
                or self.depth_curriculum < 0:
            raise UsageError("answer_weight and text_weight must be >= 0 (not both 0), depth_curriculum >= 0")


@dataclass
class EvalConfig:
    eval_tokens: int = 65536        # scored test tokens, the same at every length
    max_batch_tokens: int = 16384   # windows per forward pass = max(1, this // length)
    tasks: list[str] = field(default_factory=lambda: ["perplexity"])  # what `extrapolate` measures by default
    length_multiples: list[int] = field(default_factory=lambda: [1, 4, 16])  # default lengths, x train length
    trials: int = 20                # copy: trials per distance; passkey: per length and depth

    def __post_init__(self) -> None:
        from relbench.tasks import TASKS

        for task in self.tasks:
            if task not in TASKS:
                raise unknown("task", task, list(TASKS))
        if min([self.eval_tokens, self.max_batch_tokens, self.trials, *self.length_multiples]) < 1:
            raise UsageError("eval_tokens, max_batch_tokens, trials and length multiples must be positive")


# Each variant's position learning-rate multiplier: the one with the lowest validation loss at the
# training length on the quick preset in `relbench tune-lr` over 1, 3, 10, 30, 100 (fp32, seed 0;
# results/lr-sweep, where the whole sensitivity table is). The tables (xl, t5, t5-log2) and
# kerple-log were still improving at 100, the top of the grid. Variants without position
# parameters are not listed (nothing to scale). Rerun `relbench tune-lr` for another setup.
TUNED_POSITION_LR = {"dynamic": 30.0, "fire": 30.0, "kerple-log": 100.0, "kerple-power": 30.0, "learned": 3.0,
                     "shaw": 30.0, "t5": 100.0, "t5-log2": 100.0, "transformer-xl": 10.0, "xl": 100.0}

# Each preset is complete; `quick` is what `relbench bench` runs.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {   # seconds: tests and smoke runs
        "model": dict(d_model=32, n_layers=2, n_heads=2, train_length=32),
        "train": dict(steps=30, batch_size=8, lr=3e-3, warmup_steps=5, eval_every=15, eval_batches=2, checkpoint_every=5),
        "eval": dict(eval_tokens=2048, max_batch_tokens=4096),
    },
    "quick": {  # the default (`relbench bench`): 16 variants trained in 54-67 min on a 2-core AVX2 EPYC (README)
        "model": dict(d_model=128, n_layers=4, n_heads=4, train_length=256),
        "train": dict(steps=400, batch_size=8, lr=3e-3, warmup_steps=50, eval_every=100, eval_batches=8,
                      position_lr_scales=TUNED_POSITION_LR),
        "eval": dict(eval_tokens=32768, max_batch_tokens=16384, tasks=["perplexity", "copy"], trials=8),
    },
    "standard": {  # deeper, trained 3x longer, evaluated on 4x the tokens: about an hour on 2 cores
        "model": dict(d_model=128, n_layers=6, n_heads=4, train_length=256),
        "train": dict(steps=1800, batch_size=8, lr=3e-3, warmup_steps=100, eval_every=200, eval_batches=8,
                      position_lr_scales=TUNED_POSITION_LR),  # tuned on quick, not on this preset
        "eval": dict(eval_tokens=131072, max_batch_tokens=16384, tasks=["perplexity", "copy"], trials=16),
    },
    "retrieval": {  # models that learn passkey retrieval at their training length, to test it at 4x-64x
        "model": dict(d_model=128, n_layers=2, n_heads=4, train_length=128),
        "train": dict(steps=1200, batch_size=32, lr=3e-3, warmup_steps=100, min_lr_ratio=1.0, eval_every=100,
                      eval_batches=4, task="passkey", answer_weight=10.0, text_weight=1.0, depth_curriculum=500,
                      position_lr_scale=30.0),  # measured on this task (results/retrieval/README.md); the table
                                                # tuned on quick's language modelling (x100 for t5, xl) stalls it
        "eval": dict(eval_tokens=32768, max_batch_tokens=16384, tasks=["passkey", "copy"], trials=10,
                     length_multiples=[1, 4, 16, 64]),
    },
}
DEFAULT_PRESET = "quick"


def preset(name: str) -> dict[str, dict[str, Any]]:
    if name not in PRESETS:
        raise unknown("preset", name, list(PRESETS))
    return copy.deepcopy(PRESETS[name])


def to_dict(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj)


def resolve(preset_name: str, model: dict[str, Any] | None = None, train: dict[str, Any] | None = None,
            eval: dict[str, Any] | None = None) -> tuple[ModelConfig, TrainConfig, EvalConfig]:
    """The preset's configs with the given fields overridden (None values are ignored)."""
    base = preset(preset_name)
    parts = []
    for cls, key, overrides in ((ModelConfig, "model", model), (TrainConfig, "train", train), (EvalConfig, "eval", eval)):
        values = {**base[key], **{k: v for k, v in (overrides or {}).items() if v is not None}}
        parts.append(cls(**values))
    return parts[0], parts[1], parts[2]
