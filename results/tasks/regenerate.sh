#!/usr/bin/env bash
# Regenerates results/tasks: each task of issue 49 under its preset (relbench/presets/flipflop.toml,
# tracking.toml, needles.toml), trained to criterion and evaluated at 1x-64x, one run directory per task.
# Run from the repository root; a stopped run resumes where it stopped (finished models are kept).
#   TASKS="flipflop" SEEDS="0 1" VARIANTS="alibi rope" bash results/tasks/regenerate.sh
# Two workers on a 2-core machine: two copies with ROOT pointing at two folders and OMP_NUM_THREADS=1,
# then `relbench merge SECOND/TASK --run-dir results/tasks/TASK` for each task.
set -euo pipefail
ROOT=${ROOT:-results/tasks}
TASKS=${TASKS:-"flipflop tracking needles"}
SEEDS=${SEEDS:-0}
VARIANTS=${VARIANTS:-"alibi rope t5 xl"}
for task in $TASKS; do
  for seed in $SEEDS; do   # one seed at a time: a stopped run keeps every finished seed
    relbench train --preset "$task" --seeds "$seed" --variants $VARIANTS --run-dir "$ROOT/$task"
    relbench extrapolate --run-dir "$ROOT/$task" --seeds "$seed" --variants $VARIANTS --task "$task"
  done
  relbench report --run-dir "$ROOT/$task"
done
