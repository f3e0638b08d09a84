"""The code passes its linter: `ruff check` with the rules in pyproject.toml ([tool.ruff]) finds
nothing in relbench/, tests/, benchmarks/, scripts/ and examples/. ruff is in the test extra."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_ruff_finds_nothing():
    result = ruff("check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_fails_on_a_finding(tmp_path):
    """The check can fail: the same rules on a file with an unused import and an undefined name."""
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "bad.py").write_text("import os\n\n\ndef f():\n    return undefined_name\n")
    result = ruff("check", "--no-cache", ".", cwd=tmp_path)
    assert result.returncode == 1 and "F401" in result.stdout and "F821" in result.stdout
