"""Passkey accuracy at the training length of the models trained with randomized positions
(VARIANT:random_positions=N), placed two ways: at the ordinary positions 0 .. L - 1 (what the criterion
check and every evaluation of relbench use) and at positions drawn as in training, a sorted random
subset of [0, N) per trial (what the official code of Ruoss et al. 2023 also does at test time).
Writes drawn.csv into the run directory.

    python results/bam/drawn.py --run-dir results/bam
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import relbench  # noqa: F401  (first: sets the OpenMP wait policy before torch loads)

# isort: split
import numpy as np
import pandas as pd
import torch

from relbench import positions
from relbench.data import load_splits
from relbench.runs import checkpoints
from relbench.stats import wilson
from relbench.tasks import passkey
from relbench.training.batches import random_positions

TRIALS_PER_DEPTH = 14        # 70 trials, as the evaluation's passkey cells
DRAW_SEED = 7                # the positions' generator (seeded by trial batch); not a training seed


class Drawn(torch.nn.Module):
    """The model with each batch's tokens placed at positions drawn from [0, limit)."""

    def __init__(self, model, limit: int):
        super().__init__()
        self.model, self.limit, self.calls = model, limit, 0

    def forward(self, tokens):
        self.calls += 1
        placed = random_positions(DRAW_SEED, self.calls, tokens.shape[0], tokens.shape[1], self.limit)
        return self.model(tokens, positions=placed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", type=Path, default=Path("results/bam"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    splits = load_splits()
    stream = splits.validation
    rows = []
    for folder in sorted((args.run_dir / "checkpoints").glob("*")):
        meta = checkpoints.read_meta(folder)
        if not meta or not meta.get("finished"):
            continue
        limit = positions.training_options(meta["variant"]).get("random_positions", 0)
        if not limit:
            continue
        model = checkpoints.load_model(folder)
        length = meta["model"]["train_length"]
        plan = passkey.trials(stream.size, length, list(passkey.TASK.axis_values), TRIALS_PER_DEPTH)
        for placement, scored in (("0 .. L-1", model), (f"drawn from [0, {limit})", Drawn(model, limit))):
            with torch.no_grad():
                correct = passkey.accuracy(scored, stream, plan, length, splits.tokenizer, "cpu")
            low, high = wilson(int(np.sum(correct)), len(correct))
            rows.append({"variant": meta["variant"], "seed": meta["seed"], "steps": meta["summary"]["steps"],
                         "length": length, "positions": placement, "trials": len(correct),
                         "accuracy": float(np.mean(correct)), "ci_low": low, "ci_high": high})
            print(json.dumps(rows[-1]))
    pd.DataFrame(rows).to_csv(args.run_dir / "drawn.csv", index=False)


if __name__ == "__main__":
    main()
