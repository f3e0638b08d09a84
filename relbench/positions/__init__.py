"""Position encodings, one registered class per variant.

    from relbench import positions
    positions.names()                          # every registered variant
    enc = positions.build("xl", n_heads=8)     # unknown name -> RelbenchError listing the names
    enc.plan(q_len, k_len)                     # its bias, or None (see positions/plan.py)
    positions.parse("rope*3,none").layers(4)   # a spec, typed: the layer of each block (positions/spec.py)
    forms.apply(model, "rope@yarn:factor=16")  # an evaluation form on a trained model (positions/forms.py)
"""

from relbench.positions import (  # noqa: F401  (importing a module registers its variants and evaluation forms)
    absolute,
    alibi,
    bam,
    cope,
    dape,
    dynamic,
    fire,
    forms,
    fox,
    grape,
    kerple,
    path,
    pope,
    rope,
    rope_forms,
    sandwich,
    shaw,
    stickbreaking,
    t5,
    table_forms,
    transformer_xl,
    xl,
    xpos,
)
from relbench.positions.base import (  # noqa: F401
    PositionEncoding,
    RelativeBias,
    UnsupportedLength,
    build,
    get,
    names,
    register,
)
from relbench.positions.spec import Layer, Spec, build_spec, parse, parse_spec, scheme, training_options  # noqa: F401
