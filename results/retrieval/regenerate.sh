#!/usr/bin/env bash
# Regenerates results/retrieval: the retrieval preset (2 layers, d 128, trained 1,200 steps at length
# 128 on passkey trials built from the training text), every registered variant, seeds 0 1 2; passkey
# accuracy at 1x-64x the training length (128-8192) at five depths, and the copy-distance task.
# Run from the repository root; a stopped run resumes where it stopped.
set -euo pipefail
RUN=${RUN:-results/retrieval}
for seed in 0 1 2; do
  relbench train --preset retrieval --seeds "$seed" --run-dir "$RUN"
  relbench extrapolate --run-dir "$RUN" --seeds "$seed" --lengths 128 512 2048 8192 --task passkey copy
done
relbench report --run-dir "$RUN"
