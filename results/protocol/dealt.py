"""The moments probe's runs as `[train] moments = K` would have written them, to be evaluated as relbench
evaluates that option: each cell's trials dealt among a seed's K moments (trial i of a condition to
moment i mod K), one model's evaluation cost, where `average_moments.py outputs` evaluated every moment
on every trial (K times the cost).

explore.py --moments K trains each (variant, seed) to its criterion and K - 1 checks past it at the
rate it had, the protocol of `[train] moments = K` (training/train.py), and writes the weights of each
moment into a run directory of its own (RUN/moment0 .. moment{K-1}). This folds them into one run
directory OUT: each learned checkpoint's model.pt is its last moment's, moment0.pt .. moment{K-2}.pt
the earlier ones', and meta.json records them with their sha256 and the run's config says moments = K,
as `relbench train` writes a run with that option; a seed that did not learn is copied as it is.

    python results/protocol/dealt.py results/protocol/moments/dealt results/protocol/moments/moment{0,1,2,3,4}
    relbench extrapolate --run-dir results/protocol/moments/dealt --task passkey
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from relbench.runs import checkpoints, results, runconfig


def moments_config(config: dict, count: int) -> dict:
    """A run's config (config.json's) with the moments option in place of explore.py's consolidation."""
    train = {**config["train"], "moments": count, "consolidate_steps": 0}
    return {**config, "train": train}


def fold(out: Path, moments: list[Path]) -> None:
    last = moments[-1]
    out.mkdir(parents=True, exist_ok=True)
    config = moments_config(results.read_json(last / results.CONFIG), len(moments))
    runconfig.write_config(out, config, f"retrieval, protocol dealt over {len(moments)} moments (results/protocol)")
    results.write_csv(out / "train.csv", results.read_csv(last / "train.csv"))
    for folder in sorted((last / "checkpoints").iterdir()):
        meta = checkpoints.read_meta(folder)
        if not (meta or {}).get("finished"):   # a run cut short: not a model
            continue
        there = out / "checkpoints" / folder.name
        there.mkdir(parents=True, exist_ok=True)
        shutil.copy(folder / checkpoints.MODEL_FILE, there / checkpoints.MODEL_FILE)
        if meta["summary"].get("learned"):
            for index, moment in enumerate(moments[:-1]):
                shutil.copy(moment / "checkpoints" / folder.name / checkpoints.MODEL_FILE,
                            there / checkpoints.MOMENT_FILE.format(index))
            steps = [checkpoints.read_meta(m / "checkpoints" / folder.name)["summary"]["steps"] for m in moments]
            meta = {**meta, "train": moments_config(meta, len(moments))["train"],
                    "summary": {**meta["summary"], "moments": steps},
                    "moments": checkpoints.moment_records(there, len(moments) - 1)}
        results.write_json(there / checkpoints.META_FILE, meta)


if __name__ == "__main__":
    fold(Path(sys.argv[1]), [Path(a) for a in sys.argv[2:]])
