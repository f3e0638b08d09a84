"""The mutation check stays aimed at the code: every mutation's text occurs exactly once in its file
(a file moved or a line rewritten would otherwise leave a mutation that mutates nothing), and the
tests it names exist."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import mutation_check  # noqa: E402

MUTATIONS = mutation_check.MUTATIONS


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_each_mutation_changes_exactly_one_place(mutation):
    name, file, text, replacement = mutation[:4]
    assert (ROOT / file).is_file(), f"{name}: {file} does not exist"
    assert (ROOT / file).read_text().count(text) == 1, f"{name}: its text is not in {file} exactly once"
    assert replacement != text
    for target in (mutation[4] if len(mutation) > 4 else mutation_check.CORE_TESTS):
        assert (ROOT / target.split("::")[0]).is_file(), f"{name}: no test file {target}"
