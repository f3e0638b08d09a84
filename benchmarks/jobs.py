"""Training runs side by side against one after another, in the same run of this script.

`relbench train --jobs N` trains N runs at once, each in its own process with an equal share of
the threads; `relbench bench` does so by default (--jobs auto). This script trains the same runs
(the same variants, seeds and steps, so the same work: a run's weights do not depend on it) both
ways as `relbench train` commands in fresh run directories and prints the wall times and their
ratio. Start-up (corpus, imports; each child's spawn) is counted: it is part of what a user waits for.

    python benchmarks/jobs.py                                    # retrieval preset, 4 variants, 300 steps
    python benchmarks/jobs.py --preset quick --steps 100 --variants alibi xl rope t5
    python benchmarks/jobs.py --jobs 4                           # on a machine with 4 or more cores

Run it on an idle machine: another process on the cores changes both sides unequally.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time


def timed(args: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "relbench", *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"relbench {' '.join(args)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="retrieval")
    parser.add_argument("--variants", nargs="+", default=["alibi", "xl", "rope", "t5"])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    threads = os.environ.get("OMP_NUM_THREADS", "all")
    # a retrieval preset trains every step (criterion stopping would end the runs early, each at its own step)
    setup = ["--config", _no_criterion(args.preset)] if "retrieval" in args.preset else ["--preset", args.preset]
    base = ["train", *setup, "--variants", *args.variants, "--steps", str(args.steps)]
    with tempfile.TemporaryDirectory() as scratch:
        alone = timed([*base, "--run-dir", os.path.join(scratch, "alone"), "--jobs", "1"])
        apart = timed([*base, "--run-dir", os.path.join(scratch, "apart"), "--jobs", str(args.jobs)])
    print(f"preset {args.preset}, {len(args.variants)} runs of {args.steps} steps ({' '.join(args.variants)}); "
          f"threads: {threads}")
    print(f"one after another (--jobs 1): {alone:7.1f} s")
    print(f"side by side (--jobs {args.jobs}):    {apart:7.1f} s")
    print(f"speed-up: {alone / apart:.2f}x")
    return 0


def _no_criterion(preset: str) -> str:
    """An experiment file: `preset` trained for its steps without stopping at the criterion."""
    handle = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    handle.write(f'preset = "{preset}"\n\n[train]\ncriterion_accuracy = 0.0\n')
    handle.close()
    return handle.name


if __name__ == "__main__":
    sys.exit(main())
