"""Protocol exploration for the decisive-comparisons issue: one training run gives two models.

Each (variant, seed) trains under the retrieval preset to its criterion; the weights at the step that
confirms it go into RUN/criterion (the protocol every committed result used), and the same run goes
on `--consolidate` steps with its rate decayed (train.consolidate_steps) into RUN/consolidated. Both
are ordinary run directories: `relbench extrapolate --task passkey` and `relbench report` read them,
and the two protocols are compared paired by seed on the same host, with the same batches.

    OMP_NUM_THREADS=1 python results/protocol/explore.py --run results/protocol/a \
        --variants alibi xl --seeds 0 1 2 3 4 --consolidate 500

Two of these side by side (one thread each) on a 2-core machine; `relbench merge` folds them.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
from pathlib import Path

import torch
from rich.console import Console

from relbench.config import ModelConfig, experiment
from relbench.data import load_data
from relbench.runs import checkpoints, runconfig, rundir
from relbench.training.pairs import Pair, finish_pair
from relbench.training.train import train_variant


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--variants", nargs="+", required=True)
    parser.add_argument("--seeds", nargs="+", type=int, required=True)
    parser.add_argument("--consolidate", type=int, default=500)
    parser.add_argument("--ratio", type=float, default=0.1)
    parser.add_argument("--preset", default="retrieval")
    args = parser.parse_args()
    torch.set_num_threads(1)
    console = Console()
    device = torch.device("cpu")
    base = experiment(args.preset)
    splits = load_data(base.data, console)
    base.model.vocab_size = splits.tokenizer.vocab_size
    protocols = {"criterion": dataclasses.replace(base.train, consolidate_steps=0),
                 "consolidated": dataclasses.replace(base.train, consolidate_steps=args.consolidate,
                                                     consolidate_lr_ratio=args.ratio)}
    configs = {}
    for name, train in protocols.items():
        exp = dataclasses.replace(base, train=train)
        configs[name] = runconfig.record_run(args.run / name, runconfig.run_config(exp, args.variants, args.seeds, splits),
                                           args.variants, args.seeds, device, f"{args.preset}, protocol {name}")
    model_config = ModelConfig(**configs["consolidated"]["model"])
    for seed in args.seeds:           # seed-major: a run cut short still holds whole seeds
        for spec in args.variants:
            folders = {name: rundir.checkpoint_dir(args.run / name, spec, seed) for name in protocols}
            if all((checkpoints.read_meta(f) or {}).get("finished") for f in folders.values()):
                continue
            snapshot: dict = {}

            def keep(model, step, snapshot=snapshot):
                snapshot["weights"] = copy.deepcopy(model.state_dict())
                snapshot["step"] = step

            config = dataclasses.replace(protocols["consolidated"], seed=seed)
            model, rows, summary = train_variant(spec, model_config, config, splits, device,
                                                 folder=folders["consolidated"], on_learned=keep)
            model.config.attention = "auto"
            finish_pair(args.run / "consolidated", Pair(spec, seed, f"{spec} seed {seed} consolidated",
                                                       folders["consolidated"], config),
                        {"model": model, "rows": rows, "summary": summary}, configs["consolidated"], splits, console)
            if "weights" in snapshot:      # learned: the model as the criterion protocol stops it
                model.load_state_dict(snapshot["weights"])
                rows = [r for r in rows if r["step"] <= snapshot["step"]]
                checked = [r for r in rows if r["val_accuracy"] == r["val_accuracy"]]   # not nan: a check
                summary = {**summary, "steps": snapshot["step"], "consolidated_steps": 0,
                           "val_accuracy": checked[-1]["val_accuracy"], "val_loss": checked[-1]["val_loss"]}
            config = dataclasses.replace(protocols["criterion"], seed=seed)
            finish_pair(args.run / "criterion", Pair(spec, seed, f"{spec} seed {seed} criterion", folders["criterion"],
                                                     config),
                        {"model": model, "rows": rows, "summary": summary}, configs["criterion"], splits, console)


if __name__ == "__main__":
    main()
