#!/usr/bin/env bash
# Times the main job (`relbench bench`, its defaults) on a fresh clone of this repository's HEAD, with
# every output line stamped with the seconds since the start, so that the first comparison (the
# language models' report: the first "wrote ... report.md") and the end can be read off
# (docs/performance.md, "How long the main job takes"). Uses the active environment's relbench code
# from the clone (PYTHONPATH), not the installed copy. Usage: bash scripts/time_main_job.sh [LOG [ARGS...]]:
# ARGS replace `bench`'s defaults, e.g. the placement of the new-variant template among the shipped panel:
#   bash scripts/time_main_job.sh against.log new-variant mybias -- bench --plugin mybias.py --variants mybias --against retrieval
# (a first command before `--` runs untimed in the clone, to set the timed one up).
# ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 in the environment restrict
# torch, oneDNN and MKL to their AVX2 code paths (the header prints torch's capability); on an AVX-512 EPYC
# that was no slower, so it does not stand in for an AVX2-only host (docs/performance.md).
set -euo pipefail
log=${1:-main_job.log}
shift || true
args=("$@"); setup=()
for i in "${!args[@]}"; do
  if [ "${args[$i]}" = "--" ]; then setup=("${args[@]:0:$i}"); args=("${args[@]:$((i + 1))}"); break; fi
done
[ ${#args[@]} -gt 0 ] || args=(bench)
here=$(git rev-parse --show-toplevel)
clone=$(mktemp -d)
git clone -q "$here" "$clone"
python=$(command -v python)
{
  git -C "$clone" log --oneline -1
  lscpu | grep "Model name" || true
  echo "flags: $(grep -ow 'avx2\|avx512_bf16\|amx_tile' /proc/cpuinfo 2>/dev/null | sort -u | tr '\n' ' ')"
  echo "torch CPU capability: $("$python" -c 'import torch; print(torch.backends.cpu.get_cpu_capability())')" \
    "ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-} ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-} MKL_ENABLE_INSTRUCTIONS=${MKL_ENABLE_INSTRUCTIONS:-}"
  cd "$clone"
  [ ${#setup[@]} -eq 0 ] || PYTHONPATH="$clone" "$python" -m relbench "${setup[@]}"
  echo "timed: relbench ${args[*]}"
  PYTHONPATH="$clone" COLUMNS=160 /usr/bin/time -v "$python" -m relbench "${args[@]}" 2>&1 | "$python" -u -c '
import sys, time
start = time.time()
for line in sys.stdin:
    sys.stdout.write(f"[{time.time() - start:7.1f}] {line}")
    sys.stdout.flush()'
} | tee "$log"
echo "run directory: $clone/runs/default; log: $log"
