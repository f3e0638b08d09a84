#!/usr/bin/env bash
# Everything that needs a CUDA GPU, as one script a lent GPU machine runs once (issue 26). Each step
# has its own time limit (*_TIMEOUT, seconds) and writes under ${OUT:-runs/cuda-check}; STEPS picks
# the steps (default: all, in this order, about 9.5 min of limits):
#   machine  GPU, driver and torch                                     -> machine.txt
#   tests    the CUDA tests: flex score_mods of every scheme, forward and gradients, a whole model of
#            every scheme against the CPU reference, FIRE's flex backward (a strict xfail)
#                                                                      -> test_cuda.log
#   speed    every scheme's auto path against unbiased SDPA (flash) in bf16, timed in alternation,
#            forward and forward+backward at 4096 and 16384           -> speed_forward.csv, speed_backward.csv
#   train    quick-preset training throughput, eager against torch.compile, fp32 and bf16
#                                                                      -> train.log
#   gpu      the gpu preset (relbench/presets/gpu.toml) for rope alibi xl t5: train, perplexity and
#            copy to 16x, report: do its language models copy?         -> gpu-result/
#   bench    `relbench bench --preset quick --track lm` end to end: its wall time
#                                                                      -> bench.log, bench_seconds.txt
#   cli      train (tiny), extrapolate and report on the GPU           -> cli.log, extrapolation.csv
#   ddp      torchrun with NCCL                                        -> ddp.log
# DRY_RUN=1 runs every step on the CPU at toy sizes (lengths 256, a few steps, tiny presets), so the
# script itself is checked before GPU time is spent on it. It reports; it does not stop at a failure.
#     DRY_RUN=1 OUT=/tmp/cuda-dry bash benchmarks/cuda_check.sh      # on the CPU, first
#     bash benchmarks/cuda_check.sh                                  # on the GPU
#     STEPS="speed gpu" SPEED_VARIANTS="alibi fire" bash benchmarks/cuda_check.sh   # rerun what failed
set -uo pipefail
out=${OUT:-runs/cuda-check}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=$PYTHONPATH:/tmp/site
steps=${STEPS:-machine tests speed train gpu bench cli ddp}
all=$(python3 -c "from relbench import positions; print(' '.join(positions.names()))")
if [ "${DRY_RUN:-0}" = 1 ]; then
  device=cpu lengths="256" pairs=1 train_steps=2 preset_gpu="tiny" gpu_steps="--steps 20" bench_preset=tiny
  speed_variants=${SPEED_VARIANTS:-alibi xl fire} train_variants=${TRAIN_VARIANTS:-none} train_precisions=fp32
else
  device=cuda lengths="4096 16384" pairs=5 train_steps=20 preset_gpu="gpu" gpu_steps="" bench_preset=quick
  speed_variants=${SPEED_VARIANTS:-$all} train_variants=${TRAIN_VARIANTS:-none alibi t5 fire} train_precisions="fp32 bf16"
fi
has() { [[ " $steps " == *" $1 "* ]]; }
step() { echo "== $1 ($(date +%T))" | tee -a "$out/steps.log"; }

if has machine; then step machine
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || lscpu | grep "Model name"
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } | tee "$out/machine.txt"
fi
if has tests; then step tests
  timeout ${TEST_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -v --durations=5 \
      ${TESTS_K:+-k "$TESTS_K"} 2>&1 | tee "$out/test_cuda.log"
fi
if has speed; then step speed
  for pass in forward backward; do
    flag=$([ $pass = backward ] && echo --backward)
    timeout ${SPEED_TIMEOUT:-75} python3 benchmarks/attention.py --paired-only --device $device --lengths $lengths \
        --precision bf16 $flag --pairs $pairs --variants $speed_variants --out "$out/speed-$pass/profile.csv" \
        2>&1 | tee "$out/speed_$pass.log"
    cp "$out/speed-$pass/paired.csv" "$out/speed_$pass.csv" 2>/dev/null
  done
fi
if has train; then step train
  timeout ${TRAIN_TIMEOUT:-60} python3 benchmarks/train_throughput.py --device $device --steps $train_steps \
      --variants $train_variants --precisions $train_precisions --backends auto --modes eager compile \
      2>&1 | tee "$out/train.log"
fi
if has gpu; then step gpu
  run=/tmp/cuda-gpu-result
  timeout ${GPU_TIMEOUT:-150} bash -c "python3 -m relbench train --preset $preset_gpu $gpu_steps --device $device \
      --run-dir $run --variants ${GPU_VARIANTS:-rope alibi xl t5} \
      && python3 -m relbench extrapolate --run-dir $run --device $device --task perplexity copy \
      && python3 -m relbench report --run-dir $run" 2>&1 | tail -80 | tee "$out/gpu.log"
  mkdir -p "$out/gpu-result" && cp $run/*.csv $run/*.json $run/*.toml $run/report.md "$out/gpu-result/" 2>/dev/null
fi
if has bench; then step bench
  start=$(date +%s)
  timeout ${BENCH_TIMEOUT:-90} python3 -m relbench bench --preset $bench_preset --track lm --device $device \
      --run-dir /tmp/cuda-bench ${BENCH_VARIANTS:+--variants $BENCH_VARIANTS} 2>&1 | tail -60 | tee "$out/bench.log"
  echo "rc ${PIPESTATUS[0]} seconds $(( $(date +%s) - start ))" | tee "$out/bench_seconds.txt"
fi
if has cli; then step cli
  timeout ${CLI_TIMEOUT:-45} bash -c "python3 -m relbench train --preset tiny --device $device --run-dir /tmp/cuda-run \
      --variants ${CLI_VARIANTS:-alibi fire transformer-xl rope} \
      && python3 -m relbench extrapolate --run-dir /tmp/cuda-run --device $device --lengths 64 512 \
      && python3 -m relbench report --run-dir /tmp/cuda-run" 2>&1 | tail -60 | tee "$out/cli.log"
  cp /tmp/cuda-run/extrapolation.csv "$out/" 2>/dev/null || true
fi
if has ddp && [ "$device" = cuda ]; then step ddp
  # torchrun on the GPU: NCCL and cuda:LOCAL_RANK with the GPUs there are (tests/test_distributed.py's
  # 2-GPU test runs only where two exist; one process still opens an NCCL group)
  timeout ${DDP_TIMEOUT:-60} bash -c "python3 -m torch.distributed.run --standalone --nproc_per_node \$(python3 -c 'import torch; print(min(2, torch.cuda.device_count()))') \
      -m relbench train --preset tiny --device cuda --batch-size 8 --run-dir /tmp/cuda-ddp --variants alibi xl \
      && python3 -m pytest -q -p no:cacheprovider tests/test_distributed.py -k cuda" 2>&1 | tail -30 | tee "$out/ddp.log"
fi
step done
