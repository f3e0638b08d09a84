"""Folding runs made side by side into one run directory (`relbench merge`).

A run of many variants and seeds splits naturally: two CPU processes, two machines, a cluster's
jobs, each training and evaluating its share into a run directory of its own with the same
configuration. `merge_runs` folds such runs into one, so `report` sees every variant and seed:

- the configuration must be the same (`runconfig.differences`, as `train` checks before adding to a run),
  but for rate scales (train.position_lr_scales) that no folded variant reads (the target's are kept);
- checkpoints are copied, and the rows of train.csv, positions.csv and every table `extrapolate`
  writes (extrapolation.csv, copy.csv, passkey.csv, mqar.csv, attention.csv) are added, keyed as
  their writers key them (train.csv and positions.csv by their groups: a variant x seed's loss
  curve, a perplexity row's position bins, go whole);
- config.json gains the sources' variants and seeds, and records each source (`merged_from`:
  its folder, the variants and seeds it holds (those with a loss curve, not a seed it was configured
  for and never finished) and environment: the machine and commit its figures came from).

Nothing is lost: a row, group or checkpoint that both hold and that differs is a conflict, and the
merge stops before writing anything, unless `replace` says the sources' win. One the target holds
already, identical, is not a conflict (merging again after an interruption changes nothing).
profile.csv (timings of a machine, not of a model) and inspect.csv (one seed's diagnostics) are not
folded: rerun `relbench profile` and `relbench inspect` on the merged run.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from relbench.errors import RelbenchError, UsageError
from relbench.runs import checkpoints, results, runconfig, rundir

TRAIN_KEY = ["variant", "seed"]   # a loss curve goes whole: train.csv's key, beside the caller's tables
LOCK_FILES = (".lock", ".lock.pid")   # what rundir.RunLock leaves in a folder it locked


@dataclass
class Merged:
    """What a merge added: per table the number of rows (or groups) added and replaced, and the
    checkpoints copied."""
    added: dict[str, int] = field(default_factory=dict)
    replaced: dict[str, int] = field(default_factory=dict)
    checkpoints: list[str] = field(default_factory=list)


def _groups(frame: pd.DataFrame, key: list[str]) -> dict[tuple, pd.DataFrame]:
    """The rows of `frame` by their values in `key` (compared as text, as replace_rows does)."""
    if frame.empty or not all(k in frame.columns for k in key):
        return {}
    labels = frame[key].astype(str).apply(tuple, axis=1)
    return dict(list(frame.groupby(labels, sort=False)))


def _same(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Whether two groups hold the same rows (the same columns, values and order)."""
    columns = sorted(set(a.columns) | set(b.columns))
    return a.reindex(columns=columns).reset_index(drop=True).to_csv(index=False) == \
        b.reindex(columns=columns).reset_index(drop=True).to_csv(index=False)


def _fold(target: pd.DataFrame, source: pd.DataFrame, key: list[str], replace: bool, name: str,
          where: str, conflicts: list[str]) -> tuple[pd.DataFrame, int, int]:
    """`target` with `source`'s groups added (replaced where `replace`); conflicts are appended."""
    mine, theirs = _groups(target, key), _groups(source, key)
    keep, gone = [], set()
    for label, rows in theirs.items():
        if label not in mine:
            keep.append(rows)
        elif not _same(mine[label], rows):
            if not replace:
                conflicts.append(f"{name} {dict(zip(key, label))} differs in {where}")
                continue
            gone.add(label)
            keep.append(rows)
    added, replaced = len(keep) - len(gone), len(gone)
    kept_target = [rows for label, rows in mine.items() if label not in gone] if mine else [target]
    frames = [f for f in kept_target + keep if not f.empty]
    out = pd.concat(frames, ignore_index=True) if frames else target
    return out, added, replaced


def _held(curves: pd.DataFrame, config: dict[str, Any]) -> tuple[list[str], list[int]]:
    """The variants and seeds a source holds: those with a loss curve in its train.csv, `curves` (a seed it
    was configured for but stopped before finishing is not one), in its config's order; its config's lists
    where it has no train.csv."""
    if curves.empty or not {"variant", "seed"} <= set(curves.columns):
        return list(config.get("variants", [])), list(config.get("seeds", []))
    names, numbers = set(curves["variant"].astype(str)), {int(s) for s in curves["seed"]}
    variants = [v for v in config.get("variants", []) if v in names]
    variants += sorted(names - set(variants))
    return variants, sorted(numbers)


def _checkpoint_meta(folder: Path) -> str | None:
    path = folder / "meta.json"
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _same_plugins(mine: list[dict[str, Any]], theirs: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    out = [dict(r) for r in mine]
    for record in theirs:
        ident = record.get("path", record.get("entry_point"))
        same = next((r for r in out if r.get("path", r.get("entry_point")) == ident), None)
        if same is None:
            out.append(dict(record))
        elif same.get("sha256") != record.get("sha256"):
            raise UsageError(f"{where} was trained with another version of plugin {ident} than the target; "
                             f"runs made with different scheme files cannot be merged")
        else:
            same["variants"] = sorted(set(same.get("variants", [])) | set(record.get("variants", [])))
    return out


def _chosen(frame: pd.DataFrame, seeds: list[int] | None, variants: list[str] | None) -> pd.DataFrame:
    """The rows of the chosen seeds and variants (all where none are named)."""
    keep = pd.Series(True, index=frame.index)
    if seeds is not None and "seed" in frame.columns:
        keep &= frame["seed"].astype(int).isin(seeds)
    if variants is not None and "variant" in frame.columns:
        keep &= frame["variant"].astype(str).isin(variants)
    return frame[keep]


def _chosen_checkpoint(name: str, seeds: list[int] | None, variants: list[str] | None) -> bool:
    """Whether a checkpoint folder (`<slug>-seed<s>`) holds a chosen seed and variant."""
    slug, _, seed = name.rpartition("-seed")
    return (seeds is None or (seed.isdigit() and int(seed) in seeds)) and \
        (variants is None or slug in {rundir.slug(v) for v in variants})


def merge_runs(target: Path, sources: list[Path], tables: dict[str, list[str]], replace: bool = False,
               seeds: list[int] | None = None, variants: list[str] | None = None) -> Merged:
    """Fold the runs `sources` into the run `target` (created from the first source when it does not
    exist or is empty): train.csv and the result `tables` (name: the columns that identify a row, or
    a group that goes whole; evaluation.extrapolate.result_tables() gives every table relbench
    writes); with `seeds` or `variants`, only theirs. Every check comes before the first write."""
    target, sources = Path(target), [Path(s) for s in sources]
    configs, config, fresh = _check_sources(target, sources, variants)
    conflicts: list[str] = []
    merged = Merged()
    folded, curves = _fold_tables(target, sources, {results.TRAIN_CSV: TRAIN_KEY, **tables}, replace, seeds, variants,
                                  merged, conflicts)
    copies = _checkpoint_copies(target, sources, replace, seeds, variants, conflicts)
    if conflicts:
        shown = "; ".join(conflicts[:3]) + (f"; and {len(conflicts) - 3} more" if len(conflicts) > 3 else "")
        raise UsageError(f"{target} and the runs to fold in disagree: {shown}. Nothing was written; pass --replace "
                         f"to keep the folded runs' rows and checkpoints")
    plugins = config.get("plugins", [])
    for source, theirs in zip(sources, configs):
        plugins = _same_plugins(plugins, theirs.get("plugins", []), str(source))

    # the writes: checkpoints, then tables, then config.json (which says what the run holds)
    target.mkdir(parents=True, exist_ok=True)
    for checkpoint, there in copies:
        if there.exists():
            shutil.rmtree(there)
        shutil.copytree(checkpoint, there)
        merged.checkpoints.append(checkpoint.name)
    for name, table in folded.items():
        results.write_csv(target / name, table)
    config = _merged_config(config, fresh, sources, configs, curves, plugins)
    runconfig.write_config(target, config, _description(target if not fresh else sources[0]))
    return merged


def _check_sources(target: Path, sources: list[Path], variants: list[str] | None = None,
                   ) -> tuple[list[dict[str, Any]], dict[str, Any], bool]:
    """The sources' configs, the target's (the first source's when the target is new) and whether it is
    new, once every source is a run of the target's configuration for the variants it folds in
    (`variants` of each source, all where None) and not the target itself."""
    if not sources:
        raise UsageError("relbench merge needs at least one run to fold in; name its folder")
    for source in sources:
        if source.resolve() == target.resolve():
            raise UsageError(f"{source} is the target run itself; name the runs to fold into it")
    configs = [rundir.require_run(s) for s in sources]
    fresh = not (target / results.CONFIG).is_file()
    if fresh and target.is_dir() and any(p.name not in LOCK_FILES for p in target.iterdir()):
        rundir.require_run(target)   # says what it is not
    config = dict(configs[0]) if fresh else rundir.require_run(target)
    for source, theirs in zip(sources, configs):   # the target's table is kept: it must fit what comes in
        folded = [v for v in theirs.get("variants", []) if variants is None or v in variants]
        differs = runconfig.differences(config, theirs, folded)
        if differs or theirs.get("tokenizer_fingerprint") != config.get("tokenizer_fingerprint"):
            what = " and ".join(differs) or "tokenizer"
            raise UsageError(f"{source} holds a run with a different {what} configuration than {target}; "
                             f"only runs of one configuration merge")
    return configs, config, fresh


def _fold_tables(target: Path, sources: list[Path], keys: dict[str, list[str]], replace: bool,
                 seeds: list[int] | None, variants: list[str] | None, merged: Merged,
                 conflicts: list[str]) -> tuple[dict[str, pd.DataFrame], dict[Path, pd.DataFrame]]:
    """Each table of `keys` (name: its key) with the sources' chosen rows folded in, for the tables that
    changed, and each source's train.csv as read for the fold; counts go to `merged`, conflicts are
    appended. Nothing is written."""
    folded: dict[str, pd.DataFrame] = {}
    curves: dict[Path, pd.DataFrame] = {}     # each source's train.csv, as read for the fold
    for name, key in keys.items():
        path = target / name
        table = results.read_csv(path) if path.is_file() else pd.DataFrame()
        changed = False
        for source in sources:
            if not (source / name).is_file():
                continue
            source_rows = _chosen(results.read_csv(source / name), seeds, variants)
            if name == results.TRAIN_CSV:
                curves[source] = source_rows
            table, added, replaced = _fold(table, source_rows, key, replace, name, str(source), conflicts)
            merged.added[name] = merged.added.get(name, 0) + added
            merged.replaced[name] = merged.replaced.get(name, 0) + replaced
            changed |= bool(added or replaced)
        if changed:
            folded[name] = table
    return folded, curves


def _checkpoint_copies(target: Path, sources: list[Path], replace: bool, seeds: list[int] | None,
                       variants: list[str] | None, conflicts: list[str]) -> list[tuple[Path, Path]]:
    """(checkpoint folder, where it goes) for every chosen checkpoint the target lacks or holds
    differently (those only with `replace`; otherwise a conflict is appended); a damaged one raises."""
    copies: list[tuple[Path, Path]] = []
    for source in sources:
        folder = source / "checkpoints"
        for checkpoint in sorted(folder.iterdir()) if folder.is_dir() else []:
            if not checkpoint.is_dir() or not _chosen_checkpoint(checkpoint.name, seeds, variants):
                continue
            there = target / "checkpoints" / checkpoint.name
            if there.exists() and _checkpoint_meta(there) == _checkpoint_meta(checkpoint):
                continue
            if there.exists() and not replace:
                conflicts.append(f"checkpoint {checkpoint.name} differs in {source}")
                continue
            problem = checkpoints.damage(checkpoint)
            if problem:
                raise RelbenchError(f"{problem}, in a run to fold in; nothing was written: retrain it with "
                                    f"`{checkpoints.retrain_command(checkpoint)}` or delete {checkpoint} there")
            copies.append((checkpoint, there))
    return copies


def _merged_config(config: dict[str, Any], fresh: bool, sources: list[Path], configs: list[dict[str, Any]],
                   curves: dict[Path, pd.DataFrame], plugins: list[dict[str, Any]]) -> dict[str, Any]:
    """The target's config.json after the fold: the variants and seeds the sources hold added, each
    source recorded in `merged_from`, the plugins and the sources' fine-tuning records."""
    variants = list(config.get("variants", [])) if not fresh else []
    seeds = set(config.get("seeds", [])) if not fresh else set()
    history = list(config.get("merged_from", []))
    for source, theirs in zip(sources, configs):
        held_variants, held_seeds = _held(curves.get(source, pd.DataFrame()), theirs)
        variants += [v for v in held_variants if v not in variants]
        seeds |= set(held_seeds)
        history += _provenance(source, theirs, held_variants, held_seeds)
    config = {**_in_field_order(config), "variants": variants, "seeds": sorted(seeds), "merged_from": history}
    if plugins:
        config["plugins"] = plugins
    finetune = {**config.get("finetune", {})}
    for theirs in configs:
        finetune.update(theirs.get("finetune", {}))
    if finetune:
        config["finetune"] = finetune
    return config


def _provenance(source: Path, theirs: dict[str, Any], variants: list[str], seeds: list[int]) -> list[dict[str, Any]]:
    """The `merged_from` entries of what `source` brings (`variants` x `seeds`): a source that was itself
    folded together keeps each run it folded in, with that run's machine, for the variants and seeds of it
    that come along; the rest is the source's own, under its environment (one entry per set of seeds)."""
    nested, covered = [], set()
    for entry in theirs.get("merged_from", []):
        held = ([v for v in entry.get("variants", []) if v in variants], [s for s in entry.get("seeds", []) if s in seeds])
        if held[0] and held[1]:
            nested.append({**entry, "run": f"{entry.get('run')} (via {source})", "variants": held[0], "seeds": held[1]})
            covered |= {(v, s) for v in held[0] for s in held[1]}
    own: dict[tuple[int, ...], list[str]] = {}
    for variant in variants:
        rest = tuple(s for s in seeds if (variant, s) not in covered)
        if rest:
            own.setdefault(rest, []).append(variant)
    return [{"run": str(source), "variants": held, "seeds": list(rest), "environment": theirs.get("environment", {})}
            for rest, held in own.items()] + nested


def _in_field_order(config: dict[str, Any]) -> dict[str, Any]:
    """config.json's tables (written with sorted keys) in their dataclasses' field order, as `train`
    writes config.toml, so a merge does not reorder it."""
    import dataclasses

    from relbench.config import DataConfig, EvalConfig, ModelConfig, TrainConfig

    out = dict(config)
    for table, cls in (("model", ModelConfig), ("train", TrainConfig), ("eval", EvalConfig), ("data", DataConfig)):
        if isinstance(out.get(table), dict):
            order = [f.name for f in dataclasses.fields(cls)]
            out[table] = {**{k: out[table][k] for k in order if k in out[table]},
                          **{k: v for k, v in out[table].items() if k not in order}}
    return out


def _description(run: Path) -> str:
    """The experiment's description, which config.toml keeps (config.json does not)."""
    from relbench.config import read_file
    from relbench.errors import RelbenchError

    path = run / results.CONFIG_TOML
    try:
        return str(read_file(path).get("description", "")) if path.is_file() else ""
    except (OSError, RelbenchError):
        return ""   # the description is a comment's worth; a damaged config.toml is rewritten whole
