"""The machine a run was made on: code and library versions, the CPU and the features that decide
its attention speed, threads, device and date, recorded in config.json and described in reports."""

from __future__ import annotations

import datetime as dt
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from relbench.runs import distributed


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], capture_output=True, text=True,
                             timeout=5, cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")   # what decides CPU attention speed (docs/performance.md)


def cpu_name(cpuinfo: str | None = None) -> str:
    """The CPU's model name and the features of CPU_FEATURES it has ("Intel(R) Xeon(R) Processor;
    avx2 avx512f avx512_bf16 amx_bf16"), from /proc/cpuinfo on Linux; platform.processor() elsewhere."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return platform.processor() or "unknown"
    name = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")),
                platform.processor() or "unknown")
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    have = [f for f in CPU_FEATURES if f in flags]
    return f"{name}; {' '.join(have)}" if have else name


def environment(device: str) -> dict[str, Any]:
    """What a result depends on besides its config: code version, library versions, machine."""
    from relbench import __version__

    return {
        "relbench": __version__,
        "git_commit": git_commit(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_threads": torch.get_num_threads(),
        "processes": distributed.world(),   # > 1: trained under torchrun (the same update, float sums in another order)
        "device": device,
        "cuda_device": torch.cuda.get_device_name() if device.startswith("cuda") else None,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def describe_environment(env: dict[str, Any]) -> str:
    """Where a run's figures came from: CPU (when recorded), platform, threads, device, versions, commit, date."""
    cpu = f"{env['cpu']}, " if env.get("cpu") else ""
    return (f"{cpu}{env.get('platform', '?')}, {env.get('cpu_threads', '?')} threads, device {env.get('device', '?')}; "
            f"torch {env.get('torch', '?')}; relbench {env.get('relbench', '?')} at commit "
            f"{env.get('git_commit') or 'unknown'}; {env.get('date', '')}")
