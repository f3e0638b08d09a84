"""Configuration dataclasses, presets and experiment files.

An experiment is resolved in three layers: a preset (a TOML file shipped in relbench/presets; a
preset may start from another with `preset = "name"`), then an experiment file (`--config
experiment.toml`, the same format, which may name its base preset), then command-line options. The
whole resolved configuration is written to the run directory's config.json and config.toml, and
`relbench train --config RUN/config.toml` reproduces the run.

    preset = "quick"                      # optional: the base (default: quick)
    variants = ["xl", "alibi", "t5:buckets=64"]
    seeds = [0, 1]
    [data]   dataset = "sotu", tokenizer = "bytes"
    [model]  d_model, n_layers, n_heads, train_length, ...      (ModelConfig)
    [train]  steps, batch_size, lr, ...                          (TrainConfig)
    [eval]   eval_tokens, tasks, length_multiples, lengths, ...  (EvalConfig)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relbench.errors import UsageError, did_you_mean, unknown

INIT_STD = 0.02  # std of the token embeddings and weight matrices at initialisation (GPT-2)


RANGES = {"warmup_steps": "0 or more", "weight_decay": "0 or more", "grad_clip": "above 0", "min_lr_ratio": "0 to 1",
          "answer_weight": "0 or more", "mqar_pairs": "1 or more", "criterion_checks": "1 or more",
          "mlp_ratio": "above 0"}


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
        if not self.mlp_ratio > 0:
            raise UsageError(f"mlp_ratio is out of range: {self.mlp_ratio} ({RANGES['mlp_ratio']})")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def position_shape(self) -> dict[str, int]:
        """The keyword arguments every position encoding of this model is built with (positions.build)."""
        return {"n_heads": self.n_heads, "head_dim": self.head_dim, "d_model": self.d_model,
                "train_length": self.train_length}


PRECISIONS = ("auto", "bf16", "fp32")


def resolve_precision(precision: str, device) -> str:
    """"auto" -> "bf16" where the device computes bf16 natively (CUDA with bf16; a CPU with
    AVX512-BF16 or AMX), else "fp32". Not the default: the same command must give the same science
    on every host, and bf16 moved some variants' extrapolation; on a CPU without native bf16 it is
    emulated and far slower than fp32 (docs/performance.md, "Precision")."""
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
    decay_steps: int = 0            # 0: the cosine spans every step after warm-up; N: the rate holds at the
                                    # peak and decays over the last N steps only (a capped criterion run
                                    # that learns before them trains at a constant rate)
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
    task: str = "lm"                # what the sequences are: "lm" (text windows), "passkey" or "mqar" (training/batches.py)
    answer_weight: float = 1.0      # passkey: loss weight of the answer's digits
    text_weight: float = 1.0        # passkey: loss weight of every other prediction (0: answers only)
    depth_curriculum: int = 0       # passkey: over this many steps the key moves from near the question to anywhere
    mqar_pairs: int = 4             # mqar: key-value pairs per sequence, each asked for once (relbench/tasks/mqar.py)
    task_options: dict[str, Any] = field(default_factory=dict)  # a retrieval task's generator options, e.g.
                                    # {p_ignore = 0.8} for flipflop (each task's module says which it has)
    criterion_accuracy: float = 0.0 # retrieval tasks: stop once validation accuracy at the training length is at
                                    # least this at `criterion_checks` consecutive checks (every eval_every steps);
                                    # `steps` is then the cap. 0: train all `steps` (no criterion)
    criterion_checks: int = 2       # consecutive checks the accuracy must hold for a model to count as learned
    criterion_trials: int = 50      # fixed validation trials per check (5 depths for passkey)
    consolidate_steps: int = 0      # retrieval tasks: once the criterion is met, this many further steps with the
                                    # rate decayed (cosine) from its value there to lr * consolidate_lr_ratio,
                                    # so a model is measured converged, not at its transition. 0: stop at the criterion
    consolidate_lr_ratio: float = 0.1  # where consolidation's decay ends, as a fraction of the peak lr
    moments: int = 1                # retrieval tasks: the model is measured at this many moments of its run, the
                                    # check that confirms the criterion and every eval_every steps after it at
                                    # the rate it had ((moments - 1) * eval_every steps more); `extrapolate`
                                    # deals each cell's trials among them (one moment's luck averaged away at
                                    # the same evaluation cost). 1: the model at the criterion alone
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
        ranges = {"warmup_steps": self.warmup_steps >= 0, "weight_decay": self.weight_decay >= 0,
                  "grad_clip": self.grad_clip > 0, "min_lr_ratio": 0 <= self.min_lr_ratio <= 1,
                  "answer_weight": self.answer_weight >= 0, "mqar_pairs": self.mqar_pairs >= 1,
                  "criterion_checks": self.criterion_checks >= 1}
        for name, ok in ranges.items():
            if not ok:
                raise UsageError(f"{name} is out of range: {getattr(self, name)} ({RANGES[name]})")
        if self.decay_steps < 0 or self.decay_steps > max(0, self.steps - self.warmup_steps):
            raise UsageError(f"decay_steps must be 0 (decay after warm-up) or at most steps - warmup_steps "
                             f"({self.steps - self.warmup_steps}), got {self.decay_steps}")
        scales = ([] if self.position_lr_scale is None else [self.position_lr_scale]) + list(self.position_lr_scales.values())
        if any(not (isinstance(x, (int, float)) and 0 < x < float("inf")) for x in scales):
            raise UsageError(f"position learning-rate multipliers must be positive numbers, got {scales}")
        if self.precision not in PRECISIONS:
            raise unknown("precision", self.precision, list(PRECISIONS))
        from relbench.tasks import retrieval_task, training_tasks

        if self.task not in training_tasks():
            raise unknown("training task", self.task, training_tasks())
        if self.task == "lm" and self.task_options:
            raise UsageError(f"task_options ({', '.join(self.task_options)}) set a retrieval task's generator, and this "
                             f"run trains a language model (task = \"lm\"); remove them or set task")
        if self.task != "lm":
            retrieval_task(self.task).options(dataclasses.asdict(self))   # one line on an unknown or bad option
        if min(self.answer_weight, self.text_weight) < 0 or self.answer_weight + self.text_weight <= 0 \
                or self.depth_curriculum < 0:
            raise UsageError("answer_weight and text_weight must be >= 0 (not both 0), depth_curriculum >= 0")
        if not 0 <= self.criterion_accuracy <= 1 or self.criterion_checks < 1 or self.criterion_trials < 5:
            raise UsageError(f"criterion_accuracy must be in [0, 1] (got {self.criterion_accuracy}), criterion_checks "
                             f">= 1 (got {self.criterion_checks}), criterion_trials >= 5 (got {self.criterion_trials})")
        if self.consolidate_steps < 0 or not 0 <= self.consolidate_lr_ratio <= 1:
            raise UsageError(f"consolidate_steps must be >= 0 (got {self.consolidate_steps}) and consolidate_lr_ratio "
                             f"in [0, 1] (got {self.consolidate_lr_ratio})")
        if self.consolidate_steps and not self.criterion_accuracy > 0:
            raise UsageError("consolidate_steps continues training after the criterion is met, and this run has no "
                             "criterion (criterion_accuracy = 0); set criterion_accuracy, or consolidate_steps = 0")
        if self.moments < 1 or (self.moments > 1 and (self.consolidate_steps or not self.criterion_accuracy > 0)):
            raise UsageError(f"moments must be >= 1 (got {self.moments}); more than one trains on after the criterion "
                             f"at a constant rate, so it needs criterion_accuracy > 0 and consolidate_steps = 0 (got "
                             f"{self.criterion_accuracy} and {self.consolidate_steps})")
        if self.criterion_accuracy > 0 and self.task == "lm":
            raise UsageError("criterion_accuracy stops on retrieval accuracy, which a language-model run (task = "
                             "\"lm\") does not measure; set task = \"passkey\" or \"mqar\", or criterion_accuracy = 0")

    @property
    def after_criterion(self) -> int:
        """The steps a run trained to criterion goes on once it is met: consolidation's, or the moments'."""
        return self.consolidate_steps or (self.moments - 1) * self.eval_every


@dataclass
class EvalConfig:
    eval_tokens: int = 65536        # scored test tokens, the same at every length
    max_batch_tokens: int = 16384   # windows per forward pass = max(1, this // length)
    tasks: list[str] = field(default_factory=lambda: ["perplexity"])  # what `extrapolate` measures by default
    length_multiples: list[int] = field(default_factory=lambda: [1, 4, 16])  # default lengths, x train length
    lengths: list[int] | None = None  # `extrapolate`'s lengths when given (else the multiples)
    trials: int = 20                # copy: trials per distance; passkey, mqar: per length and depth

    def __post_init__(self) -> None:
        from relbench.tasks import get_task

        for task in self.tasks:
            get_task(task)
        if min([self.eval_tokens, self.max_batch_tokens, self.trials, *self.length_multiples, *(self.lengths or [])]) < 1:
            raise UsageError("eval_tokens, max_batch_tokens, trials and length multiples must be positive")


PRESET_PACKAGE = "relbench.presets"
DEFAULT_PRESET = "quick"
NOT_IN_FILES = {"model": ("position", "attention"), "train": ("seed",)}   # set by variants, train.attention, seeds


@dataclass
class DataConfig:
    dataset: str = "sotu"           # see relbench.data.corpus.open_source; "sotu": the embedded corpus
    tokenizer: str = "bytes"        # see relbench.data.tokenizer
    stream: bool = False            # a hub dataset read as a stream (datasets streaming), up to max_train_tokens
    max_train_tokens: int | None = None  # the training split's token budget (None: all of it)


SECTIONS = {"data": DataConfig, "model": ModelConfig, "train": TrainConfig, "eval": EvalConfig}   # the tables
TOP_KEYS = ("description", "preset", "plugins", "variants", "seeds", "retrieval", *SECTIONS)

@dataclass
class Experiment:
    """Everything a run is made of, as resolved from a preset, an experiment file and options."""

    preset: str                     # the preset at the base of the chain
    data: DataConfig
    model: ModelConfig
    train: TrainConfig
    eval: EvalConfig
    variants: list[str] | None = None   # None: every variant
    seeds: list[int] | None = None      # None: [0]
    description: str = ""
    retrieval: str | None = None        # a language-model preset's retrieval track (`relbench bench`): a preset name
    plugins: list[str] = field(default_factory=list)   # files of position variants (positions/plugins.py), absolute


def run_data(run_config: dict[str, Any]) -> DataConfig:
    """The data a run was trained on, from its config.json: its [data] table, or for a run from
    before that table its top-level dataset and tokenizer (bytes, no stream, no budget)."""
    if "data" in run_config:
        return DataConfig(**run_config["data"])
    return DataConfig(dataset=run_config.get("dataset") or "sotu", tokenizer=run_config.get("tokenizer") or "bytes")


def preset_names() -> list[str]:
    """The presets shipped in the package (relbench/presets/*.toml)."""
    from importlib import resources

    return sorted(p.name[:-5] for p in resources.files(PRESET_PACKAGE).iterdir() if p.name.endswith(".toml"))


def _parse_toml(text: str, where: str) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"{where} is not valid TOML: {error}") from None


def read_file(path: str | Path) -> dict[str, Any]:
    """The raw tables of an experiment file, its keys checked (unknown ones are refused, with the
    closest known one)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"config file {path} does not exist; give a .toml experiment file "
                         f"(`relbench presets` lists the shipped ones)") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"cannot read config file {path}: {error}") from None
    table = _checked(_parse_toml(text, f"config file {path}"), str(path))
    if "plugins" in table:   # relative to the file, so that the file works from any directory
        table["plugins"] = [str((path.parent / p).expanduser().resolve()) for p in table["plugins"]]
    return table


def read_preset(name: str) -> dict[str, Any]:
    from importlib import resources

    if name not in preset_names():
        raise unknown("preset", name, preset_names())
    text = resources.files(PRESET_PACKAGE).joinpath(f"{name}.toml").read_text(encoding="utf-8")
    return _checked(_parse_toml(text, f"preset {name}"), f"preset {name}")


def _checked(table: dict[str, Any], where: str) -> dict[str, Any]:
    for key in table:
        if key not in TOP_KEYS:
            raise _unknown_key(key, where, list(TOP_KEYS))
    for section, cls in SECTIONS.items():
        values = table.get(section, {})
        if not isinstance(values, dict):
            raise UsageError(f"{section} in {where} must be a table ([{section}]), got {values!r}")
        fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in NOT_IN_FILES.get(section, ())}
        for key, value in values.items():
            if key not in fields:
                hint = {"position": " (variants go in the top-level `variants` list)",
                        "seed": " (seeds go in the top-level `seeds` list)"}.get(key, "")
                raise _unknown_key(key, f"[{section}] of {where}", list(fields), hint)
            kind = str(fields[key].type).split("|")[0].split("[")[0].strip()   # "int | None" -> int
            expected = {"int": int, "float": (int, float), "str": str, "bool": bool, "list": list, "dict": dict}[kind]
            if not isinstance(value, expected) or (isinstance(value, bool) and kind != "bool"):
                what = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
                        "list": "a list", "dict": "a table"}[kind]
                raise UsageError(f"{key} in [{section}] of {where} must be {what}, got {value!r}")
    if "retrieval" in table and not isinstance(table["retrieval"], str):
        raise UsageError(f"retrieval in {where} must be a preset name, got {table['retrieval']!r}")
    for key, kind in (("variants", str), ("seeds", int), ("plugins", str)):
        if key in table and not (isinstance(table[key], list) and all(isinstance(v, kind) for v in table[key])):
            raise UsageError(f"{key} in {where} must be a list of {kind.__name__}s, got {table[key]!r}")
    for key in ("variants", "seeds"):
        if key in table and not table[key]:
            raise UsageError(f"{key} in {where} is an empty list; name at least one, or leave the key out for the default")
    if any(isinstance(s, int) and s < 0 for s in table.get("seeds", [])):
        raise UsageError(f"seeds in {where} must be 0 or more, got {table['seeds']!r}")
    return table


def _unknown_key(key: str, where: str, allowed: list[str], hint: str = "") -> UsageError:
    return UsageError(f'unknown key "{key}" in {where}{hint}{did_you_mean(key, allowed)}; known: {", ".join(allowed)}')


def layered(preset: str | None = None, config: str | Path | None = None) -> tuple[str, dict[str, Any]]:
    """(base preset name, raw tables): the base preset (`preset`, else the file's own `preset` key,
    else quick) with every preset it names in turn, then the file over it. A section's keys replace
    the base's one by one; a table value (position_lr_scales) replaces the base's whole."""
    file = read_file(config) if config is not None else {}
    chain, name, seen = [file], preset or file.get("preset") or DEFAULT_PRESET, []
    while name is not None:
        if name in seen:
            raise UsageError(f"presets name each other in a loop: {' -> '.join(seen + [name])}")
        seen.append(name)
        table = read_preset(name)
        chain.insert(0, table)
        name = table.get("preset")
    merged: dict[str, Any] = {}
    for table in chain:
        for key, value in table.items():
            if key in SECTIONS:
                merged[key] = {**merged.get(key, {}), **value}
            elif key != "preset":
                merged[key] = value
    return seen[0], merged


def experiment(preset: str | None = None, config: str | Path | None = None,
               overrides: dict[str, dict[str, Any]] | None = None) -> Experiment:
    """The resolved experiment: preset < experiment file < `overrides` (None values are ignored)."""
    name, tables = layered(preset, config)
    sections = {}
    for section, cls in SECTIONS.items():
        given = {k: v for k, v in ((overrides or {}).get(section) or {}).items() if v is not None}
        try:
            sections[section] = cls(**{**tables.get(section, {}), **given})
        except (TypeError, UsageError) as error:  # a value of the wrong type or range, named with its file
            raise UsageError(f"[{section}] of {config or f'preset {name}'}: {error}") from None
    return Experiment(name, sections["data"], sections["model"], sections["train"], sections["eval"],
                      tables.get("variants"), tables.get("seeds"), tables.get("description", ""),
                      tables.get("retrieval"), list(tables.get("plugins", [])))


def to_dict(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj)


def resolve(preset_name: str | None = None, model: dict[str, Any] | None = None, train: dict[str, Any] | None = None,
            eval: dict[str, Any] | None = None) -> tuple[ModelConfig, TrainConfig, EvalConfig]:
    """The preset's configs with the given fields overridden (None values are ignored)."""
    found = experiment(preset_name, overrides={"model": model, "train": train, "eval": eval})
    return found.model, found.train, found.eval


def to_toml(tables: dict[str, Any], header: str = "") -> str:
    """`tables` as TOML: None values are left out (TOML has no null; the field's default is None)."""
    import tomli_w

    def clean(value):
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if v is not None}
        return value

    return header + tomli_w.dumps(clean(tables))
