#!/usr/bin/env bash
# Regenerates results/retrieval: the retrieval preset (2 layers, d 128, trained 1,200 steps at length
# 128 on passkey trials built from the training text), every registered variant, seeds 0 1 2; passkey
# accuracy at 1x-64x the training length (128-8192) at five depths, and the copy-distance task.
# Run from the repository root; a stopped run resumes where it stopped.
set -euo pipefail
RUN=${RUN:-results/retrieval}
SEEDS=${SEEDS:-0 1 2}          # e.g. SEEDS=0 for one seed
VARIANTS=${VARIANTS:-}         # e.g. VARIANTS="t5 alibi rope" (default: every registered variant)
only=(); [ -n "$VARIANTS" ] && only=(--variants $VARIANTS)
for seed in $SEEDS; do
  relbench train --preset retrieval --seeds "$seed" "${only[@]}" --run-dir "$RUN"
  relbench extrapolate --run-dir "$RUN" --seeds "$seed" "${only[@]}" --lengths 128 512 2048 8192 --task passkey copy
done
relbench report --run-dir "$RUN"
