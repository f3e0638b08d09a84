"""Copy each shipped panel's files from its committed result (results/NAME) into the package
(relbench/panels/NAME), byte for byte; tests/test_panels.py fails while the two differ.

    python scripts/ship_panels.py            # every panel the package ships
    python scripts/ship_panels.py retrieval  # one
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from relbench.runs import panels, results

ROOT = Path(__file__).resolve().parents[1]


def main(names: list[str]) -> None:
    for name in names or sorted(panels.shipped()):
        source, target = ROOT / "results" / name, ROOT / "relbench" / "panels" / name
        target.mkdir(parents=True, exist_ok=True)
        for file in panels.files_of(results.read_json(source / results.CONFIG)):
            shutil.copyfile(source / file, target / file)
        print(f"{source} -> {target}")


if __name__ == "__main__":
    main(sys.argv[1:])
