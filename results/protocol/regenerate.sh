#!/usr/bin/env bash
# Regenerates results/protocol: the decisive-comparisons issue's measurement of training protocols.
#
# Consolidation (the default): each (variant, seed) trains once under the retrieval preset to its
# criterion; the weights at the step that confirms it are the `criterion` protocol (every earlier
# committed result), and the same run goes on CONSOLIDATE steps with its rate decayed (cosine to 10% of
# the peak) for the `consolidated` protocol (explore.py). Both are evaluated on passkey at 1x-64x and
# compared paired by seed (analyse.py).
#
# A lever given by an experiment file (LEVER=heads8: results/protocol/heads8.toml, 8 heads of width 8):
# the criterion protocol under that file, one seed at a time, into results/protocol/$LEVER, then compared
# with the criterion panel above.
#
# Two workers, one thread each, on a 2-core machine, then their run directories are merged.
set -euo pipefail
CONSOLIDATE=${CONSOLIDATE:-500}
SEEDS=${SEEDS:-"0 1 2 3 4 5"}
A=${A:-"alibi xl kerple-log"}
B=${B:-"t5 dynamic fox:bias_init=5"}
LEVER=${LEVER:-}
P=results/protocol
if [ -n "$LEVER" ]; then
  for worker in "w1:$A" "w2:$B"; do   # results/retrieval's seed-major loop under the lever's file
    RUN="$P/$LEVER-${worker%%:*}" VARIANTS="${worker#*:}" CONFIG="$P/$LEVER.toml" SEEDS="$SEEDS" \
      OMP_NUM_THREADS=1 bash results/retrieval/regenerate.sh &
  done
  wait
  relbench merge "$P/$LEVER-w1" "$P/$LEVER-w2" --run-dir "$P/$LEVER"
  relbench report --run-dir "$P/$LEVER"
  python $P/analyse.py criterion=$P/criterion "$LEVER=$P/$LEVER" committed=results/retrieval --pair="criterion,$LEVER"
  exit 0
fi
OMP_NUM_THREADS=1 python $P/explore.py --run $P/w1 --variants $A --seeds $SEEDS --consolidate "$CONSOLIDATE" &
OMP_NUM_THREADS=1 python $P/explore.py --run $P/w2 --variants $B --seeds $SEEDS --consolidate "$CONSOLIDATE" &
wait
for protocol in criterion consolidated; do
  for worker in w1 w2; do
    OMP_NUM_THREADS=1 relbench extrapolate --run-dir $P/$worker/$protocol --task passkey
  done
  relbench merge $P/w1/$protocol $P/w2/$protocol --run-dir $P/$protocol
  relbench report --run-dir $P/$protocol
done
python $P/analyse.py criterion=$P/criterion consolidated=$P/consolidated
