#!/usr/bin/env bash
# Times the main job (`relbench bench`, its defaults) on a fresh clone of this repository's HEAD, with
# every output line stamped with the seconds since the start, so that the first comparison (the
# language models' report: the first "wrote ... report.md") and the end can be read off
# (docs/performance.md, "How long the main job takes"). Uses the active environment's relbench code
# from the clone (PYTHONPATH), not the installed copy. Usage: bash scripts/time_main_job.sh [LOG]
set -euo pipefail
log=${1:-main_job.log}
here=$(git rev-parse --show-toplevel)
clone=$(mktemp -d)
git clone -q "$here" "$clone"
python=$(command -v python)
{
  git -C "$clone" log --oneline -1
  lscpu | grep "Model name" || true
  echo "flags: $(grep -ow 'avx2\|avx512_bf16\|amx_tile' /proc/cpuinfo 2>/dev/null | sort -u | tr '\n' ' ')"
  cd "$clone"
  PYTHONPATH="$clone" COLUMNS=160 /usr/bin/time -v "$python" -m relbench bench 2>&1 | "$python" -u -c '
import sys, time
start = time.time()
for line in sys.stdin:
    sys.stdout.write(f"[{time.time() - start:7.1f}] {line}")
    sys.stdout.flush()'
} | tee "$log"
echo "run directory: $clone/runs/default; log: $log"
