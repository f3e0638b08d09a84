"""path (positions/path.py): PaTH attention as a bias on the plain logits, against the product of
Householder transforms written out and against the official code's decoding update."""

import math

import torch

from relbench import positions
from relbench.attention import attention, chunked_attention


def built():
    enc = positions.build("path", n_heads=2, head_dim=4, d_model=8, train_length=16)
    enc.reset_parameters(torch.Generator().manual_seed(0))
    with torch.no_grad():                 # away from the near-identity start, so every term shows
        for p in enc.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    return enc


def inputs(length=9, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, length, 8, generator=g), *(torch.randn(1, 2, length, 4, generator=g) for _ in range(3)))


def test_defaults_are_the_official_codes():
    enc = positions.build("path", n_heads=2, head_dim=4, d_model=8, train_length=16)
    enc.reset_parameters(torch.Generator().manual_seed(0))
    assert enc.w_down.out_features == 32 and enc.w_conv.shape == (8, 3)
    assert torch.equal(enc.bt.bias, torch.zeros(2)) and 0.005 < float(enc.w_up.weight.std()) < 0.04
    x = inputs()[0]
    w, beta = enc.transforms(x)
    assert torch.allclose(w.norm(dim=-1), torch.ones(1, 2, 9)) and ((beta > 0) & (beta < 2)).all()
    moved = built()      # beta = 2 sigmoid(bt(x)): above 1 the transform reflects (a negative eigenvalue)
    want = 2 * torch.sigmoid(x @ moved.bt.weight.T + moved.bt.bias).transpose(1, 2)
    torch.testing.assert_close(moved.transforms(x)[1], want.detach())


def logits_of_path():
    """q, k, w, beta of 9 positions and PaTH's logits (the plan's bias plus the plain q.k / sqrt(d)), (H, 9, 9)."""
    enc = built()
    x, q, k, _v = inputs()
    w, beta = enc.transforms(x)
    return q, k, w, beta, enc.plan(9, 9, q, k, x).full()[0] + q[0] @ k[0].transpose(-2, -1) / 2


@torch.no_grad()
def test_the_logits_are_the_product_of_transforms():
    """q_i^T H_i ... H_(j+1) k_j / sqrt(d), H_t = I - beta_t w_t w_t^T, written out as matrices."""
    q, k, w, beta, logits = logits_of_path()
    for h in range(2):
        for i in range(9):
            for j in range(i + 1):
                product = torch.eye(4)
                for t in range(i, j, -1):
                    product = product @ (torch.eye(4) - beta[0, h, t] * torch.outer(w[0, h, t], w[0, h, t]))
                want = float(q[0, h, i] @ product @ k[0, h, j]) / math.sqrt(4)
                assert abs(float(logits[h, i, j]) - want) < 1e-5, (h, i, j)


@torch.no_grad()
def test_the_decoding_update_gives_the_same_logits():
    """The official decoding path: before token t's key joins, every past key becomes k - beta_t (k . w_t) w_t."""
    q, k, w, beta, logits = logits_of_path()
    cache = k[0, :, :0]
    for t in range(9):
        cache = cache - beta[0, :, t, None, None] * (cache * w[0, :, t, None]).sum(-1, keepdim=True) * w[0, :, t, None]
        cache = torch.cat([cache, k[0, :, t:t + 1]], dim=1)
        torch.testing.assert_close(q[0, :, t:t + 1] @ cache.transpose(-2, -1) / 2, logits[:, t:t + 1, :t + 1])


def test_every_path_and_block_agree_with_gradients():
    enc = built()
    x, q, k, v = inputs(37)
    grads = {}
    for name, run in (("reference", lambda p, q, k, v: attention(q, k, v, p, "reference")),
                      ("chunked", lambda p, q, k, v: chunked_attention(q, k, v, p, block=5))):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        run(enc.plan(37, 37, qq, kk, x), qq, kk, vv).square().sum().backward()
        grads[name] = [t.grad for t in (qq, kk, vv)]
    for a, b in zip(grads["reference"], grads["chunked"]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_the_short_convolution_is_a_causal_depthwise_conv1d():
    from relbench.positions.path import causal_conv

    g = torch.Generator().manual_seed(4)
    x, kernel = torch.randn(2, 6, 11, generator=g), torch.randn(6, 3, generator=g)
    conv = torch.nn.functional.conv1d(torch.nn.functional.pad(x, (2, 0)), kernel[:, None, :], groups=6)
    torch.testing.assert_close(causal_conv(x, kernel), conv)


@torch.no_grad()
def test_a_later_token_never_changes_an_earlier_transform():
    enc = built()
    x = inputs()[0]
    edited = x.clone()
    edited[:, 6:] += 1.0
    (w, beta), (w2, beta2) = enc.transforms(x), enc.transforms(edited)
    assert torch.equal(w[..., :6, :], w2[..., :6, :]) and torch.equal(beta[..., :6], beta2[..., :6])
    assert not torch.equal(w[..., 6, :], w2[..., 6, :])
