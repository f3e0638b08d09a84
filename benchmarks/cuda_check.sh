#!/usr/bin/env bash
# The checks that need a CUDA GPU, as one script (a lent GPU machine runs it once):
# the CUDA tests (flex score_mods of every scheme that has one, forward and gradients, and a whole
# model of every scheme against the CPU reference), then attention cost at 4096 and 16384 for every
# scheme (auto = flex where a score_mod exists, chunked for transformer-xl) against the reference
# path and unbiased SDPA, then training throughput. Uses the machine's own torch (no install);
# writes logs and CSVs under ${OUT:-runs/cuda-check}. Each step has its own time limit (*_TIMEOUT) and
# selection (TESTS_K, BENCH_VARIANTS, TRAIN_VARIANTS, CLI_VARIANTS) so a re-check fits what is left.
# then torchrun with NCCL. It reports; it does not stop at a failure: read test_cuda.log.
#     bash benchmarks/cuda_check.sh
set -uo pipefail
out=${OUT:-runs/cuda-check}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=$PYTHONPATH:/tmp/site
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "import torch; print('torch', torch.__version__)"; } | tee "$out/machine.txt"
timeout ${TEST_TIMEOUT:-270} python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -v --durations=5 ${TESTS_K:+-k "$TESTS_K"} 2>&1 | tee "$out/test_cuda.log"
timeout ${BENCH_TIMEOUT:-150} python3 benchmarks/attention.py --device cuda --lengths 4096 16384 --backends auto \
    --variants ${BENCH_VARIANTS:-$(python3 -c "from relbench import positions; print(' '.join(positions.names()))")} \
    --out "$out/attention.csv" 2>&1 | tee "$out/attention.log"
timeout ${TRAIN_TIMEOUT:-45} python3 benchmarks/train_throughput.py --device cuda --variants ${TRAIN_VARIANTS:-none alibi t5 fire transformer-xl} \
    --precisions fp32 bf16 --backends auto 2>&1 | tee "$out/train.log"
# the command line end to end on the GPU: train (tiny) and extrapolate every scheme
timeout ${CLI_TIMEOUT:-90} bash -c "python3 -m relbench train --preset tiny --device cuda --run-dir /tmp/cuda-run --variants ${CLI_VARIANTS:-alibi fire transformer-xl rope} \
    && python3 -m relbench extrapolate --run-dir /tmp/cuda-run --device cuda --lengths 64 512 \
    && python3 -m relbench report --run-dir /tmp/cuda-run" 2>&1 | tail -60 | tee "$out/cli.log"
cp /tmp/cuda-run/extrapolation.csv "$out/" 2>/dev/null || true
# torchrun on the GPU: NCCL and cuda:LOCAL_RANK with the GPUs there are (tests/test_distributed.py's
# 2-GPU test runs only where two exist; one process still opens an NCCL group)
timeout ${DDP_TIMEOUT:-90} bash -c "python3 -m torch.distributed.run --standalone --nproc_per_node \$(python3 -c 'import torch; print(min(2, torch.cuda.device_count()))') \
    -m relbench train --preset tiny --device cuda --batch-size 8 --run-dir /tmp/cuda-ddp --variants alibi xl \
    && python3 -m pytest -q -p no:cacheprovider tests/test_distributed.py -k cuda" 2>&1 | tail -30 | tee "$out/ddp.log"
