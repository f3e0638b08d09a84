"""Position encodings, one registered class per variant.

    from relbench import positions
    positions.names()                          # every registered variant
    enc = positions.build("xl", n_heads=8)     # unknown name -> RelbenchError listing the names
    enc.bias(q_len, k_len)                     # (H, q_len, k_len), or None
"""

from relbench.positions import (  # noqa: F401  (importing a module registers its variants)
    absolute, alibi, dynamic, fire, kerple, rope, sandwich, shaw, t5, transformer_xl, xl, xpos)
from relbench.positions.base import (  # noqa: F401
    PositionEncoding,
    RelativeBias,
    UnsupportedLength,
    adds_bias,
    build,
    build_spec,
    get,
    names,
    parse_spec,
    register,
    training_options,
)
