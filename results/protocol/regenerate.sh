#!/usr/bin/env bash
# Regenerates results/protocol: the decisive-comparisons issue's measurement of training protocols.
# Each (variant, seed) trains once under the retrieval preset to its criterion; the weights at the step
# that confirms it are the `criterion` protocol (every earlier committed result), and the same run goes on
# CONSOLIDATE steps with its rate decayed (cosine to 10% of the peak) for the `consolidated` protocol
# (explore.py). Both are evaluated on passkey at 1x-64x and compared paired by seed (analyse.py).
# Two workers, one thread each, on a 2-core machine (the committed figures: a 2-core Intel Xeon with
# AVX-512-BF16 and AMX), then their run directories are merged per protocol.
set -euo pipefail
CONSOLIDATE=${CONSOLIDATE:-500}
SEEDS=${SEEDS:-"0 1 2 3 4 5"}
A=${A:-"alibi xl kerple-log"}
B=${B:-"t5 dynamic fox:bias_init=5"}
OMP_NUM_THREADS=1 python results/protocol/explore.py --run results/protocol/w1 --variants $A --seeds $SEEDS \
  --consolidate "$CONSOLIDATE" &
OMP_NUM_THREADS=1 python results/protocol/explore.py --run results/protocol/w2 --variants $B --seeds $SEEDS \
  --consolidate "$CONSOLIDATE" &
wait
for protocol in criterion consolidated; do
  for worker in w1 w2; do
    OMP_NUM_THREADS=1 relbench extrapolate --run-dir results/protocol/$worker/$protocol --task passkey
  done
  relbench merge results/protocol/w1/$protocol results/protocol/w2/$protocol --run-dir results/protocol/$protocol
  relbench report --run-dir results/protocol/$protocol
done
python results/protocol/analyse.py criterion=results/protocol/criterion consolidated=results/protocol/consolidated
