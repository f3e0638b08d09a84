#!/usr/bin/env bash
# Regenerates results/reference: the quick preset, every registered variant, 3 seeds, lengths 1x-16x
# the training length (256), both evaluation protocols. Run from the repository root.
set -euo pipefail
RUN=${RUN:-results/reference}
for seed in 0 1 2; do   # one seed at a time: a stopped run keeps every finished seed
  relbench train --preset quick --seeds "$seed" --run-dir "$RUN"
  relbench extrapolate --run-dir "$RUN" --seeds "$seed" --lengths 256 512 1024 2048 4096 \
    --mode nonoverlap sliding --stride 512
done
relbench profile --run-dir "$RUN" --lengths 1024 4096 --attention auto
relbench inspect "$RUN"
relbench report --run-dir "$RUN"
