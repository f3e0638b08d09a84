#!/usr/bin/env bash
# Regenerates results/bam: the retrieval preset's passkey protocol (2 layers, d 64, length 128, trained to
# criterion: 95% on 50 validation trials held for two checks, cap 5,000 steps) for the 2025 schemes beside
# alibi; passkey at 1x-64x (128-8192, 70 trials per length), bam also at 256x and 512x
# (32768, 65536: about 9 and 23 min of one core on the Xeon host); then the learned prior (prior.py).
# Run from the repository root; a stopped run resumes where it stopped.
#   SEEDS="0 1 2" bash results/bam/regenerate.sh   (committed: seeds 0-2 of bam, alibi, rope, hope, kerple-log, fire, t5,
#   xl and the two alibi:ssmax rows, seed 0 of the rest; kerple-log at 32768 in seeds 0-2, at 65536 in seeds 0 and 2;
#   bam, alibi, seed 0 of the SSMax rows and stick-breaking on an Intel Xeon, the rest on two AMD EPYC hosts: README)
set -euo pipefail
RUN=${RUN:-results/bam}
SEEDS=${SEEDS:-0}
VARIANTS=${VARIANTS:-"bam bam:ssmax=true alibi alibi:ssmax=true alibi:ssmax=true,ssmax_bias=false stickbreaking rope rope:random_positions=8192 hope kerple-log fox:bias_init=5 fire t5 xl rope:random_positions=512"}
for seed in $SEEDS; do
  relbench train --preset retrieval --seeds "$seed" --variants $VARIANTS --run-dir "$RUN"
  relbench extrapolate --run-dir "$RUN" --seeds "$seed" --variants $VARIANTS --task passkey
  relbench extrapolate --run-dir "$RUN" --seeds "$seed" --variants bam kerple-log --task passkey --lengths 32768 65536
  # the randomized model under its own protocol (the drawn form), and plain rope read the same way (the control)
  relbench extrapolate --run-dir "$RUN" --seeds "$seed" --variants "rope:random_positions=8192@drawn" "rope@drawn:limit=8192" --task passkey
  relbench extrapolate --run-dir "$RUN" --seeds "$seed" --variants "rope:random_positions=512@drawn" --task passkey --lengths 128 512
done
relbench report --run-dir "$RUN"
python results/bam/prior.py --run-dir "$RUN"
python results/bam/drawn.py --run-dir "$RUN"   # the randomized-positions models at ordinary and at drawn positions
