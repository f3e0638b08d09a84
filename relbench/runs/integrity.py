"""`relbench verify`: what of a run directory can still be proven whole, and, with --repair, a new
checksum record for what passes.

A CSV is *verified* when its bytes match what checksums.json recorded when relbench wrote it, and a
finished checkpoint when its model.pt (and each moment's file, [train] moments) matches the sha256 in
its meta.json. A CSV with no usable record (checksums.json missing, damaged or silent about it) is
only *whole*: it ends with a complete line and every row has the header's number of fields; --repair
records it, and says that it did so on structure alone. A CSV that contradicts its record, or a
truncated one, is never recorded: restore it, or delete it and rerun the command that writes it.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from relbench.errors import RelbenchError
from relbench.runs import checkpoints, results

VERIFIED, WHOLE, DAMAGED = "verified", "whole, unrecorded", "damaged"


@dataclass(frozen=True)
class Finding:
    path: Path
    status: str           # VERIFIED, WHOLE or DAMAGED
    detail: str


def structure_problem(data: bytes) -> str | None:
    """Why a CSV's bytes are not a whole table, or None."""
    if not data:
        return "empty"
    if not data.endswith(b"\n"):
        return "its last line is cut short"
    try:
        rows = list(csv.reader(io.StringIO(data.decode("utf-8"))))
    except (UnicodeDecodeError, csv.Error) as error:
        return f"not a readable CSV ({type(error).__name__})"
    widths = {len(r) for r in rows[1:] if r}
    if widths - {len(rows[0])}:
        return f"rows of {sorted(widths - {len(rows[0])})} fields under a header of {len(rows[0])}"
    return None


def verify(run_dir: Path) -> tuple[list[Finding], dict]:
    """Every CSV and finished checkpoint of the run, with what can be said of it; and the checksum record
    (an empty one when it is damaged)."""
    run_dir = Path(run_dir)
    try:
        sums = results.read_checksums(run_dir / results.CHECKSUMS)
        damaged_record = None
    except RelbenchError:
        sums, damaged_record = {}, "checksums.json is damaged"
    findings = []
    for path in sorted(run_dir.glob("*.csv")):
        data = path.read_bytes()
        known = sums.get(path.name)
        if known is not None and results.sha256_bytes(data) in (known.get("current"), known.get("previous")):
            findings.append(Finding(path, VERIFIED, "matches its recorded checksum"))
            continue
        if known is not None:
            findings.append(Finding(path, DAMAGED, "changed or truncated after relbench wrote it (checksum mismatch)"))
            continue
        problem = structure_problem(data)
        why = damaged_record or ("no checksums.json" if not (run_dir / results.CHECKSUMS).is_file()
                                 else "not in checksums.json")
        findings.append(Finding(path, DAMAGED, problem) if problem else
                        Finding(path, WHOLE, f"{why}: whole by its structure, its content cannot be proven"))
    folder = run_dir / "checkpoints"
    for checkpoint in sorted(folder.iterdir()) if folder.is_dir() else []:
        if checkpoint.is_dir():
            problem = checkpoints.damage(checkpoint)
            findings.append(Finding(checkpoint, DAMAGED, problem) if problem
                            else Finding(checkpoint, VERIFIED, "its weights (model.pt, and any moments) match meta.json"))
    return findings, sums


def repair(run_dir: Path, findings: list[Finding], sums: dict) -> list[Path]:
    """A new checksums.json: the verified entries kept, the whole unrecorded CSVs added; returns those added."""
    added = [f.path for f in findings if f.status == WHOLE]
    record = {name: entry for name, entry in sums.items()
              if any(f.path.name == name and f.status == VERIFIED for f in findings)}
    for path in added:
        record[path.name] = {"current": results.sha256_bytes(path.read_bytes()), "previous": None}
    results.write_json(Path(run_dir) / results.CHECKSUMS, record)
    return added
