#!/usr/bin/env bash
# Regenerates results/retrieval: the retrieval preset (2 layers, d 64, length 128, trained to criterion on
# passkey trials built from the training text: validation accuracy at 128 held at 95% for two checks in a
# row, up to 5,000 steps); passkey accuracy at 1x-64x the training length (128-8192), 5 depths x 14 trials.
# Run from the repository root; a stopped run resumes where it stopped (finished models are kept).
#   SEEDS="0 1 2" VARIANTS="alibi rope t5 xl" bash results/retrieval/regenerate.sh
# Two workers on a 2-core machine (one thread each, as committed): run two copies with RUN pointing at two
# folders and OMP_NUM_THREADS=1, then fold the second into the first with `relbench merge SECOND --run-dir FIRST`.
set -euo pipefail
RUN=${RUN:-results/retrieval}
SEEDS=${SEEDS:-0}              # e.g. SEEDS="0 1 2"
VARIANTS=${VARIANTS:-}         # e.g. VARIANTS="t5 alibi rope" (default: every registered variant)
CONFIG=${CONFIG:-}             # an experiment file in place of the preset (results/protocol's levers)
only=(); [ -n "$VARIANTS" ] && only=(--variants $VARIANTS)
setup=(--preset retrieval); [ -n "$CONFIG" ] && setup=(--config "$CONFIG")
for seed in $SEEDS; do   # one seed at a time: a stopped run keeps every finished seed
  relbench train "${setup[@]}" --seeds "$seed" "${only[@]}" --run-dir "$RUN"
  relbench extrapolate --run-dir "$RUN" --seeds "$seed" "${only[@]}" --task passkey
done
relbench report --run-dir "$RUN"
