"""Every attention path equals the reference (materialised) path, for every variant, at sizes where
that path really runs: `recording()` tells which path ran. The split paths' own tests, with their
merges counted, are in tests/test_split.py."""

import pytest
import torch
from attention_cases import LONG, SPECS, SPLIT, D, H, encoding, prepared, qkv
from helpers import layer_input

from relbench import positions
from relbench.attention import BACKENDS, attention, check, chunked_attention, recording, resolve
from relbench.attention import fused as fused_module
from relbench.attention.fused import split_attention, toeplitz_attention, toeplitz_block
from relbench.errors import UsageError
from relbench.positions.base import PositionEncoding
from relbench.positions.plan import BiasPlan, toeplitz


def test_split_cases_have_horizons_short_enough_for_the_split_to_run():
    assert sorted(p.split(":")[0] for p in SPLIT) == ["shaw", "t5", "t5-log2", "xl"]


@pytest.mark.parametrize("spec", list(SPECS.values()))
@pytest.mark.parametrize("backend", ["sdpa", "chunked", "split", "toeplitz"])
@pytest.mark.parametrize("q_len, k_len", [(37, 37), (9, 37), (LONG, LONG)])
@torch.no_grad()  # split is inference-only
def test_backend_matches_reference(spec, backend, q_len, k_len):
    enc = encoding(spec)
    q, k, v, plan = prepared(enc, q_len, k_len)
    ref = attention(q, k, v, plan, "reference")
    with recording() as taken:
        out = attention(q, k, v, plan, backend)
    # FoX's running sums of log f reach -200 here: every fp32 path, the reference included, is 1e-5
    # from float64 at LONG, so two paths may differ by twice that
    tolerance = 3e-5 if positions.scheme(spec).input_dependent else 1e-5
    torch.testing.assert_close(out, ref, rtol=tolerance, atol=tolerance)
    # the path that ran is the one `resolve` names, and it is the one the test means to exercise
    expected = resolve(backend, plan, q, k_len, grad=False)
    assert dict(taken) == {expected: 1}
    if backend == "split" and q_len == k_len:
        if positions.scheme(spec).separable:
            assert expected == "split-linear"
        elif spec in SPLIT and q_len == LONG:
            assert expected == "split"
    if backend == "toeplitz" and positions.scheme(spec).adds_bias:
        assert expected == ("toeplitz" if positions.scheme(spec).distance_only else "chunked")


DISTANCE_ONLY = [s for s in SPECS.values() if positions.scheme(s).distance_only]


def test_distance_only_cases_are_the_relative_biases():
    assert sorted(p.split(":")[0] for p in DISTANCE_ONLY) == ["alibi", "bam", "dynamic", "kerple-log", "kerple-power",
                                                             "sandwich", "t5", "t5-log2", "xl"]


@pytest.mark.parametrize("spec", DISTANCE_ONLY)
@pytest.mark.parametrize("q_len, k_len, block", [(29, 29, 1), (29, 29, 4), (29, 29, 7), (29, 29, 64),
                                                 (9, 29, 4), (1, 29, 4), (40, 40, None)])
@torch.no_grad()
def test_toeplitz_matches_reference_for_every_block_and_query_suffix(spec, q_len, k_len, block, monkeypatch):
    """Blocks of 1 row up to one block for the whole sequence, square and query suffixes: the
    strided mask view lines up with the reference bias and causal mask, one kernel call per block."""
    calls = []
    original = fused_module._attend_lse
    monkeypatch.setattr(fused_module, "_attend_lse", lambda *a, **k: calls.append(a[0].shape[-2]) or original(*a, **k))
    enc = encoding(spec)
    q, k, v, plan = prepared(enc, q_len, k_len)
    ref = attention(q, k, v, plan, "reference")
    torch.testing.assert_close(toeplitz_attention(q, k, v, plan, block=block), ref, rtol=1e-5, atol=1e-5)
    size = toeplitz_block(q_len) if block is None else block
    assert calls == [min(size, q_len - s) for s in range(0, q_len, size)]


@torch.no_grad()
def test_toeplitz_at_a_length_with_several_default_blocks():
    """At 2100 the default block is 262 rows: 9 calls, the last one short."""
    enc = encoding("kerple-log")
    q, k, v, plan = prepared(enc, 2100, 2100, batch=1)
    assert toeplitz_block(2100) == 262
    with recording() as taken:
        out = attention(q, k, v, plan, "auto")
    assert dict(taken) == {"toeplitz": 1}
    torch.testing.assert_close(out, attention(q, k, v, plan, "chunked"), rtol=1e-5, atol=1e-5)


def test_resolve_names_every_case_where_split_cannot_split():
    """The five cases the split backend used to fall back silently in, each resolved by name."""
    q_long, _, _, plan_xl = prepared(encoding("xl:k=5"), LONG, LONG)
    assert resolve("split", plan_xl, q_long, LONG, grad=False) == "split"
    q_short, _, _, plan_short = prepared(encoding("xl:k=5"), 36, 36)        # 36 < horizon 5 + band block 32
    assert resolve("split", plan_short, q_short, 36, grad=False) == "chunked"
    q_rect, _, _, plan_rect = prepared(encoding("xl:k=5"), 9, LONG)         # q_len != k_len
    assert resolve("split", plan_rect, q_rect, LONG, grad=False) == "chunked"
    q_meta = torch.empty(1, H, LONG, D, device="meta")                       # not on the CPU
    assert resolve("split", plan_xl, q_meta, LONG, grad=False) == "chunked"
    q_k, _, _, plan_kerple = prepared(encoding("kerple-log"), LONG, LONG)     # no horizon
    assert resolve("split", plan_kerple, q_k, LONG, grad=False) == "chunked"
    assert resolve("split", None, q_long, LONG, grad=False) == "sdpa"        # no bias
    q_a, _, _, plan_a = prepared(encoding("alibi"), 37, 37)
    assert resolve("split", plan_a, q_a, 37, grad=False) == "split-linear"
    assert resolve("auto", plan_short, q_short, 36, grad=False) == "toeplitz"   # distance-only, CPU inference
    assert resolve("auto", plan_xl, q_long, LONG, grad=False) == "toeplitz"
    assert resolve("auto", plan_xl, q_long, LONG, grad=True) == "chunked"
    assert resolve("auto", plan_xl, q_meta, LONG, grad=False) == "chunked"          # not on the CPU
    q_s, _, _, plan_shaw = prepared(encoding("shaw:k=3"), LONG, LONG)
    assert resolve("auto", plan_shaw, q_s, LONG, grad=False) == "split"              # content-dependent
    q_f, _, _, plan_fire = prepared(encoding("fire"), LONG, LONG)
    assert resolve("auto", plan_fire, q_f, LONG, grad=False) == "chunked"
    assert resolve("toeplitz", plan_fire, q_f, LONG, grad=False) == "chunked"
    assert resolve("auto", None, q_long, LONG, grad=True) == "sdpa"


def test_split_path_refuses_inputs_it_cannot_split():
    q, k, v, plan = prepared(encoding("xl:k=5"), 30, 30)
    with pytest.raises(ValueError, match="far key block"):
        split_attention(q, k, v, plan)


@pytest.mark.parametrize("spec", ["alibi", "xl:k=5", "shaw:k=3", "rope", "fire", "kerple-log"])
@torch.no_grad()
def test_flex_matches_reference(spec):
    enc = encoding(spec)
    q, k, v, plan = prepared(enc, 64, 64, batch=1)
    ref = attention(q, k, v, plan, "reference")
    with recording() as taken:
        out = attention(q, k, v, plan, "flex")
    assert dict(taken) == {"flex": 1}
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("spec", ["xl:k=5", "t5:num_buckets=8,max_distance=12", "shaw:k=3", "alibi",
                                  "transformer-xl", "fire", "dynamic", "fox", "cope", "dape"])
def test_chunked_gradients_match_reference(spec):
    enc = encoding(spec)
    grads = {}
    for backend in ("reference", "chunked"):
        enc.zero_grad()
        q, k, v = (t.requires_grad_() for t in qkv(21, 21))
        q_rot, k_rot, plan = enc.prepare(q, k, x=layer_input(enc, 2, 21))
        out = attention(q_rot, k_rot, v, plan, backend)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        grads[backend] = [q.grad, k.grad, v.grad] + [p.grad for p in enc.parameters()]
    for got, want in zip(grads["chunked"], grads["reference"]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_chunked_uses_its_block_size_and_skips_future_keys(monkeypatch):
    """chunked_attention with block b calls the kernel ceil(L / b) times, each block against only
    the keys up to its last query."""
    calls = []
    original = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, k, v, **kw: calls.append((q.shape[-2], k.shape[-2])) or original(q, k, v, **kw))
    q, k, v, plan = prepared(encoding("xl:k=5"), 29, 29)
    chunked_attention(q, k, v, plan, block=8)
    assert calls == [(8, 8), (8, 16), (8, 24), (5, 29)]


@pytest.mark.parametrize("spec", ["xl:k=5", "fire", "transformer-xl", "kerple-log"])
@torch.no_grad()
def test_chunked_runs_the_fused_kernel_not_the_math_path(spec):
    """The fused CPU kernel takes only a 4-d float mask (a 3-d one silently runs the unfused math
    path, about 4x slower): every block of the chunked path must reach the fused kernel."""
    q, k, v, plan = prepared(encoding(spec), 150, 150)
    with torch.profiler.profile() as prof:
        chunked_attention(q, k, v, plan, block=64)
    ops = {e.key: e.count for e in prof.key_averages()}
    assert ops.get("aten::_scaled_dot_product_flash_attention_for_cpu") == 3
    assert "aten::_scaled_dot_product_attention_math" not in ops


def test_chunked_block_keeps_the_mask_within_its_budget():
    from relbench.attention import CHUNK_MASK_BYTES, chunk_block

    assert CHUNK_MASK_BYTES == 16 << 20
    assert chunk_block(4096, 8) == 128            # 16 MiB / (4 B x 8 heads x 4096 keys)
    assert chunk_block(1024, 8) == 512            # 512 would allow more; capped
    assert chunk_block(256, 4) == 512
    assert chunk_block(16384, 8) == 64            # 32 rows fit; floored at 64
    assert chunk_block(2048, 12) == 170


def test_toeplitz_gradient_is_the_diagonal_sum():
    values = torch.randn(3, 12, requires_grad=True)
    index = 6 + torch.arange(5)[:, None] - torch.arange(7)[None, :]   # first=6, q=5, k=7: indices 0..10
    weight = torch.randn(3, 5, 7)
    (toeplitz(values, 6, 5, 7) * weight).sum().backward()
    expected = torch.zeros(3, 12).index_add_(1, index.flatten(), weight.flatten(1))
    torch.testing.assert_close(values.grad, expected)
    torch.testing.assert_close(toeplitz(values, 6, 5, 7), values[:, index])


@pytest.mark.parametrize("spec, path", [("xl", "toeplitz"), ("kerple-log", "toeplitz"), ("shaw", "split")])
def test_auto_never_materialises_a_square_bias_for_long_inference(spec, path, monkeypatch):
    """At inference the default paths build no (H, L, L) tensor: the toeplitz path never asks the
    plan for a block, the split path only for band-sized ones."""
    enc = encoding(spec)
    q, k, v, plan = prepared(enc, 256, 256, batch=1)
    widest = []
    original = type(plan).block
    monkeypatch.setattr(type(plan), "block", lambda self, *a: widest.append(a[3] - a[2]) or original(self, *a))
    monkeypatch.setattr(type(plan), "full", lambda self: pytest.fail("materialised the square bias"))
    with torch.no_grad(), recording() as taken:
        attention(q, k, v, plan, "auto")
    assert dict(taken) == {path: 1}
    assert (not widest) if path == "toeplitz" else (widest and max(widest) < 256)


def test_split_refuses_to_drop_gradients():
    enc = encoding("xl:k=5")
    q, k, v = (t.requires_grad_() for t in qkv(LONG, LONG))
    q, k, plan = enc.prepare(q, k)
    with pytest.raises(UsageError, match="inference only"):
        attention(q, k, v, plan, "split")


def test_check_reads_declared_capabilities_without_building_anything(monkeypatch):
    monkeypatch.setattr(PositionEncoding, "plan", lambda *a, **k: pytest.fail("check built a plan"))
    for name in positions.names():
        monkeypatch.setattr(positions.get(name), "plan", lambda *a, **k: pytest.fail("check built a plan"))
    with pytest.raises(UsageError, match="per-query dot product"):
        check("flex", positions.scheme("transformer-xl"), device="cpu")
    with pytest.raises(UsageError, match="neither"):
        check("split", positions.scheme("kerple-log"))
    with pytest.raises(UsageError, match="neither"):
        check("split", positions.scheme("fire"))
    for name in ("fire", "shaw", "transformer-xl"):
        with pytest.raises(UsageError, match="i - j alone"):
            check("toeplitz", positions.scheme(name))
    for name in ("xl", "t5", "alibi", "kerple-log", "kerple-power", "sandwich", "dynamic", "rope", "none"):
        assert check("toeplitz", positions.scheme(name)) == "toeplitz"
    for name in ("xl", "t5", "t5-log2", "shaw", "alibi", "rope", "none", "learned"):
        assert check("split", positions.scheme(name)) == "split"
    assert check("flex", positions.scheme("shaw"), device="cuda", training=True) == "flex"
    assert check("auto", positions.scheme("transformer-xl"), device="cuda") == "auto"


def test_check_rejects_impossible_combinations():
    with pytest.raises(UsageError, match="no CPU backward"):
        check("flex", device="cpu", training=True)
    with pytest.raises(UsageError, match="inference only"):
        check("split", training=True)
    with pytest.raises(UsageError, match="runs on CPU"):
        check("split", device="cuda")
    with pytest.raises(UsageError, match="runs on CPU"):
        check("toeplitz", device="cuda")
    with pytest.raises(UsageError, match="inference only"):
        check("toeplitz", training=True)
    with pytest.raises(UsageError, match="did you mean"):
        check("chunkd")
    with pytest.raises(UsageError, match="did you mean"):
        attention(*qkv(4, 4), backend="chunkd")
    assert BACKENDS == ("auto", "reference", "sdpa", "chunked", "split", "toeplitz", "flex")


def test_recording_counts_one_call_per_layer_in_a_model():
    from relbench.model import GPT, ModelConfig

    model = GPT(ModelConfig(vocab_size=32, d_model=32, n_layers=3, n_heads=4, train_length=16, position="shaw:k=4"))
    with torch.no_grad(), recording() as taken:
        model(torch.zeros(1, 100, dtype=torch.long))
    assert dict(taken) == {"split": 3}
    with torch.no_grad(), recording() as taken:
        model(torch.zeros(1, 30, dtype=torch.long))                # 30 < horizon 4 + band block 32
    assert dict(taken) == {"chunked": 3}
    with recording() as taken:
        model(torch.zeros(1, 30, dtype=torch.long))
    assert dict(taken) == {"chunked": 3}                         # training
    model.config.attention = "split"
    with torch.no_grad(), recording() as taken:
        model(torch.zeros(1, 100, dtype=torch.long))
    assert dict(taken) == {"split": 3}


@pytest.mark.parametrize("q_len, k_len, block", [(29, 29, 8), (29, 29, 1), (9, 29, 4), (40, 40, 64)])
@torch.no_grad()
def test_transformer_xl_relative_shift_matches_the_gathered_terms(q_len, k_len, block):
    """Without gradients transformer-xl's chunked mask is the relative-shift view; it must equal
    the gathered block with -inf on future keys, block by block, and give the reference output."""

    enc = encoding("transformer-xl")
    q, k, v, plan = prepared(enc, q_len, k_len)
    offset = k_len - q_len
    for start in range(0, q_len, block):
        end = min(q_len, start + block)
        fast = plan.causal_block(offset + start, offset + end, offset + end)
        slow = BiasPlan.causal_block(plan, offset + start, offset + end, offset + end)
        assert fast.shape == slow.shape
        torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)
    ref = attention(q, k, v, plan, "reference")
    torch.testing.assert_close(chunked_attention(q, k, v, plan, block=block), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend, window", [("sdpa", 0), ("chunked", 0), ("auto", 40)])
def test_queries_and_keys_wider_than_values_reach_the_fused_kernel(backend, window):
    """PoPE's q and k are twice as wide as v (qk_width 2): torch's fused CPU kernel takes one head width
    and silently falls back to its math path (L x L materialised) on two, so `attention` pads v with zero
    columns for every path but the reference. The output keeps v's width and equals the reference's, the
    gradients too, and every call reaches the fused kernel."""
    torch.manual_seed(0)
    enc = positions.build("pope", n_heads=2, head_dim=16)
    q, k = torch.randn(1, 2, 150, 16, requires_grad=True), torch.randn(1, 2, 150, 16, requires_grad=True)
    v = torch.randn(1, 2, 150, 16, requires_grad=True)
    outputs, grads = {}, {}
    for name in (backend, "reference"):
        q_rot, k_rot, plan = enc.prepare(q, k)
        assert q_rot.shape[-1] == 32 and plan is None
        outputs[name] = attention(q_rot, k_rot, v, plan, name, window=window)
        (outputs[name] * torch.linspace(-1, 1, outputs[name].numel()).view_as(outputs[name])).sum().backward()
        grads[name] = [t.grad.clone() for t in (q, k, v)]
        for t in (q, k, v):
            t.grad = None
    assert outputs[backend].shape == (1, 2, 150, 16)
    torch.testing.assert_close(outputs[backend], outputs["reference"], rtol=1e-4, atol=1e-5)
    for got, want in zip(grads[backend], grads["reference"]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    with torch.no_grad(), torch.profiler.profile() as prof:
        q_rot, k_rot, plan = enc.prepare(q, k)
        attention(q_rot, k_rot, v, plan, backend, window=window)
    ops = {e.key: e.count for e in prof.key_averages()}
    assert ops.get("aten::_scaled_dot_product_flash_attention_for_cpu", 0) >= 1
    assert "aten::_scaled_dot_product_attention_math" not in ops
