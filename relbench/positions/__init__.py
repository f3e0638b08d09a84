"""Position encodings, one registered class per variant.

    from relbench import positions
    positions.names()                          # every registered variant
    enc = positions.build("xl", n_heads=8)     # unknown name -> RelbenchError listing the names
    enc.bias(q_len, k_len)                     # (H, q_len, k_len), or None
"""

from relbench.positions import absolute, alibi, rope, shaw, t5, xl  # noqa: F401  (registers the variants)
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
)
