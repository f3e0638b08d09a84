"""Every built-in variant keeps the contract `relbench check` holds a user's scheme to (the same
code, relbench/contract/), property by property. FlexAttention is left to tests/test_attention.py
and tests/test_zoo.py, which compile it once per variant."""

import pytest

from relbench import contract, positions

ALL = positions.names()
NO_FLEX = [name for name, _ in contract.PROPERTIES if name != "backend flex"]


@pytest.mark.parametrize("name", ALL)
def test_every_builtin_variant_keeps_the_contract(name):
    findings = contract.run(name, NO_FLEX)
    assert [(f.prop, f.evidence) for f in findings if f.passed is False] == []
    assert [f.prop for f in findings] == NO_FLEX


def test_properties_that_apply_follow_the_declarations():
    """A property applies exactly where the scheme has what it checks: no bias, no suffix check;
    no parameters, no gradient or initialisation check; a declared capability is always checked."""
    by_name = {name: {f.prop: f.passed for f in contract.run(name, ["queries as suffix", "gradients",
                                                                    "translation invariance", "distance_only"])}
               for name in ("none", "rope", "alibi", "xl", "learned")}
    assert by_name["none"]["queries as suffix"] is None and by_name["none"]["gradients"] is None
    assert by_name["rope"]["translation invariance"] is True and by_name["learned"]["translation invariance"] is None
    assert by_name["alibi"]["gradients"] is None and by_name["xl"]["gradients"] is True
    assert all(by_name[n]["distance_only"] is True for n in by_name)   # declared or not: always compared


def test_a_property_that_raises_is_its_failure(monkeypatch):
    def broken(spec):
        raise RuntimeError("the scheme's own bug")

    monkeypatch.setattr(contract.properties, "PROPERTIES", (("shapes", broken),))
    (finding,) = contract.run("alibi")
    assert finding.passed is False and finding.evidence == "raised RuntimeError: the scheme's own bug"
