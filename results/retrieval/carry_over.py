"""Carry this folder's finished runs over to a new version of the retrieval preset, keeping only the
runs the new preset would have trained identically, and dropping the others (checkpoint and rows) so
that `relbench train` trains them again.

A run is kept when every training setting but the cap and the position learning-rate multipliers
is the same, its own multiplier is the one the new preset gives its variant (or it has no position
parameters, so that no multiplier plays a part), and it learned before its cap (at a constant rate
the cap plays no part before the stop) or the cap is the same (a run that did not learn is then
the new preset's run too). config.json then records the new preset.

    python results/retrieval/carry_over.py [results/retrieval]
"""

import shutil
import sys
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from relbench import config as C
from relbench.runs import results, runconfig, rundir
from relbench.tasks import TASKS
from relbench.training.step import position_lr

run = Path(sys.argv[1] if len(sys.argv) > 1 else "results/retrieval")
old = rundir.require_run(run)
found = C.experiment(old["preset"])
new_train = found.train
new = asdict(new_train)
free = {"steps", "position_lr_scale", "position_lr_scales", "seed"}
assert new["min_lr_ratio"] == 1.0 and old["train"]["min_lr_ratio"] == 1.0, "the cap sets the rate of a decaying schedule"
changed = sorted(k for k in new if k not in free and old["train"].get(k) != new[k])
assert not changed, f"the new preset changes {changed}: every run must be trained again"

kept, dropped = [], []
for folder in sorted((run / "checkpoints").iterdir()):
    meta = results.read_json(folder / "meta.json") if (folder / "meta.json").is_file() else {}
    summary = meta.get("summary", {})
    same_rate = summary.get("position_params") == 0 or summary.get("position_lr_scale") == position_lr(
        meta.get("variant", ""), new_train)[0]
    same_cap = old["train"].get("steps") == new["steps"]
    if meta.get("finished") and (summary.get("learned") or same_cap) and same_rate:
        kept.append((meta["variant"], int(meta["seed"])))
    else:
        dropped.append(folder.name)
        shutil.rmtree(folder)
for name in ("train.csv", TASKS["passkey"].csv, TASKS["mqar"].csv, "attention.csv"):
    if (run / name).is_file():
        table = results.read_csv(run / name)
        keep = pd.Series([(v, int(s)) in kept for v, s in zip(table["variant"], table["seed"])], index=table.index)
        results.write_csv(run / name, table[keep])
config = dict(old)
config["train"] = {k: v for k, v in new.items() if k != "seed"}
config["variants"] = [v for v in old["variants"] if any(v == k for k, _ in kept)]
config["seeds"] = sorted({s for _, s in kept})
runconfig.write_config(run, config, found.description)
print(f"kept {len(kept)} runs: {kept}\ndropped {len(dropped)}: {dropped}")
