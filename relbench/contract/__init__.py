"""The contract a position scheme keeps, property by property: what the fast attention paths, the
model and the commands rely on. `relbench check` runs it on a user's scheme, and the registry-wide
tests (tests/test_capabilities.py, tests/test_contract.py) run the same code on every built-in one.
Two parts: measurement.py (what a built scheme really does) and properties.py (each property
against it, and `run`).

Every property is measured on the scheme built small (4 heads of 8, trained length 32) with its
parameters moved off their initial values (so a learned table that starts at zero can still show
a violation), and returns a Finding: passed (or None where it does not apply), the measured
evidence in one line, and the fix where one can be named.
"""

from relbench.contract.measurement import CAPABILITIES, LONG, RECT, TRAIN_LENGTH, D, H, layer_input, measure, perturbed, queries
from relbench.contract.properties import (
    BACKENDS_CHECKED,
    PROPERTIES,
    Finding,
    logits,
    prop_backend,
    prop_capability,
    prop_causal,
    prop_chunked_gradients,
    prop_determinism,
    prop_gradients,
    prop_init,
    prop_lengths,
    prop_plan_extras,
    prop_shapes,
    prop_suffix,
    prop_translation,
    run,
    tiny_gpt,
)

__all__ = [
    "BACKENDS_CHECKED",
    "CAPABILITIES",
    "LONG",
    "PROPERTIES",
    "RECT",
    "TRAIN_LENGTH",
    "D",
    "Finding",
    "H",
    "layer_input",
    "logits",
    "measure",
    "perturbed",
    "prop_backend",
    "prop_capability",
    "prop_causal",
    "prop_chunked_gradients",
    "prop_determinism",
    "prop_gradients",
    "prop_init",
    "prop_lengths",
    "prop_plan_extras",
    "prop_shapes",
    "prop_suffix",
    "prop_translation",
    "queries",
    "run",
    "tiny_gpt",
]
