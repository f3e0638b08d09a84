"""Fine-tuning to the target length (`relbench finetune`): continue training finished checkpoints at a
longer length, so that `extrapolate` and `report` show, per scheme, zero-shot against after N steps of
fine-tuning: the comparison that position interpolation (PI), YaRN and LongRoPE make.

    RUN/checkpoints/<variant>+ft<L>-seed<s>/  model.pt, meta.json (with a "finetune" record), resume.pt
    RUN/finetune.csv                          loss curve: one row per entry x seed x logged step (as train.csv)
    RUN/config.json, "finetune"               entry -> its settings and the command that made it (also
                                              written as a comment at the top of RUN/config.toml)

"rope+ft1024" is a checkpoint of its own that `extrapolate` evaluates beside "rope" (and with a form,
"rope+ft1024@yarn"); the originals (model.pt, meta.json, train.csv) are only read. A variant named with
an evaluation form is fine-tuned under it, as PI and YaRN fine-tune: `--variants rope@pi` at 1024
writes "rope@pi:factor=4+ft1024" (a factor that follows the length is pinned at the fine-tuning
length, forms.Form.pinned), which `extrapolate` evaluates with that form at every length. The loop is
training's (train.train_variant with a train.Continuation), so a run stops on SIGINT/SIGTERM with a
resume.pt and resumes bit-exactly, and a diverging or out-of-memory run is handled as in training.

The protocol, by default (each choice can be changed where an option says so):
- weights: the variant's finished model.pt (checked against its sha256). The model keeps its
  configuration, train_length included (schemes such as FIRE and dynamic scale distances by it).
- optimiser: a fresh AdamW with training's parameter groups, weight decay and the variant's position
  learning-rate multiplier (as recorded in its meta.json, tuned or not). Adam's moments from training
  are not kept (a finished checkpoint does not hold them; PI and YaRN also start a new optimiser).
- learning rate (--lr): peak = the run's training peak; training's schedule (step.lr_at) over the N
  steps: linear warm-up over min(training warm-up, max(1, N // 10)) steps, then cosine to
  peak x min_lr_ratio.
- batches: training's rule continued. Fine-tuning step s takes the batch that batches.training_batch
  draws for step (training steps + s) of the same seed, at length L and the fine-tuning batch size: a
  function of (seed, step), the same for every variant, never a training step's batch.
- batch size (--batch-size): training batch x training length / L, the same tokens per step, when it
  divides; else its floor (at least 1), and the command says how the tokens per step differ.
- validation: the run's fixed validation windows at length L.

`--length` equal to the training length is the control ("rope+ft256"): the same steps, learning
rates and tokens per step at the length the model already knows, so that `extrapolate` can tell how
much of a fine-tuned model's gain is the longer context and how much is more training.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from rich.console import Console
from rich.progress import Progress

from relbench import positions
from relbench.attention import check as check_backend
from relbench.config import ModelConfig, TrainConfig, to_dict
from relbench.cost import memory, resident
from relbench.data import Splits
from relbench.errors import RelbenchError, UsageError
from relbench.positions import forms
from relbench.runs import checkpoints, distributed, results, runconfig, rundir
from relbench.training.pairs import append_rows
from relbench.training.stopping import Diverged, StopRequest
from relbench.training.train import Continuation, make_progress, train_variant

FINETUNE_CSV = "finetune.csv"


def batch_size_for(batch_size: int, train_length: int, length: int) -> tuple[int, str]:
    """The default fine-tuning batch at `length`: the training tokens per step (batch_size x
    train_length) when they divide into sequences of `length`, else the floor (at least 1); and a
    note ("" when the tokens per step are the same)."""
    tokens = batch_size * train_length
    batch = max(1, tokens // length)
    if batch * length == tokens:
        return batch, ""
    return batch, (f"--batch-size {batch} x --length {length} is {batch * length:,} tokens per step; training took "
                   f"{tokens:,} ({batch_size} x {train_length}), which {length} does not divide")


def warmup_for(train_warmup: int, steps: int) -> int:
    """Warm-up steps of a fine-tuning run of `steps`: training's, at most a tenth of the run (at least 1)."""
    return min(train_warmup, max(1, steps // 10))


def check_length(spec: str, model: ModelConfig, length: int) -> None:
    """Refuse (UsageError) a length shorter than training, or that the scheme cannot represent, or a form
    that cannot read the trained scheme. The training length itself is allowed: the control run (the
    same steps and tokens, no longer context)."""
    if length < model.train_length:
        raise UsageError(f"--length {length} is shorter than the training length {model.train_length}; "
                         f"fine-tuning extends the context: give a --length above {model.train_length} (or "
                         f"{model.train_length} itself for the control run)")
    form = forms.parse_form(spec)
    for layer in positions.parse(forms.scheme_spec(spec)).pattern:
        enc = layer.build(**model.position_shape)
        if form is not None and form.applies(type(enc)):
            form.check(enc)
        if enc.max_length is not None and length > enc.max_length:
            raise UsageError(f"{spec} represents positions below {enc.max_length} only (learned per position up to "
                             f"the training length), so it cannot be fine-tuned at --length {length}; leave it out "
                             f"of --variants")


def trained_encoding(spec: str, model: ModelConfig) -> positions.PositionEncoding:
    """The position scheme of the checkpoint `spec` fine-tunes (its variant, as trained): in a layout,
    the first layer's that the spec's evaluation form applies to (the one it pins), else the first."""
    pattern = positions.parse(forms.scheme_spec(spec)).pattern
    form = forms.parse_form(spec)
    fits = [layer for layer in pattern if form is not None and form.applies(layer.cls)]
    return (fits or list(pattern))[0].build(**model.position_shape)


def pairs_to_tune(run_dir: Path, config: dict[str, Any], variants: list[str] | None, seeds: list[int] | None,
                  length: int, console: Console) -> list[tuple[str, int, dict[str, Any]]]:
    """(variant, seed, its meta.json) of every finished checkpoint to fine-tune: those named (each must
    be finished and able to reach `length`), or every trained variant and seed that is (a variant that
    cannot reach it is left out, and said so)."""
    named = bool(variants or seeds)
    specs, seeds = variants or config.get("variants", []), seeds or config.get("seeds", [0])
    for spec in specs:
        if forms.finetune_length(spec) is not None:
            raise UsageError(f'"{spec}" is a fine-tuned checkpoint; fine-tune the trained variant '
                             f'({forms.scheme_spec(spec)}, or with a form: {forms.scheme_spec(spec)}@pi)')
        forms.parse_form(spec)          # an unknown variant or form, or a form that does not fit, fails here
    found = []
    for seed in seeds:
        for spec in specs:
            trained = forms.trained_spec(spec)
            meta = checkpoints.read_meta(rundir.checkpoint_dir(run_dir, trained, seed)) or {}
            if not meta.get("finished"):
                if named:
                    raise RelbenchError(f"variant {trained} seed {seed} has no finished checkpoint in {run_dir}; run "
                                        f"`relbench train --run-dir {run_dir} --variants {trained} --seeds {seed}`")
                continue
            try:
                check_length(spec, ModelConfig(**meta["model"]), length)
            except UsageError as error:
                if named or length < meta["model"]["train_length"]:
                    raise
                console.print(f"{spec}: left out ({error})", markup=False)
                continue
            found.append((spec, seed, meta))
    if not found:
        raise RelbenchError(f"{run_dir} has no trained variant to fine-tune at {length}; run "
                            f"`relbench train --run-dir {run_dir}` first")
    return found


def settings(meta: dict[str, Any], length: int, steps: int, lr: float | None,
             batch_size: int | None) -> tuple[TrainConfig, dict[str, Any], str]:
    """The fine-tuning TrainConfig of a checkpoint, its "finetune" record and the batch-size note. A run
    measured at several moments ([train] moments) is fine-tuned from its last, and the fine-tuned model
    is measured once."""
    train = TrainConfig(**meta["train"])
    model = meta["model"]
    batch, note = (batch_size, "") if batch_size else batch_size_for(train.batch_size, model["train_length"], length)
    tuned = dataclasses.replace(train, steps=steps, lr=lr or train.lr, batch_size=batch,
                                warmup_steps=warmup_for(train.warmup_steps, steps), decay_steps=0, moments=1)
    record = {"from": meta["variant"], "length": length, "steps": steps, "lr": tuned.lr, "batch_size": batch,
              "warmup_steps": tuned.warmup_steps, "data_offset": train.steps, "source_sha256": meta.get("sha256")}
    return tuned, record, note


def check_memory(spec: str, model: ModelConfig, train: TrainConfig, length: int, device: torch.device) -> None:
    """Training's memory check (resident.training_bytes) at the fine-tuning length, before any work."""
    shape = dataclasses.replace(model, position=spec, attention=train.attention, train_length=length)
    need = resident.training_bytes(shape, distributed.per_rank(train.batch_size), train.precision, device)
    memory.require(need, device, f"fine-tuning {spec} at {distributed.batch_text(train.batch_size)} x --length {length}",
                   "use a smaller --batch-size or --length")


def command_line(run_dir: Path, spec: str, seeds: list[int], record: dict[str, Any]) -> str:
    spec = f"{spec}@{record['form']}" if record.get("form") else spec
    return (f"relbench finetune --run-dir {run_dir} --length {record['length']} --steps {record['steps']} "
            f"--variants {spec} --seeds {' '.join(map(str, seeds))} --lr {record['lr']:g} "
            f"--batch-size {record['batch_size']}")


def record_entry(run_dir: Path, entry: str, seed: int, record: dict[str, Any]) -> None:
    """Add the fine-tuned checkpoint to config.json's "finetune" table and config.toml's header."""
    from relbench.config import read_file

    config = results.read_json(Path(run_dir) / results.CONFIG)
    table = config.setdefault("finetune", {})
    seeds = sorted(set(table.get(entry, {}).get("seeds", [])) | {seed})
    kept = {k: record[k] for k in ("from", "form", "length", "steps", "lr", "batch_size", "warmup_steps") if k in record}
    table[entry] = {**kept, "seeds": seeds, "command": command_line(run_dir, record["from"], seeds, record)}
    toml = Path(run_dir) / results.CONFIG_TOML
    description = read_file(toml).get("description", "") if toml.is_file() else ""
    runconfig.write_config(run_dir, config, description)


@dataclasses.dataclass(frozen=True)
class Plan:
    """One fine-tuning run of a `relbench finetune`: the variant named (`spec`, with its form if any),
    the checkpoint it writes (`entry`), the seed, the trained checkpoint's meta.json and model
    settings, the fine-tuning settings, their "finetune" record and the batch-size note."""
    spec: str
    entry: str
    seed: int
    meta: dict[str, Any]
    model: ModelConfig
    train: TrainConfig
    record: dict[str, Any]
    note: str


def finetune_run(run_dir: Path, length: int, steps: int, variants: list[str] | None, seeds: list[int] | None,
                 lr: float | None, batch_size: int | None, device: torch.device, force: bool,
                 console: Console) -> list[dict[str, Any]]:
    """Fine-tune every finished checkpoint named (or every one) at `length` for `steps` steps (see the
    module doc); returns the summaries. A finished fine-tuned checkpoint is kept unless `force`."""
    from relbench.data import load_run_splits

    run_dir = Path(run_dir)
    config = rundir.require_run(run_dir)
    if steps < 1 or (lr is not None and not lr > 0) or (batch_size is not None and batch_size < 1):
        raise UsageError("--steps, --lr and --batch-size must be positive")
    todo = distributed.on_main(pairs_to_tune, run_dir, config, variants, seeds, length, console)
    plans = [plan_for(spec, seed, meta, length, steps, lr, batch_size, device) for spec, seed, meta in todo]
    splits = load_run_splits(config, console)
    for plan in plans:
        checkpoints.check_tokenizer(rundir.checkpoint_dir(run_dir, forms.trained_spec(plan.spec), plan.seed),
                                    splits.tokenizer)
    console.print(f"fine-tuning {len(plans)} checkpoint(s) at length {length} for {steps} steps; run directory {run_dir}")
    with StopRequest() as stop, make_progress(console) as progress:
        return [finetune_one(run_dir, plan, length, steps, splits, device, force, stop, progress) for plan in plans]


def plan_for(spec: str, seed: int, meta: dict[str, Any], length: int, steps: int, lr: float | None,
             batch_size: int | None, device: torch.device) -> Plan:
    """The fine-tuning run of checkpoint `spec` seed `seed`, checked before any work: the attention
    backend can run the scheme on `device` and training at `length` fits in its memory."""
    model = ModelConfig(**meta["model"])
    train, record, note = settings(meta, length, steps, lr, batch_size)
    variant = forms.scheme_spec(spec)
    try:
        for cls in positions.parse(variant).schemes:
            check_backend(train.attention, cls, device, True)
    except UsageError as error:
        raise UsageError(f"{spec}: {error}") from None
    check_memory(variant, model, train, length, device)
    entry = forms.finetuned_spec(spec, length, trained_encoding(spec, model))
    if forms.form_text(entry):      # fine-tuned under a form, pinned at this length: part of the settings
        record["form"] = forms.form_text(entry)
    return Plan(spec, entry, seed, meta, model, train, record, note)


def finetune_one(run_dir: Path, plan: Plan, length: int, steps: int, splits: Splits, device: torch.device,
                 force: bool, stop: StopRequest, progress: Progress) -> dict[str, Any]:
    """Fine-tune one checkpoint as `plan` says, or keep it when it was fine-tuned already (unless
    `force`); write its checkpoint, its rows of finetune.csv and its entry in config.json; returns its
    summary. Out of memory and divergence end the command, the last resumable state kept."""
    spec, entry, seed, record, train = plan.spec, plan.entry, plan.seed, plan.record, plan.train
    label, folder = f"{entry} seed {seed}", rundir.checkpoint_dir(run_dir, entry, seed)
    done = distributed.on_main(checkpoints.read_meta, folder) or {}
    if done.get("finished") and not force:
        same = done.get("finetune") == record
        progress.console.print(f"{label}: already fine-tuned ({folder})" + ("" if same else
                               " with other settings") + "; --force fine-tunes it again", markup=False)
        return done["summary"]
    if force and distributed.is_main():
        (folder / checkpoints.RESUME_FILE).unlink(missing_ok=True)
    if plan.note:
        progress.console.print(f"{label}: {plan.note}", markup=False)
    weights = checkpoints.load_model(rundir.checkpoint_dir(run_dir, forms.trained_spec(spec), seed)).state_dict()
    start = Continuation(weights, length, record["data_offset"], record, form=entry if "form" in record else "")
    try:
        tuned, rows, summary = train_variant(forms.scheme_spec(spec), plan.model, train, splits, device, progress,
                                             folder, stop, start=start)
    except (RuntimeError, MemoryError) as error:
        if not memory.is_out_of_memory(error):
            raise
        raise RelbenchError(f"out of memory fine-tuning {label} at {distributed.batch_text(train.batch_size)} "
                            f"x --length {length} on {device}; the last resumable state is kept in {folder}; "
                            f"use a smaller --batch-size or --length") from None
    except Diverged as error:
        raise RelbenchError(f"{label} diverged ({error}); its last good state is kept in {folder}; try a "
                            f"lower --lr, or --force to start it again") from None
    tuned.config.attention = "auto"
    summary = {**summary, "variant": entry}
    new_meta = {**{k: plan.meta.get(k) for k in ("data", "tokenizer", "tokenizer_fingerprint")},
                "variant": entry, "seed": seed, "finished": True, "status": "finished", "summary": summary,
                "model": to_dict(tuned.config), "train": to_dict(train), "finetune": record}
    if distributed.is_main():
        append_rows(run_dir / FINETUNE_CSV, entry, seed, [{**r, "variant": entry, "length": length} for r in rows])
        checkpoints.save_checkpoint(folder, tuned, new_meta)
        record_entry(run_dir, entry, seed, record)
    progress.console.print(f"{label}: validation loss {summary['val_loss']:.4f} at length {length} after "
                           f"{steps} steps, {summary['train_seconds']:.0f} s", markup=False)
    return summary


def comparison_table(summary: pd.DataFrame, rows: pd.DataFrame,
                     protocol: str) -> tuple[list[str], list[list[str]]] | None:
    """Per fine-tuned entry: its variant's perplexity zero-shot and after fine-tuning, at each length
    (mean over seeds), as "zero-shot -> fine-tuned"; None when no fine-tuned entry was evaluated.
    `rows`: extrapolation.csv, whose finetune_steps column says how many steps each entry took."""
    mine = summary[summary["protocol"] == protocol]
    steps = rows.groupby("variant")["finetune_steps"].max() if "finetune_steps" in rows else {}
    entries = [v for v in mine["variant"].unique() if forms.finetune_length(v) is not None]
    if not entries:
        return None
    lengths = sorted(mine["length"].unique())
    cells = {(r.variant, r.length): f"{r.ppl_mean:.3f}" if r.status == "ok" else r.status for r in mine.itertuples()}
    body = []
    for entry in entries:
        # zero-shot: the same form on the trained checkpoint; for a pinned form ("pi:factor=4") that
        # exact form when it was evaluated, else the form with its defaults ("rope@pi")
        form, variant = forms.form_text(entry), forms.scheme_spec(entry)
        bases = [f"{variant}@{form}", f"{variant}@{form.partition(':')[0]}"] if form else [variant]
        base = next((b for b in bases if any((b, n) in cells for n in lengths)), bases[0])
        how = f"{forms.finetune_length(entry)}" + (f", {steps[entry]:g} steps" if entry in steps else "")
        body.append([base, how] + [
            f"{cells.get((base, n), '-')} -> {cells.get((entry, n), '-')}" for n in lengths])
    return ["variant", "fine-tuned at"] + [f"L={n} zero-shot -> fine-tuned" for n in lengths], body
