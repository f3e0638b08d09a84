#!/usr/bin/env bash
# Regenerates results/bam-mqar: the mqar preset unchanged (d 128, 2 layers, 2 heads, length 64, 8 key-value
# pairs among training text, trained to criterion: validation accuracy over 400 queries at 64 held at 95% for
# two checks in a row, up to 8,000 steps) for BAM beside the schemes it is measured against, every run on one
# host; MQAR accuracy at 1x-64x (64-4096) and at 256x and 512x (16384, 32768: bam about 2.2 and 8 s per trial,
# 2.5 and 9.5 min of one core per length on the AMD EPYC host; bam:ssmax=true three to four times that),
# 14 trials x 5 depths x 8 queries per length.
# Run from the repository root; a stopped run resumes where it stopped (finished models are kept).
#   SEEDS="0 1 2" bash results/bam-mqar/regenerate.sh   (committed: bam, kerple-log, alibi and bam:ssmax=true in
#   seeds 0-2, every run on one AMD EPYC host; alibi not read at the long lengths: README)
# The two follow-ups in subfolders (README): bam:ssmax=true retrained on a Xeon and read to 512x,
#   RUN=results/bam-mqar/xeon VARIANTS=bam:ssmax=true LONG=bam:ssmax=true SEEDS="0 1 2" bash results/bam-mqar/regenerate.sh
# and bam with 4 heads per layer (the preset otherwise unchanged),
#   RUN=results/bam-mqar/heads4 SETUP="--config results/bam-mqar/heads4/experiment.toml" VARIANTS=bam LONG=bam \
#   SEEDS="0 1 2" bash results/bam-mqar/regenerate.sh
# Two workers on a 2-core machine (one thread each, as committed): run two copies with RUN pointing at two
# folders, VARIANTS one variant each and OMP_NUM_THREADS=1, then `relbench merge SECOND --run-dir FIRST`.
set -euo pipefail
RUN=${RUN:-results/bam-mqar}
SEEDS=${SEEDS:-0}
VARIANTS=${VARIANTS:-"bam kerple-log alibi bam:ssmax=true"}
LONG=${LONG:-"bam kerple-log bam:ssmax=true"}   # read at 256x and 512x
SETUP=${SETUP:-"--preset mqar"}   # or --config FILE
for seed in $SEEDS; do   # one seed at a time: a stopped run keeps every finished seed
  relbench train $SETUP --seeds "$seed" --variants $VARIANTS --run-dir "$RUN"
  relbench extrapolate --run-dir "$RUN" --seeds "$seed" --variants $VARIANTS --task mqar
done
for seed in $SEEDS; do
  relbench extrapolate --run-dir "$RUN" --seeds "$seed" --variants $LONG --task mqar --lengths 16384 32768
done
relbench report --run-dir "$RUN"
python results/bam/prior.py --run-dir "$RUN"   # BAM's learned prior per head: prior.csv, plots/prior.png
