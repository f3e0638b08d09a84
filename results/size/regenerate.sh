#!/usr/bin/env bash
# Regenerates results/size/d128: the retrieval preset's protocol (passkey, trained to criterion at length 128,
# read at 1x-64x) at d 128 instead of 64 (427k parameters instead of 115k: about 3.7x), the question of
# issue 45, section 4: do the tiers hold at another size? Run from the repository root.
#   SEEDS="0 1 2 3 4 5" VARIANTS="fox:bias_init=5 alibi kerple-log t5 xl rope" bash results/size/regenerate.sh
set -euo pipefail
RUN=${RUN:-results/size/d128}
SEEDS=${SEEDS:-0}
VARIANTS=${VARIANTS:-"alibi xl"}
CONFIG=$(mktemp --suffix=.toml)
printf 'preset = "retrieval"\n[model]\nd_model = 128\n' > "$CONFIG"
for seed in $SEEDS; do
  relbench train --config "$CONFIG" --seeds "$seed" --variants $VARIANTS --run-dir "$RUN"
  relbench extrapolate --run-dir "$RUN" --seeds "$seed" --variants $VARIANTS --task passkey
done
relbench report --run-dir "$RUN"
