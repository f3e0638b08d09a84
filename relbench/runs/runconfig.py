"""A run's configuration and whether another is compatible with it: what config.json and
config.toml record of a run (`run_config`, `write_config`), which parts of two configurations
differ (`differences`; a recorded run lacking a newer key holds it at its default, `with_defaults`),
the plugins a run's variants need (`merged_plugins`), and `record_run`, which adds a command's
variants and seeds to a run directory after checking that it holds no run of another configuration.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from relbench.errors import RelbenchError, UsageError
from relbench.runs import machine
from relbench.runs.results import CONFIG, CONFIG_TOML, atomic_write_text, read_json, write_json


def run_config(exp, specs: list[str], seeds: list[int], splits) -> dict[str, Any]:
    """What config.json records of a run made from the experiment `exp` (a relbench.config.Experiment)
    on `splits`: config.toml holds the same but what loading the data found (see `write_config`)."""
    from relbench.config import to_dict

    config = {"preset": exp.preset, "model": to_dict(exp.model), "train": to_dict(exp.train),
              "eval": to_dict(exp.eval), "data": to_dict(exp.data), "dataset_description": splits.description,
              "tokenizer_fingerprint": splits.tokenizer.fingerprint, "variants": specs, "seeds": seeds}
    config["model"].pop("position")
    config["model"].pop("attention")
    config["train"].pop("seed")
    return config


def write_config(run_dir: Path, config: dict[str, Any], description: str) -> None:
    """RUN/config.json and RUN/config.toml, the same configuration: `relbench train --config
    RUN/config.toml --run-dir NEW` trains the run again (the environment is only in the JSON)."""
    from relbench import __version__
    from relbench.config import to_toml

    write_json(Path(run_dir) / CONFIG, config)
    files = [r["path"] for r in config.get("plugins", []) if r.get("path")]
    tables = {"preset": config["preset"], **({"description": description} if description else {}),
              **({"plugins": files} if files else {}),
              **{k: config[k] for k in ("variants", "seeds", "data", "model", "train", "eval")}}
    header = (f"# The resolved configuration of this run, written by relbench {__version__}. Reproduce it with\n"
              f"#   relbench train --config {Path(run_dir) / CONFIG_TOML} --run-dir NEW_RUN_DIR\n")
    if config.get("finetune"):   # not part of the training run: the commands that made its fine-tuned checkpoints
        header += "# and its fine-tuned checkpoints (relbench/training/finetune.py) with\n" + "".join(
            f"#   {entry['command']}\n" for entry in config["finetune"].values())
    atomic_write_text(Path(run_dir) / CONFIG_TOML, to_toml(tables, header))


def differences(old: dict[str, Any], new: dict[str, Any], variants: list[str] | None = None) -> list[str]:
    """The parts of a run's configuration that differ (a run directory holds one configuration). Of
    train.position_lr_scales only the entries `variants` read count: the variants trained under one
    table that the other will describe, `old`'s where not named (`record_run` writes `new` over it; a
    merge keeps the target's table and names the variants it folds in). So a run that holds `xl` folds
    into one whose table gives `t5` another rate, and a new variant's own rate is no difference."""
    from relbench.config import run_data, to_dict

    old_data = to_dict(run_data(old))   # a config.json from before [data]: its defaults
    keys = scale_keys(list(old.get("variants", [])) if variants is None else variants)
    return ([key for key in ("model", "train")
             if read_scales(with_defaults(key, old.get(key), new[key]), keys)
             != read_scales(with_defaults(key, new[key], old.get(key) or {}), keys)]
            + [key for key, value in new["data"].items() if old_data.get(key) != value])


def scale_keys(specs: list[str]) -> set[str] | None:
    """The position_lr_scales entries `specs` read (positions.Spec.scale_keys); None where a spec does
    not parse here (a plugin's variant whose file is not loaded): what it reads is not known."""
    from relbench import positions

    try:
        return {key for spec in specs for key in positions.parse(spec).scale_keys}
    except RelbenchError:
        return None


def read_scales(table: dict[str, Any] | None, keys: set[str] | None) -> dict[str, Any] | None:
    """A recorded table with its position_lr_scales (a [train] table's) cut to `keys`; whole where
    `keys` is None (all of it counts) or it has none."""
    if not table or not table.get("position_lr_scales") or keys is None:
        return table
    return {**table, "position_lr_scales": {k: v for k, v in table["position_lr_scales"].items() if k in keys}}


def with_defaults(table: str, old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any] | None:
    """A recorded [model] or [train] table with the keys it lacks (written before they existed, such
    as train.decay_steps) at their defaults, which is how that run was trained: an old run stays
    compatible with a configuration that leaves the new keys at their defaults."""
    from relbench.config import ModelConfig, TrainConfig

    if old is None:
        return None
    defaults = dataclasses.asdict(ModelConfig() if table == "model" else TrainConfig())
    return {**{k: defaults[k] for k in new if k not in old and k in defaults}, **old}


def merged_plugins(old: list[dict[str, Any]], specs: list[str], run_dir: Path) -> list[dict[str, Any]]:
    """The plugins a run's variants need: those recorded before, and those this command loaded for its
    variants. A plugin file recorded before that has changed since is refused: the run's earlier
    variants were trained with the file as it was."""
    from relbench.positions import plugins

    out = list(old)
    for record in plugins.records_for(specs):
        same = next((r for r in out if r.get("path", r.get("entry_point")) == record.get("path", record.get("entry_point"))),
                    None)
        if same is None:
            out.append(record)
        elif same.get("sha256") != record.get("sha256") or same.get("distribution") != record.get("distribution"):
            raise UsageError(f"plugin {record.get('path') or record.get('entry_point')} changed since {run_dir}'s "
                             f"variants {', '.join(same['variants'])} were trained with it; use another --run-dir, or "
                             f"restore the file")
        else:
            same.update(variants=sorted(set(same["variants"]) | set(record["variants"])))
    return out


def record_run(run_dir: Path, config: dict[str, Any], specs: list[str], seeds: list[int], device: torch.device,
               description: str) -> dict[str, Any]:
    """config.json and config.toml with this command's variants and seeds added, after checking that
    the run directory holds no run of another configuration; returns what it wrote."""
    path = Path(run_dir) / CONFIG
    if not path.is_file() and ((Path(run_dir) / "checkpoints").is_dir() or any(Path(run_dir).glob("*.csv"))):
        raise UsageError(f"{run_dir} holds a run's files but no {CONFIG}, so how they were made is unknown and no "
                         f"configuration may adopt them; restore {path} (config.toml beside it holds the settings) "
                         f"or use another --run-dir")
    if path.is_file():
        old = read_json(path)
        differs = differences(old, config)
        if differs:
            raise UsageError(f"{run_dir} holds a run with a different {' and '.join(differs)} configuration "
                             f"(preset {old.get('preset')}); use another --run-dir, or delete {run_dir} to start over")
        known = old.get("variants", [])
        config["variants"] = known + [s for s in specs if s not in known]
        config["seeds"] = sorted(set(old.get("seeds", [])) | set(seeds))
        for kept in ("finetune", "merged_from", "against"):   # what earlier commands recorded of the run
            if old.get(kept):
                config[kept] = old[kept]
    plugin_records = merged_plugins(read_json(path).get("plugins", []) if path.is_file() else [], config["variants"],
                                    run_dir)
    if plugin_records:
        config["plugins"] = plugin_records
    config["environment"] = machine.environment(str(device))
    write_config(run_dir, config, description)
    return config
