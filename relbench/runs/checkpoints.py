"""Checkpoints: a finished model, and the state to resume an interrupted training.

    checkpoints/<variant>-seed<s>/model.pt    weights of the finished model (a plain state dict)
    checkpoints/<variant>-seed<s>/meta.json   config, tokenizer, summary, status, sha256 of model.pt
    checkpoints/<variant>-seed<s>/resume.pt   model + optimiser state, step, loss-curve rows (while training)
    checkpoints/<variant>-seed<s>/moment<i>.pt the weights at the run's earlier moments ([train] moments:
                                              model.pt is the last; meta.json lists each with its sha256)

Everything is loaded with torch's safe loader (`weights_only=True`: tensors and plain containers,
no arbitrary pickle). A file that is truncated, corrupt or does not match its recorded checksum
is reported with its path and never used.
"""

from __future__ import annotations

import io
import shlex
from pathlib import Path
from typing import Any

import torch

from relbench.errors import RelbenchError
from relbench.runs.results import atomic_write_bytes, read_json, sha256_bytes, write_json

MODEL_FILE = "model.pt"
META_FILE = "meta.json"
RESUME_FILE = "resume.pt"
MOMENT_FILE = "moment{}.pt"


def _tensor_bytes(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _cpu_state(module: torch.nn.Module | dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    state = module if isinstance(module, dict) else module.state_dict()
    return {k: v.detach().cpu() for k, v in state.items()}


def save_checkpoint(folder: Path, model: torch.nn.Module | dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Weights (a model, or its state dict) and meta.json, each written atomically; meta last and
    carrying the weights' sha256, so a checkpoint whose meta says finished always has exactly those weights."""
    data = _tensor_bytes(_cpu_state(model))
    atomic_write_bytes(Path(folder) / MODEL_FILE, data)
    write_json(Path(folder) / META_FILE, {**meta, "sha256": sha256_bytes(data)})
    (Path(folder) / RESUME_FILE).unlink(missing_ok=True)  # the finished model supersedes it


def save_moment(folder: Path, index: int, model: torch.nn.Module) -> None:
    """The weights of a run's moment `index` (not its last: that is model.pt), written as they are taken,
    so a run resumed after them still has them."""
    atomic_write_bytes(Path(folder) / MOMENT_FILE.format(index), _tensor_bytes(_cpu_state(model)))


def clear_moments(folder: Path) -> None:
    """Remove the moment files of an earlier run (a run trained again from step 0 takes its own)."""
    for path in Path(folder).glob(MOMENT_FILE.format("*")):
        path.unlink()


def moment_records(folder: Path, count: int) -> list[dict[str, str]]:
    """meta.json's record of a finished run's `count` earlier moments: each file with its sha256."""
    out = []
    for index in range(count):
        name = MOMENT_FILE.format(index)
        try:
            out.append({"file": name, "sha256": sha256_bytes((Path(folder) / name).read_bytes())})
        except OSError as error:
            raise RelbenchError(f"moment {index} of {folder} cannot be read ({error.strerror}); its run must be "
                                f"trained again: `{retrain_command(folder)}`") from None
    return out


def _weight_files(meta: dict[str, Any]) -> list[tuple[str, str | None]]:
    """A finished checkpoint's weight files, earlier moments first, each with its recorded sha256."""
    return [(m["file"], m.get("sha256")) for m in meta.get("moments", [])] + [(MODEL_FILE, meta.get("sha256"))]


def damage(folder: Path) -> str | None:
    """What is wrong with a checkpoint folder's files, or None when they hold together: a finished
    checkpoint's model.pt must match the sha256 its meta.json records."""
    try:
        meta = read_meta(folder)
    except RelbenchError as error:
        return str(error)
    if meta is None or not meta.get("finished"):
        return None
    for name, recorded in _weight_files(meta):
        path = Path(folder) / name
        try:
            data = path.read_bytes()
        except OSError as error:
            return f"checkpoint {path} cannot be read ({error.strerror})"
        if recorded and sha256_bytes(data) != recorded:
            return f"checkpoint {path} is corrupt or truncated (checksum mismatch)"
    return None


def write_status(folder: Path, meta: dict[str, Any]) -> None:
    """meta.json for a variant that did not finish (it keeps any resume.pt beside it)."""
    write_json(Path(folder) / META_FILE, meta)


def read_meta(folder: Path) -> dict[str, Any] | None:
    path = Path(folder) / META_FILE
    if not path.is_file():
        return None
    meta = read_json(path)
    if not isinstance(meta, dict):
        raise RelbenchError(f"{path} is not a relbench checkpoint description; delete {folder} and retrain it")
    return meta


def check_tokenizer(folder: Path, tokenizer) -> None:
    """Refuse a checkpoint trained with another tokenizer than the run's `tokenizer` (its token ids would
    mean other text). Checkpoints from before the tokenizer was recorded were trained on bytes."""
    meta = read_meta(folder) or {}
    name, fingerprint = meta.get("tokenizer", "bytes"), meta.get("tokenizer_fingerprint")
    if name != tokenizer.name:
        raise RelbenchError(f"checkpoint {folder} was trained with tokenizer {name}, but its run reads "
                            f"{tokenizer.name}; evaluate it in a run directory trained with {name}")
    if fingerprint is not None and fingerprint != tokenizer.fingerprint:
        raise RelbenchError(f"checkpoint {folder} was trained with {fingerprint}, but {name} is now "
                            f"{tokenizer.fingerprint} (its cached copy was rebuilt differently); retrain it with "
                            f"`{retrain_command(folder, meta)}`")


def _safe_load(path: Path, what: str, fix: str, data: bytes | None = None) -> Any:
    """torch's safe loader on `path`, or on `data` (the bytes already read from it and verified, so
    what is loaded is exactly what was checked, not a second read of a file that may have changed)."""
    try:
        return torch.load(path if data is None else io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as error:  # truncated zip, wrong format, refused unpickling: all mean unusable
        raise RelbenchError(f"{what} {path} is corrupt or unreadable ({type(error).__name__}); {fix}") from None


def retrain_command(folder: Path, meta: dict[str, Any] | None = None) -> str:
    """The command that trains the checkpoint in `folder` again, as it can be typed: its run directory,
    the run's own settings (config.toml beside config.json), its variant and seed, --force."""
    meta = (read_meta(folder) if meta is None else meta) or {}
    run_dir = Path(folder).parent.parent
    return (f"relbench train --run-dir {shlex.quote(str(run_dir))} --config "
            f"{shlex.quote(str(run_dir / 'config.toml'))} --variants {shlex.quote(str(meta.get('variant', '?')))} "
            f"--seeds {meta.get('seed', 0)} --force")


def _meta_to_load(folder: Path) -> dict[str, Any]:
    meta = read_meta(folder)
    if meta is None:
        raise RelbenchError(f"no checkpoint in {folder}; run `relbench train` for this variant")
    return meta


def _load_weights(folder: Path, meta: dict[str, Any], name: str, recorded: str | None, device: torch.device | str):
    """The GPT of weight file `name` in `folder` (meta.json's `meta`), checked against the sha256 `recorded`."""
    from relbench.config import ModelConfig
    from relbench.model import GPT

    path = Path(folder) / name
    fix = f"retrain it with `{retrain_command(folder, meta)}`"
    try:
        data = path.read_bytes()
    except OSError as error:
        raise RelbenchError(f"checkpoint {path} cannot be read ({error.strerror}); {fix}") from None
    if recorded and sha256_bytes(data) != recorded:
        raise RelbenchError(f"checkpoint {path} is corrupt or truncated (checksum mismatch); {fix}")
    state = _safe_load(path, "checkpoint", fix, data)
    try:
        model = GPT(ModelConfig(**meta["model"]))
        model.load_state_dict(state)
    except (RuntimeError, TypeError, KeyError) as error:
        raise RelbenchError(f"checkpoint {path} does not match its config ({str(error).splitlines()[0]}); {fix}") from None
    return model.to(device).eval()


def load_model(folder: Path, device: torch.device | str = "cpu"):
    """The GPT saved in `folder`, on `device`, in eval mode, after checking it against meta.json."""
    meta = _meta_to_load(folder)
    return _load_weights(folder, meta, MODEL_FILE, meta.get("sha256"), device)


def load_moments(folder: Path, device: torch.device | str = "cpu") -> list:
    """Every moment of the run saved in `folder` ([train] moments), earlier first, each checked against
    meta.json (read once): [its model.pt] for a run measured at one moment."""
    meta = _meta_to_load(folder)
    return [_load_weights(folder, meta, name, recorded, device) for name, recorded in _weight_files(meta)]


def save_resume(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Everything needed to continue training exactly where it stopped: weights, optimiser moments
    and step counts, the step reached, and the loss-curve rows so far. (Batches and the learning-rate
    schedule are functions of the step, so no data position or RNG state beyond the step is needed.)"""
    payload = {"model": _cpu_state(model), "optimizer": optimizer.state_dict(), "state": state}
    atomic_write_bytes(Path(folder) / RESUME_FILE, _tensor_bytes(payload))


def load_resume(folder: Path) -> dict[str, Any] | None:
    path = Path(folder) / RESUME_FILE
    if not path.is_file():
        return None
    payload = _safe_load(path, "resume checkpoint", "delete it to restart this variant from step 0")
    if not isinstance(payload, dict) or not {"model", "optimizer", "state"} <= set(payload):
        raise RelbenchError(f"resume checkpoint {path} is incomplete; delete it to restart this variant from step 0")
    return payload
