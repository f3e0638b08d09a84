#!/usr/bin/env bash
# Regenerates results/reference: the quick preset (4 layers, d 128, trained 400 steps at length 256 in
# fp32, each variant at its tuned position learning rate), every registered variant, seeds 0 1 2;
# perplexity at 1x-16x the training length (256-4096) in both protocols, the copy-distance task, and
# passkey retrieval at the training length only (these language models do not retrieve even there:
# results/retrieval holds models that do, tested to 64x).
# Run from the repository root; a stopped run resumes where it stopped.
set -euo pipefail
RUN=${RUN:-results/reference}
SEEDS=${SEEDS:-0 1 2}          # e.g. SEEDS=0 for one seed
VARIANTS=${VARIANTS:-}         # e.g. VARIANTS="t5 alibi rope" (default: every registered variant)
# the seven 2025 rows (committed, seeds 0-2, AMD host: README) were made with
#   VARIANTS='bam bam:ssmax=true alibi:ssmax=true alibi:ssmax=true,ssmax_bias=false stickbreaking hope rope:random_positions=1024'
only=(); [ -n "$VARIANTS" ] && only=(--variants $VARIANTS)
for seed in $SEEDS; do   # one seed at a time: a stopped run keeps every finished seed
  relbench train --preset quick --seeds "$seed" "${only[@]}" --run-dir "$RUN"
  relbench extrapolate --run-dir "$RUN" --seeds "$seed" "${only[@]}" --lengths 256 512 1024 2048 4096 \
    --task perplexity copy --mode nonoverlap sliding --stride 512 --trials 8
  relbench extrapolate --run-dir "$RUN" --seeds "$seed" "${only[@]}" --lengths 256 --task passkey --trials 4
done
relbench profile --run-dir "$RUN" --lengths 1024 4096 --attention auto
relbench inspect "$RUN"
relbench report --run-dir "$RUN"
