"""The variants, sizes and inputs the attention-path tests share (tests/test_attention.py,
tests/test_split.py)."""

import torch
from helpers import layer_input

from relbench import positions

H, D = 4, 8
# small horizons so the far/near decomposition runs at short lengths: xl 5, t5 12, shaw 3, t5-log2 8
SPECS = {name: name for name in positions.names()}
SPECS.update({"xl": "xl:k=5", "t5": "t5:num_buckets=8,max_distance=12", "shaw": "shaw:k=3",
              "t5-log2": "t5-log2:max_distance=8"})
SPLIT = [s for s in SPECS.values() if positions.scheme(s).has_horizon]      # xl, t5, t5-log2, shaw
LONG = 150   # >= every SPLIT horizon + the split path's 32-row band block: the horizon split runs


def encoding(spec):
    enc = positions.build_spec(spec, n_heads=H, head_dim=D, train_length=64)
    enc.reset_parameters(torch.Generator().manual_seed(0))
    with torch.no_grad():
        for p in enc.parameters():
            p.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    return enc


def qkv(q_len, k_len, batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, H, q_len, D, generator=g), torch.randn(batch, H, k_len, D, generator=g),
            torch.randn(batch, H, k_len, D, generator=g))


def prepared(enc, q_len, k_len, batch=2):
    q, k, v = qkv(q_len, k_len, batch)
    q, k, plan = enc.prepare(q, k, x=layer_input(enc, batch, k_len))
    return q, k, v, plan
