#!/usr/bin/env bash
# Regenerates results/mqar: the mqar preset (d 128, 2 layers, 2 heads, length 64, 8 key-value pairs among
# training text, trained to criterion: validation accuracy over 400 queries at 64 held at 95% for two checks
# in a row, up to 8,000 steps); MQAR accuracy at 1x-64x the training length (64-4096) by distance from pair
# to query, 14 trials x 5 depths x 8 queries = 560 queries per length.
# Run from the repository root; a stopped run resumes where it stopped (finished models are kept).
#   SEEDS="0 1 2" VARIANTS="t5 xl" bash results/mqar/regenerate.sh
# Two workers on a 2-core machine (one thread each, as committed): run two copies with RUN pointing at two
# folders and OMP_NUM_THREADS=1, then fold the second into the first with `relbench merge SECOND --run-dir FIRST`.
set -euo pipefail
RUN=${RUN:-results/mqar}
SEEDS=${SEEDS:-0}              # e.g. SEEDS="0 1 2"
VARIANTS=${VARIANTS:-}         # default: the variants of the committed result (below)
[ -z "$VARIANTS" ] && VARIANTS="alibi cope dape dynamic fire fox:bias_init=5 kerple-log kerple-power learned none
  rope sandwich shaw sinusoidal t5 t5-log2 transformer-xl xl xpos"
for seed in $SEEDS; do   # one seed at a time: a stopped run keeps every finished seed
  relbench train --preset mqar --seeds "$seed" --variants $VARIANTS --run-dir "$RUN"
  relbench extrapolate --run-dir "$RUN" --seeds "$seed" --variants $VARIANTS --task mqar
done
relbench report --run-dir "$RUN"
