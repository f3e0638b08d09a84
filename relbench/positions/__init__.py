"""Position encodings, one registered class per variant.

    from relbench import positions
    positions.names()                          # every registered variant
    enc = positions.build("xl", n_heads=8)     # unknown name -> RelbenchError listing the names
    enc.plan(q_len, k_len)                     # its bias, or None (see positions/plan.py)
"""

from relbench.positions import (  # noqa: F401  (importing a module registers its variants)
    absolute, alibi, cope, dape, dynamic, fire, fox, kerple, rope, sandwich, shaw, t5, transformer_xl, xl, xpos)
from relbench.positions.base import (  # noqa: F401
    PositionEncoding,
    RelativeBias,
    UnsupportedLength,
    build,
    build_spec,
    get,
    names,
    parse_spec,
    register,
    scheme,
    training_options,
)
