"""How much of a scheme's spread over seeds is the moment a run is stopped at (explore.py --moments K).

Each seed of a scheme was measured at K moments of one run: its criterion and the K - 1 checks after
it, 100 steps apart at the rate it had. Per family (each length beyond training, and the mean over
them), pooled over the schemes' learned seeds:

- *sd over moments*: the sd of one seed's K values around that seed's own mean;
- *sd over seeds, one moment*: the sd of the seeds' values at one moment (each moment's, pooled);
- *sd over seeds, averaged*: the sd of the seeds' means over their K moments.

If the seeds differed only by the moment, averaging K moments would divide the sd over seeds by
sqrt(K); if only by the seed, it would not move it. The averaged protocol is also written as a run
directory (OUT): each cell's trials and correct answers summed over the moments, so analyse.py and
`relbench report` read it as any other.

    python results/protocol/average_moments.py outputs results/protocol/moments/outputs \
        results/protocol/moments/moment0 results/protocol/moments/moment1 ...

`weights` in place of `outputs` averages the K moments' weights instead (one model per seed, what a
training option could ship without evaluating K models): OUT is a run directory of those models, for
`relbench extrapolate --task passkey` and analyse.py.
"""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

import pandas as pd
import torch

from relbench import comparisons as cmp
from relbench import stats
from relbench.evaluation import decisions, reach
from relbench.runs import checkpoints, results, rundir

TASK, TRAIN_LENGTH = "passkey", 128


def averaged_run(out: Path, moments: list[Path]) -> None:
    """OUT: moment 0's config and training record, and every cell's trials summed over the moments."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "config.toml"):
        if (moments[0] / name).is_file():
            shutil.copy(moments[0] / name, out / name)
    results.write_csv(out / "train.csv", results.read_csv(moments[0] / "train.csv"))
    rows = pd.concat([results.read_csv(m / f"{TASK}.csv") for m in moments], ignore_index=True)
    rows = rows[rows["status"] == "ok"]
    key = [c for c in rows.columns if c not in ("trials", "correct", "accuracy", "acc_low", "acc_high", "message")]
    cells = rows.groupby(key, dropna=False, as_index=False)[["trials", "correct"]].sum()
    cells["accuracy"] = cells["correct"] / cells["trials"]
    bounds = [stats.wilson(c, t) for c, t in zip(cells["correct"], cells["trials"])]
    cells["acc_low"], cells["acc_high"] = [b[0] for b in bounds], [b[1] for b in bounds]
    cells["message"] = ""
    results.write_csv(out / f"{TASK}.csv", cells)


def weights_run(out: Path, moments: list[Path]) -> None:
    """OUT: a run directory whose model for each (variant, seed) every moment holds is the mean of the
    moments' weights (float tensors; the rest as the last moment has them), with the last moment's
    config, training record and meta (the run that trained longest)."""
    last = moments[-1]
    out.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "config.toml"):
        shutil.copy(last / name, out / name)
    results.write_csv(out / "train.csv", results.read_csv(last / "train.csv"))
    for folder in sorted((last / "checkpoints").iterdir()):
        meta = checkpoints.read_meta(folder)
        if not (meta or {}).get("finished"):
            continue
        states = [torch.load(m / "checkpoints" / folder.name / checkpoints.MODEL_FILE, weights_only=True)
                  for m in moments]
        mean = {k: torch.stack([s[k] for s in states]).mean(0) if v.is_floating_point() else v
                for k, v in states[-1].items()}
        meta = {k: v for k, v in meta.items() if k != "sha256"}
        checkpoints.save_checkpoint(rundir.checkpoint_dir(out, meta["variant"], meta["seed"]), mean, meta)


def decomposition(moments: list[Path], averaged: Path) -> None:
    """The table of the module's docstring, with the between-scheme sd beside it."""
    decided = [decisions.decide(reach.run_reach(m, f"{TASK}.csv"), TASK, TRAIN_LENGTH) for m in moments]
    found = reach.run_reach(averaged, f"{TASK}.csv")
    mean = decisions.decide(found, TASK, TRAIN_LENGTH)
    print(f"{len(moments)} moments")
    print("family | sd over moments (one seed) | sd over seeds, one moment | sd over seeds, averaged | "
          "sd between schemes, one moment | averaged | decided, moment 0 | averaged")
    for key, family in mean.families.items():
        per = [d.families[key].values for d in decided if key in d.families]
        learned = {(v, s) for v, seeds in per[0].items() for s in seeds}
        # one "scheme" per run: its moments' values, so spread's pooled within is the sd over moments
        over_moments = {f"{v} {s}": dict(enumerate(p[v][s] for p in per if s in p.get(v, {}))) for v, s in learned}
        one = [cmp.spread(p)[0] for p in per]
        between = [cmp.spread(p)[1] for p in per]
        label = "mean beyond" if key == decisions.SUMMARY else f"{key // TRAIN_LENGTH}x"
        within_avg, between_avg = cmp.spread(family.values)
        print(f"{label} | {cmp.spread(over_moments)[0]:.3f} | {sum(one) / len(one):.3f} | {within_avg:.3f} | "
              f"{sum(between) / len(between):.3f} | {between_avg:.3f} | {decided[0].families[key].decided:.0%} | "
              f"{family.decided:.0%}")
    for v, r in sorted(found.items()):
        seeds = r.learned_seeds
        cells = [f"{n // TRAIN_LENGTH}x " + "/".join(f"{r.per_seed[s].get(n, math.nan):.0%}" for s in seeds)
                 for n in mean.beyond]
        print(f"  {v} averaged, seeds {seeds}: " + "; ".join(cells))


def main(argv: list[str]) -> None:
    mode, out, moments = argv[0], Path(argv[1]), [Path(a) for a in argv[2:]]
    if mode == "weights":
        weights_run(out, moments)
        return
    averaged_run(out, moments)
    decomposition(moments, out)


if __name__ == "__main__":
    main(sys.argv[1:])
