"""Fold a second worker's run folder into this one (same configuration): its checkpoints are copied,
its rows of train.csv and passkey.csv/mqar.csv added (a row with the same key is replaced), and
`relbench train` then records its variants and seeds in config.json without training anything
(every checkpoint it names is finished).

    python results/retrieval/merge.py SECOND_RUN [results/retrieval]
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

from relbench.runs import results
from relbench.tasks import TASKS

PASSKEY_KEY, MQAR_KEY = list(TASKS["passkey"].key), list(TASKS["mqar"].key)

source, target = Path(sys.argv[1]), Path(sys.argv[2] if len(sys.argv) > 2 else "results/retrieval")
mine, theirs = results.require_run(target), results.require_run(source)
assert results.differences(mine, theirs) == [], results.differences(mine, theirs)
for folder in (source / "checkpoints").iterdir():
    if (folder / "meta.json").is_file() or any(folder.iterdir()):
        shutil.copytree(folder, target / "checkpoints" / folder.name, dirs_exist_ok=True)
for name, key in (("train.csv", ["variant", "seed", "step"]), ("passkey.csv", PASSKEY_KEY), ("mqar.csv", MQAR_KEY)):
    if (source / name).is_file():
        new = results.read_csv(source / name)
        old = results.read_csv(target / name) if (target / name).is_file() else new.iloc[:0]
        both = pd.concat([old, new], ignore_index=True).drop_duplicates(key, keep="last")
        results.write_csv(target / name, both)
pairs = sorted({(v, int(s)) for v, s in zip(results.read_csv(source / "train.csv")["variant"],
                                            results.read_csv(source / "train.csv")["seed"])})
for seed in sorted({s for _, s in pairs}):
    variants = [v for v, s in pairs if s == seed]
    subprocess.run(["relbench", "train", "--preset", theirs["preset"], "--variants", *variants, "--seeds", str(seed),
                    "--run-dir", str(target)], check=True)
