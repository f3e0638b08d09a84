"""Layouts (a scheme per layer), sliding windows, attention sinks and query temperature
(positions/spec.py, model.py, attention/__init__.py): parsed once, built per layer, and each
against a by-hand reference."""

import dataclasses
import json
import math

import pytest
import torch
from attention_cases import encoding, qkv
from helpers import layer_input
from typer.testing import CliRunner

from relbench import positions
from relbench.attention import attention, chunked_attention, recording
from relbench.cli import app
from relbench.cost import memory, profiling
from relbench.errors import UsageError
from relbench.model import GPT, ModelConfig, query_temperature
from relbench.positions import forms

SMALL = {"vocab_size": 40, "d_model": 32, "n_heads": 2, "train_length": 16}


# ---- the spec, typed --------------------------------------------------------------------------------
def texts(spec: str, depth: int) -> list[str]:
    return [layer.text for layer in positions.parse(spec).layers(depth)]


def test_a_pattern_repeats_over_the_depth():
    assert texts("rope*3,none", 8) == ["rope", "rope", "rope", "none"] * 2
    assert texts("rope:window=64*3,none", 4) == ["rope:window=64"] * 3 + ["none"]
    assert texts("xl:k=64,shared_heads=true", 2) == ["xl:k=64,shared_heads=true"] * 2   # options, not layers
    spec = positions.parse("xl:k=64,shared_heads=true*2,t5:num_buckets=8,none")
    assert [(layer.scheme, layer.options) for layer in spec.pattern] == [
        ("xl", {"k": 64, "shared_heads": True}), ("xl", {"k": 64, "shared_heads": True}),
        ("t5", {"num_buckets": 8}), ("none", {})]
    assert spec.is_layout and [cls.name for cls in spec.schemes] == ["xl", "t5", "none"]
    assert not positions.parse("alibi:window=8*2").is_layout     # one kind of layer, twice


def test_layer_and_model_options_are_typed():
    layer = positions.parse("none:temperature=llama4,temperature_floor=4,sinks=true,window=7").pattern[0]
    assert (layer.window, layer.sinks, layer.temperature, layer.temperature_floor, layer.temperature_scale) == (
        7, True, "llama4", 4, 0.1)
    assert layer.options == {}                      # none of them is the scheme's own
    spec = positions.parse("xl:position_lr_scale=3*3,none")
    assert spec.position_lr_scale == 3.0 and spec.random_positions == 0
    assert positions.training_options("xl:ssmax=true,position_lr_scale=2") == {"ssmax": True, "position_lr_scale": 2.0}


@pytest.mark.parametrize("spec, depth, words", [
    ("rope*3,none", 2, "repeats a pattern of 4 layers; the model has 2"),
    ("rope*0", 2, "repeats a layer no times"),
    ("rope:window=-1", 2, "window=-1"),
    ("rope:chunk=-8", 2, "chunk=-8"),
    ("stickbreaking:chunk=8", 2, "computes its own attention"),
    ("stickbreaking:window=8", 2, "computes its own attention"),
    ("none:temperature_floor=4", 2, "add temperature=llama4"),
    ("none:temperature=hot", 2, "temperature=hot"),
    ("xl:position_lr_scale=2*1,none:position_lr_scale=3", 2, "give it once"),
    ("fox:random_positions=512*1,none", 2, '"fox" cannot place its tokens'),
    ("none:random_positions=512", 2, '"none" cannot place its tokens'),
    ("xl:k=64,foo", 2, 'option "foo" in variant "xl:k=64,foo" needs a value'),
    ("rope*1,nope:window=3", 2, "nope"),
    ("rope:window=8,none", 2, 'a layout (a scheme per layer) counts its layers, e.g. "rope:window=8*1,none"'),
    ("rope*3,none", 4, None),
])
def test_a_bad_spec_is_one_line(spec, depth, words):
    if words is None:
        positions.parse(spec).layers(depth)
        return
    with pytest.raises(UsageError) as error:
        positions.parse(spec).layers(depth)
    assert words in str(error.value) and "\n" not in str(error.value)


# ---- the model builds each layer's own scheme ----------------------------------------------------------
def seen_plans(model: GPT, length: int = 20) -> dict[int, object]:
    plans: dict[int, object] = {}
    tokens = torch.randint(0, SMALL["vocab_size"], (2, length), generator=torch.Generator().manual_seed(0))
    model(tokens, observe=lambda layer, q, k, plan: plans.__setitem__(layer, plan))
    return plans


def test_each_layer_gets_its_scheme_by_behaviour():
    """In "t5*3,none" the t5 layers share one table and see its bias; the NoPE layer has no bias and
    leaves queries and keys as projected (translation invariant: nothing in it reads a position)."""
    model = GPT(ModelConfig(position="t5*3,none", n_layers=4, **SMALL))
    assert model.layer_position == [0, 0, 0, 1] and [type(p).name for p in model.positions] == ["t5", "none"]
    plans = seen_plans(model)
    assert all(plans[i] is not None for i in range(3)) and plans[3] is None
    nope = model.position(3)
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 2, 9, 16, generator=g) for _ in range(2))       # (B, H, L, head_dim) of SMALL
    q2, k2, plan = nope.prepare(q, k, x=layer_input(nope, 2, 9))
    assert plan is None and torch.equal(q2, q) and torch.equal(k2, k)
    rotated = GPT(ModelConfig(position="rope*1,none", n_layers=2, **SMALL)).position(0)
    assert not torch.equal(rotated.prepare(q, k)[0], q)          # the rope layer does rotate


def test_a_one_scheme_spec_builds_as_before():
    """Checkpoints keep their parameter names: one module for a scheme shared across layers, one per layer otherwise."""
    assert len(GPT(ModelConfig(position="t5", n_layers=3, **SMALL)).positions) == 1
    xl = GPT(ModelConfig(position="xl", n_layers=3, **SMALL))
    assert len(xl.positions) == 3 and xl.layer_position == [0, 1, 2]
    per_layer = GPT(ModelConfig(position="xl*2,none", n_layers=3 * 2, **SMALL))   # pattern of 3, twice
    assert per_layer.layer_position == [0, 1, 2, 3, 4, 2]     # xl one per layer, none one for its layers


@pytest.mark.parametrize("spec", ["t5*3,none", "rope:window=4,sinks=true*3,none:ssmax=true", "xl*1,alibi:sinks=true",
                                  "learned*1,none"])
def test_parameter_count_counts_each_layer(spec):
    config = ModelConfig(position=spec, n_layers=4, **SMALL)
    model = GPT(config)
    assert memory.parameter_count(config) == model.n_params()
    assert memory.parameter_count(config, positions_only=True) == model.n_params(positions_only=True)


def test_sinks_start_from_the_seed_and_train():
    model = GPT(ModelConfig(position="alibi:sinks=true", n_layers=2, **SMALL), seed=4)
    again = GPT(ModelConfig(position="alibi:sinks=true", n_layers=2, **SMALL), seed=4)
    sinks = model.blocks[0].attn.sinks
    assert torch.equal(sinks, again.blocks[0].attn.sinks) and 0 < float(sinks.abs().max()) < 0.1
    tokens = torch.randint(0, SMALL["vocab_size"], (2, 20), generator=torch.Generator().manual_seed(0))
    model(tokens).square().mean().backward()
    assert sinks.grad is not None and float(sinks.grad.abs().max()) > 0


def test_a_form_reads_the_layers_it_applies_to():
    model = GPT(ModelConfig(position="rope*1,none", n_layers=2, **SMALL))
    form = forms.apply(model, "rope*1,none@yarn:factor=4")
    assert model.position(0).form is form and model.position(1).form is None
    with pytest.raises(UsageError, match='does not apply to "t5, none"'):
        forms.parse_form("t5*1,none@yarn")


# ---- windows and sinks against a by-hand softmax --------------------------------------------------------
def by_hand(q, k, v, bias, window=0, sinks=None, chunk=0):
    """softmax over [keys the query sees, the sink] of q.k / sqrt(d) + bias, causal, window W: i - j < W,
    chunks of C: i // C == j // C."""
    q_len, k_len = q.shape[-2], k.shape[-2]
    logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if bias is not None:
        logits = logits + bias
    i = torch.arange(k_len - q_len, k_len)[:, None]
    j = torch.arange(k_len)[None, :]
    hidden = (j > i) | ((i - j >= window) if window else torch.zeros_like(j > i))
    if chunk:
        hidden = hidden | (i // chunk != j // chunk)
    weights = logits.masked_fill(hidden, float("-inf")).exp()
    total = weights.sum(-1, keepdim=True) + (0 if sinks is None else sinks.view(1, -1, 1, 1).exp())
    return (weights / total) @ v


@pytest.mark.parametrize("spec", ["none", "alibi", "xl:k=5", "fox", "shaw:k=3"])
@pytest.mark.parametrize("window, sink", [(6, False), (0, True), (6, True)])
@pytest.mark.parametrize("q_len, k_len", [(40, 40), (9, 40)])
@torch.no_grad()
def test_windows_and_sinks_on_every_path(spec, window, sink, q_len, k_len):
    enc = encoding(spec)
    q, k, v = qkv(q_len, k_len)
    q, k, plan = enc.prepare(q, k, x=layer_input(enc, 2, k_len))
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0]) if sink else None
    want = by_hand(q, k, v, None if plan is None else plan.full(), window, sinks)
    for backend in ("reference", "chunked", "auto", "toeplitz", "split", "sdpa"):
        with recording() as taken:
            got = attention(q, k, v, plan, backend, window, sinks)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=backend)
        assert set(taken) <= {"reference", "chunked"}


@torch.no_grad()
def test_the_band_path_skips_the_keys_outside_the_window():
    """At 1,300 keys and a window of 50 the chunked path's blocks start inside the sequence (the band),
    a key 50 or more before a query has zero weight (its value changes nothing), and the result is
    the reference's."""
    enc = encoding("alibi")
    q, k, v = qkv(1300, 1300, batch=1)
    q, k, plan = enc.prepare(q, k)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    got = attention(q, k, v, plan, "chunked", 50, sinks)
    torch.testing.assert_close(got, attention(q, k, v, plan, "reference", 50, sinks), rtol=1e-4, atol=1e-5)
    far = v.clone()
    far[..., :1200, :] = 1e3                          # keys out of the window of every query from 1249 on
    moved = attention(q, k, far, plan, "chunked", 50, sinks)
    assert torch.equal(moved[..., 1249:, :], got[..., 1249:, :]) and not torch.equal(moved[..., 1248, :], got[..., 1248, :])


def test_gradients_of_a_windowed_sink_layer_match_the_reference():
    enc = encoding("alibi")
    grads = {}
    for backend in ("reference", "chunked"):
        q, k, v = (t.requires_grad_() for t in qkv(37, 37))
        sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], requires_grad=True)
        qq, kk, plan = enc.prepare(q, k)
        attention(qq, kk, v, plan, backend, 8, sinks).square().sum().backward()
        grads[backend] = [q.grad, k.grad, v.grad, sinks.grad]
    for a, b in zip(grads["reference"], grads["chunked"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("spec", ["none", "alibi", "fox"])
@pytest.mark.parametrize("chunk, window, sink", [(8, 0, False), (8, 5, False), (16, 0, True), (64, 0, False)])
@pytest.mark.parametrize("q_len, k_len", [(40, 40), (9, 40)])
@torch.no_grad()
def test_chunks_on_every_path(spec, chunk, window, sink, q_len, k_len):
    enc = encoding(spec)
    q, k, v = qkv(q_len, k_len)
    q, k, plan = enc.prepare(q, k, x=layer_input(enc, 2, k_len))
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0]) if sink else None
    want = by_hand(q, k, v, None if plan is None else plan.full(), window, sinks, chunk)
    for backend in ("reference", "chunked", "auto", "toeplitz", "split", "sdpa"):
        with recording() as taken:
            got = attention(q, k, v, plan, backend, window, sinks, chunk)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=backend)
        assert set(taken) <= {"reference", "chunked"}


@torch.no_grad()
def test_the_chunked_path_starts_each_block_at_its_chunk():
    """At 1,300 keys in chunks of 100 the result is the reference's, and the values of every earlier
    chunk change nothing (the query at 1,200 starts a chunk: it sees itself alone)."""
    enc = encoding("alibi")
    q, k, v = qkv(1300, 1300, batch=1)
    q, k, plan = enc.prepare(q, k)
    got = attention(q, k, v, plan, "chunked", 0, None, 100)
    torch.testing.assert_close(got, attention(q, k, v, plan, "reference", 0, None, 100), rtol=1e-4, atol=1e-5)
    far = v.clone()
    far[..., :1200, :] = float("inf")       # a key that is masked but still read makes 0 * inf = nan
    moved = chunked_attention(q, k, far, plan, block=100, chunk=100)   # a block per chunk: the earlier ones unread
    torch.testing.assert_close(moved[..., 1200:, :], got[..., 1200:, :], rtol=1e-5, atol=1e-6)
    assert not moved[..., 1199, :].isfinite().any()                      # its own chunk holds the changed values
    assert attention(q, k, far, plan, "reference", 0, None, 100)[..., 1200:, :].isnan().all()   # the mask alone reads them
    torch.testing.assert_close(got[..., 1200, :], v[..., 1200, :])


def test_gradients_of_a_chunked_layer_match_the_reference():
    enc = encoding("alibi")
    grads = {}
    for backend in ("reference", "chunked"):
        q, k, v = (t.requires_grad_() for t in qkv(37, 37))
        qq, kk, plan = enc.prepare(q, k)
        attention(qq, kk, v, plan, backend, 0, None, 8).square().sum().backward()
        grads[backend] = [q.grad, k.grad, v.grad]
    for a, b in zip(grads["reference"], grads["chunked"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_a_chunked_layer_in_a_model_never_reads_an_earlier_chunk():
    """"none:chunk=8": changing tokens 0-1 changes no output from position 8 on at any depth (no layer
    crosses a chunk), where a window of 8 lets the change through by the second layer."""
    tokens = torch.randint(0, SMALL["vocab_size"], (1, 20), generator=torch.Generator().manual_seed(1))
    edited = tokens.clone()
    edited[0, :2] = (tokens[0, :2] + 1) % SMALL["vocab_size"]
    for spec, same in (("none:chunk=8", True), ("none:window=8", False)):
        model = GPT(ModelConfig(position=spec, n_layers=2, **SMALL)).eval()
        with torch.no_grad():
            a, b = model(tokens), model(edited)
        assert torch.equal(a[0, 8:], b[0, 8:]) is same, spec
        assert not torch.equal(a[0, :8], b[0, :8])


def test_a_windowed_layer_in_a_model_sees_only_its_window():
    """Changing the first tokens changes no output of "none:window=4" at positions 8 and beyond (two
    layers: a receptive field of 2 x 3 earlier tokens), and does with full attention."""
    tokens = torch.randint(0, SMALL["vocab_size"], (1, 20), generator=torch.Generator().manual_seed(1))
    edited = tokens.clone()
    edited[0, :2] = (tokens[0, :2] + 1) % SMALL["vocab_size"]
    for spec, same in (("none:window=4", True), ("none", False)):
        model = GPT(ModelConfig(position=spec, n_layers=2, **SMALL)).eval()
        with torch.no_grad():
            a, b = model(tokens), model(edited)
        assert torch.equal(a[0, 8:], b[0, 8:]) is same, spec


# ---- query temperature --------------------------------------------------------------------------------
def test_llama4_temperature_by_hand():
    """floor 4, scale 0.1: positions 0-2 floor((p + 1) / 4) = 0, factor 1; 3-6 give 1 + 0.1 ln 2; 7-10 1 + 0.1 ln 3."""
    layer = positions.parse("none:temperature=llama4,temperature_floor=4").pattern[0]
    got = query_temperature(layer, 16, 0, 11)
    want = torch.tensor([1.0] * 3 + [1 + 0.1 * math.log(2)] * 4 + [1 + 0.1 * math.log(3)] * 4)
    torch.testing.assert_close(got, want)
    default = positions.parse("none:temperature=llama4").pattern[0]       # floor: the training length
    assert query_temperature(default, 8, 6, 8).tolist() == pytest.approx([1.0, 1 + 0.1 * math.log(2)])


def test_logn_temperature_is_the_logn_forms_factor_per_query():
    layer = positions.parse("none:temperature=logn").pattern[0]
    got = query_temperature(layer, 8, 6, 16)
    assert got.tolist() == pytest.approx([forms.logn_scale(p + 1, 8) for p in range(6, 16)])
    assert got[:2].tolist() == [1.0, 1.0] and got[-1].item() == pytest.approx(math.log(16) / math.log(8))


def test_temperature_scales_the_queries_of_its_layer_only():
    seen = {}
    model = GPT(ModelConfig(position="rope*1,none:temperature=llama4,temperature_floor=2", n_layers=2, **SMALL))
    plain = GPT(ModelConfig(position="rope*1,none", n_layers=2, **SMALL))
    tokens = torch.randint(0, SMALL["vocab_size"], (1, 40), generator=torch.Generator().manual_seed(0))
    for name, m in (("t", model), ("p", plain)):
        m(tokens, observe=lambda layer, q, k, plan, name=name: seen.__setitem__((name, layer), q))
    torch.testing.assert_close(seen["t", 0], seen["p", 0])     # past the training length: Llama 4's default would act
    factor = query_temperature(model.blocks[1].attn.layer, 16, 0, 40)
    torch.testing.assert_close(seen["t", 1], seen["p", 1] * factor[:, None])


# ---- the command line -------------------------------------------------------------------------------
def test_train_extrapolate_and_report_a_layout(tmp_path):
    run = str(tmp_path / "run")
    trained = CliRunner().invoke(app, ["train", "--preset", "tiny", "--variants", "rope*1,none", "rope:window=8,sinks=true",
                                       "--steps", "4", "--run-dir", run])
    assert trained.exit_code == 0, trained.output
    evaluated = CliRunner().invoke(app, ["extrapolate", "--run-dir", run, "--lengths", "32", "64", "--task", "perplexity"])
    assert evaluated.exit_code == 0, evaluated.output
    reported = CliRunner().invoke(app, ["report", "--run-dir", run])
    assert reported.exit_code == 0, reported.output
    text = (tmp_path / "run" / "report.md").read_text()
    assert "rope*1,none" in text and "rope:window=8,sinks=true" in text
    deep = CliRunner().invoke(app, ["train", "--preset", "tiny", "--variants", "rope*3,none", "--run-dir",
                                    str(tmp_path / "deep")])
    assert deep.exit_code != 0 and "the model has 2" in deep.output.splitlines()[-1]


def test_the_memory_estimate_counts_each_layer_kind():
    """What a step saves is linear in the layers: a layout of two kinds saves between the two one-scheme
    models at every batch, its weights are its own parameters, and two kinds that save the same (RoPE at
    two bases) read as either alone."""
    model = ModelConfig(position="none", n_layers=2, **SMALL)

    def line(spec):
        config = dataclasses.replace(model, position=spec)
        return config, memory.saved_line(json.dumps(dataclasses.asdict(config), sort_keys=True), "fp32")

    (_, none), (_, t5), (layout, both) = line("none"), line("t5"), line("t5*1,none")
    for batch in (1, 4, 32):
        low, high = sorted(batch * x[1] + x[2] for x in (none, t5))
        assert low < batch * both[1] + both[2] < high
    assert both[0] == memory.FLOAT * 4 * GPT(layout).n_params()
    assert memory.step_bytes(line("rope*1,rope:base=500")[0], 4) == memory.step_bytes(line("rope")[0], 4)


def test_the_dry_run_times_a_layout(tmp_path):
    result = CliRunner().invoke(app, ["train", "--preset", "tiny", "--variants", "rope:window=8*1,none", "--dry-run",
                                      "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "rope:window=8*1,none" in result.output and not (tmp_path / "run").exists()


def test_a_layouts_cost_row_is_its_layers_mean():
    rows = [{"variant": "rope:window=8", "status": "ok", "message": "", "path": "chunked", "train_path": "chunked",
             "bias_ms": 1.0, "attention_ms": 2.0, "attention_peak_mb": 5.0, "train_ms": 4.0}] * 3
    rows = rows + [{"variant": "none", "status": "ok", "message": "", "path": "sdpa", "train_path": "sdpa",
                    "bias_ms": 0.0, "attention_ms": 6.0, "attention_peak_mb": 9.0, "train_ms": None}]
    row = profiling.layout_row("rope:window=8*3,none", rows)
    assert (row["variant"], row["path"], row["bias_ms"], row["attention_ms"]) == ("rope:window=8*3,none", "chunked+sdpa",
                                                                                 0.75, 3.0)
    assert row["attention_peak_mb"] == 9.0 and row["train_ms"] is None
    failed = profiling.layout_row("x", rows[:1] + [{**rows[-1], "status": "oom", "message": "too long"}])
    assert (failed["status"], failed["message"]) == ("oom", "too long")


def test_the_stacks_preset_builds_every_layout_at_its_depth():
    from relbench import config

    exp = config.experiment(preset="stacks")
    assert exp.model.n_layers == 4 and "rope*3,none" in exp.variants
    for spec in exp.variants:
        layout = positions.parse(spec).layers(exp.model.n_layers)
        assert len(layout) == 4 and GPT(dataclasses.replace(exp.model, position=spec)).n_params() > 0


def test_random_positions_in_a_layout_reach_the_layers_that_place_them():
    """rope layers read the drawn positions; a none layer has nothing to place and reads none: the
    layout trains with randomized positions, and its rope layer sees them (the logits move)."""
    model = GPT(ModelConfig(vocab_size=256, d_model=32, n_layers=2, n_heads=2, train_length=16,
                            position="rope:random_positions=64*1,none"))
    assert model.random_positions == 64
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    drawn = torch.stack([torch.sort(torch.randperm(64, generator=torch.Generator().manual_seed(s))[:16]).values
                         for s in (1, 2)])
    moved = model(tokens, positions=drawn)
    assert moved.shape == (2, 16, 256) and not torch.allclose(moved, model(tokens))
    shifted = model(tokens, positions=torch.arange(16).expand(2, 16) + 5)     # rope is relative: a shift is nothing
    assert torch.allclose(shifted, model(tokens), atol=1e-5)
