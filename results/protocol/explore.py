"""Protocol exploration for the decisive-comparisons issue: one training run gives several models.

Each (variant, seed) trains under the retrieval preset to its criterion; the weights at the step that
confirms it go into RUN/criterion (the protocol every committed result used), and the same run goes
on `--consolidate` steps with its rate decayed (train.consolidate_steps) into RUN/consolidated. Both
are ordinary run directories: `relbench extrapolate --task passkey` and `relbench report` read them,
and the two protocols are compared paired by seed on the same host, with the same batches.

    OMP_NUM_THREADS=1 python results/protocol/explore.py --run results/protocol/a \
        --variants alibi xl --seeds 0 1 2 3 4 --consolidate 500

With `--moments K` the run goes on (K - 1) checks past its criterion at the rate it had (no decay),
and the weights at the criterion and at each of those checks go into RUN/moment0 .. RUN/moment{K-1}:
the same seed measured at K moments, to tell how much of a scheme's spread over seeds is the moment a
run is stopped at (average_moments.py). `[train] moments = K` is the same training in relbench itself,
the K weight files kept in one checkpoint (dealt.py folds these folders into that form).

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


def protocols_of(args, base) -> tuple[dict, str]:
    """The protocols' train configs, and the one the run itself trains under (the longest)."""
    if args.moments:
        train = dataclasses.replace(base.train, consolidate_steps=(args.moments - 1) * base.train.eval_every,
                                    consolidate_lr_ratio=1.0)
        return {f"moment{i}": train for i in range(args.moments)}, f"moment{args.moments - 1}"
    return {"criterion": dataclasses.replace(base.train, consolidate_steps=0),
            "consolidated": dataclasses.replace(base.train, consolidate_steps=args.consolidate,
                                                consolidate_lr_ratio=args.ratio)}, "consolidated"


def at_snapshot(outcome: dict, snapshot: dict) -> dict:
    """The run as it stood at a snapshot: its weights, its rows up to that step, its summary then."""
    model = outcome["model"]
    model.load_state_dict(snapshot["weights"])
    rows = [r for r in outcome["rows"] if r["step"] <= snapshot["step"]]
    checked = [r for r in rows if r["val_accuracy"] == r["val_accuracy"]]   # not nan: a check
    summary = {**outcome["summary"], "steps": snapshot["step"], "consolidated_steps": snapshot["step"] - snapshot["from"],
               "val_accuracy": checked[-1]["val_accuracy"], "val_loss": checked[-1]["val_loss"]}
    return {"model": model, "rows": rows, "summary": summary}


def train_pair(args, spec: str, seed: int, protocols: dict, longest: str, model_config, configs, splits, device,
               console) -> None:
    """Train one (variant, seed) once and write each protocol's model: the longest the run's end, the
    others the snapshots taken at the criterion (and, with --moments, at each check after it)."""
    folders = {name: rundir.checkpoint_dir(args.run / name, spec, seed) for name in protocols}
    if all((checkpoints.read_meta(f) or {}).get("finished") for f in folders.values()):
        return
    snapshots: list[dict] = []
    held: dict = {}

    def keep(model, step):
        held["model"], held["from"] = model, step
        snapshots.append({"weights": copy.deepcopy(model.state_dict()), "step": step, "from": step})

    def at_check(row):   # a check after the criterion: one more moment
        if "model" in held and row["val_accuracy"] == row["val_accuracy"] and row["step"] > held["from"]:
            snapshots.append({"weights": copy.deepcopy(held["model"].state_dict()), "step": row["step"],
                              "from": held["from"]})

    config = dataclasses.replace(protocols[longest], seed=seed)
    model, rows, summary = train_variant(spec, model_config, config, splits, device, folder=folders[longest],
                                         on_learned=keep, on_row=at_check if args.moments else None)
    outcome = {"model": model, "rows": rows, "summary": summary}
    if summary["learned"] and len(snapshots) < len(protocols) - 1:   # resumed past a snapshot: it is gone
        raise SystemExit(f"{spec} seed {seed} was resumed after its criterion; its snapshots are lost: remove "
                         f"{folders[longest]} and train it again")
    finish_pair(args.run / longest, Pair(spec, seed, f"{spec} seed {seed} {longest}", folders[longest], config),
                outcome, configs[longest], splits, console)
    for index, name in enumerate(n for n in protocols if n != longest):
        # learned: the model at its snapshot (not learned: the run's end, as it is)
        moment = at_snapshot(outcome, snapshots[index]) if snapshots else outcome
        config = dataclasses.replace(protocols[name], seed=seed)
        finish_pair(args.run / name, Pair(spec, seed, f"{spec} seed {seed} {name}", folders[name], config),
                    moment, configs[name], splits, console)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--variants", nargs="+", required=True)
    parser.add_argument("--seeds", nargs="+", type=int, required=True)
    parser.add_argument("--consolidate", type=int, default=500)
    parser.add_argument("--ratio", type=float, default=0.1)
    parser.add_argument("--moments", type=int, default=0)
    parser.add_argument("--preset", default="retrieval")
    args = parser.parse_args()
    torch.set_num_threads(1)
    console = Console()
    device = torch.device("cpu")
    base = experiment(args.preset)
    splits = load_data(base.data, console)
    base.model.vocab_size = splits.tokenizer.vocab_size
    protocols, longest = protocols_of(args, base)
    configs = {}
    for name, train in protocols.items():
        exp = dataclasses.replace(base, train=train)
        configs[name] = runconfig.record_run(args.run / name, runconfig.run_config(exp, args.variants, args.seeds, splits),
                                           args.variants, args.seeds, device, f"{args.preset}, protocol {name}")
    model_config = ModelConfig(**configs[longest]["model"])
    for seed in args.seeds:           # seed-major: a run cut short still holds whole seeds
        for spec in args.variants:
            train_pair(args, spec, seed, protocols, longest, model_config, configs, splits, device, console)


if __name__ == "__main__":
    main()
