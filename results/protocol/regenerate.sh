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
# Moments (MOMENTS=K): each (variant, seed) trains to its criterion and K - 1 checks more at the rate it
# had; the weights at each of the K checks are protocols moment0 .. moment{K-1} (explore.py --moments),
# and two more are made from them: `outputs` (each seed's accuracy averaged over its K moments) and
# `weights` (one model per seed, the mean of its K moments' weights); average_moments.py says how much of
# the spread over seeds is the moment a run stops at; `dealt` is the same runs as `[train] moments = K`
# writes them, each cell's trials dealt among the moments (dealt.py).
#
# Two workers, one thread each, on a 2-core machine, then their run directories are merged.
set -euo pipefail
CONSOLIDATE=${CONSOLIDATE:-500}
SEEDS=${SEEDS:-"0 1 2 3 4 5"}
A=${A:-"alibi xl kerple-log"}
B=${B:-"t5 dynamic fox:bias_init=5"}
LEVER=${LEVER:-}
MOMENTS=${MOMENTS:-}
P=results/protocol
if [ -n "$MOMENTS" ]; then
  M=$P/moments
  OMP_NUM_THREADS=1 python $P/explore.py --run $M/w1 --variants $A --seeds $SEEDS --moments "$MOMENTS" &
  OMP_NUM_THREADS=1 python $P/explore.py --run $M/w2 --variants $B --seeds $SEEDS --moments "$MOMENTS" &
  wait
  moments=()
  for i in $(seq 0 $((MOMENTS - 1))); do
    for worker in w1 w2; do
      OMP_NUM_THREADS=1 relbench extrapolate --run-dir $M/$worker/moment$i --task passkey
    done
    relbench merge $M/w1/moment$i $M/w2/moment$i --run-dir $M/moment$i
    moments+=("$M/moment$i")
  done
  python $P/average_moments.py weights $M/weights "${moments[@]}"
  relbench extrapolate --run-dir $M/weights --task passkey
  python $P/average_moments.py outputs $M/outputs "${moments[@]}"
  python $P/dealt.py $M/dealt "${moments[@]}"     # as [train] moments = K writes them: trials dealt
  OMP_NUM_THREADS=1 relbench extrapolate --run-dir $M/dealt --task passkey
  for run in "${moments[@]}" $M/outputs $M/weights $M/dealt; do relbench report --run-dir "$run"; done
  python $P/analyse.py moment0=$M/moment0 outputs=$M/outputs dealt=$M/dealt weights=$M/weights \
    --pair=moment0,outputs --pair=moment0,dealt --pair=moment0,weights
  exit 0
fi
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
