#!/usr/bin/env bash
# Regenerates results/frontier: the frontier preset (the quick model, 400 steps at length 256 in fp32)
# for rope, alibi and the data-dependent fox, cope and dape; rope, alibi and fox fine-tuned to 1024 for
# 200 steps, and rope fine-tuned under PI and under YaRN (s = 1024 / 256 = 4, as those papers do);
# the control: rope, alibi and fox continued for the same 200 steps at 256;
# perplexity and the copy task at 1x-16x (256-4096) for every trained and fine-tuned model and for
# rope's inference-time forms (PI, NTK-aware, YaRN, log-n), passkey at 1x, 4x and 16x.
# Run from the repository root; a stopped run resumes where it stopped.
set -euo pipefail
RUN=${RUN:-results/frontier}
SEEDS=${SEEDS:-0}
PRESET=${PRESET:-frontier}
LENGTH=${LENGTH:-1024}          # the fine-tuning length
STEPS=${STEPS:-200}             # fine-tuning steps
LENGTHS=${LENGTHS:-256 512 1024 2048 4096}
PASSKEY_LENGTHS=${PASSKEY_LENGTHS:-256 1024 4096}
TRAINED="rope alibi fox cope dape"
FACTOR=$((LENGTH / 256))        # PI's and YaRN's s for fine-tuning: the fine-tuning length over training's
TUNED="rope alibi fox rope@pi:factor=$FACTOR rope@yarn:factor=$FACTOR"
CONTROL="rope alibi fox"
FORMS="rope@pi rope@ntk rope@yarn rope@logn"
for seed in $SEEDS; do   # one seed at a time: a stopped run keeps every finished seed
  relbench train --preset "$PRESET" --seeds "$seed" --variants $TRAINED --run-dir "$RUN"
  relbench finetune --run-dir "$RUN" --seeds "$seed" --variants $TUNED --length "$LENGTH" --steps "$STEPS"
  # the control: the same steps and tokens at the training length, so more training and a longer context separate
  relbench finetune --run-dir "$RUN" --seeds "$seed" --variants $CONTROL --length 256 --steps "$STEPS"
  evaluated="$TRAINED $FORMS $(for v in $TUNED; do printf '%s+ft%s ' "$v" "$LENGTH"; done)"
  evaluated="$evaluated $(for v in $CONTROL; do printf '%s+ft256 ' "$v"; done)"
  relbench extrapolate --run-dir "$RUN" --seeds "$seed" --variants $evaluated --lengths $LENGTHS \
    --task perplexity copy --mode nonoverlap --trials 8
  relbench extrapolate --run-dir "$RUN" --seeds "$seed" --variants $evaluated --lengths $PASSKEY_LENGTHS \
    --task passkey --trials 4
done
relbench report --run-dir "$RUN"
