#!/usr/bin/env bash
# Regenerates results/stacks: the layer stacks of the `stacks` preset (docs/variants.md, "Layouts") trained
# under results/reference's protocol (the quick preset: 4 layers, d 128, 400 steps at length 256, fp32), so
# that their rows stand beside its `rope` and `none`; perplexity (non-overlapping windows) and the copy task
# at 1x-16x. Run from the repository root; a stopped run resumes where it stopped.
#   SEEDS="0 1 2" bash results/stacks/regenerate.sh
set -euo pipefail
RUN=${RUN:-results/stacks}
SEEDS=${SEEDS:-0}
VARIANTS=("rope*3,none" "rope*3,none:temperature=llama4" "rope:chunk=256*3,none:temperature=llama4" "rope:window=128*3,none"
          "rope:base=150000,window=8,sinks=true*1,rope:base=150000,sinks=true" "rope:window=32*3,rope:base=1000000")
for seed in $SEEDS; do
  relbench train --preset quick --seeds "$seed" --variants "${VARIANTS[@]}" --run-dir "$RUN"
  relbench extrapolate --run-dir "$RUN" --seeds "$seed" --variants "${VARIANTS[@]}" --lengths 256 512 1024 2048 4096 \
    --task perplexity copy --mode nonoverlap --trials 8
done
relbench report --run-dir "$RUN"
# the retrieval forms (results/stacks/retrieval): two layers, the passkey panel's protocol
for seed in $SEEDS; do
  relbench train --preset retrieval --seeds "$seed" --variants "rope*1,none" "rope:window=32*1,none" "rope:chunk=128*1,none" \
    --run-dir "$RUN/retrieval"
  relbench extrapolate --run-dir "$RUN/retrieval" --seeds "$seed" --task passkey
done
relbench report --run-dir "$RUN/retrieval"
