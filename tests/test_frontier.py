"""Data-dependent biases (FoX, CoPE, DAPE): hand-computed values against each paper's formula, the
chunked path (the one training and inference take) against the reference path at sizes where it
runs several blocks, forward and backward, and a tiny training run of each through the CLI."""

import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from helpers import layer_input

from relbench import positions
from relbench.attention import attention, chunked_attention, recording
from relbench.positions.cope import CopePlan
from relbench.positions.fox import anchored_log_forget

H, D = 4, 8
FRONTIER = ["fox", "cope", "dape", "dape:base=alibi"]


def build(spec, **options):
    enc = positions.build_spec(spec, n_heads=H, head_dim=D, train_length=32, **options)
    enc.reset_parameters(torch.Generator().manual_seed(0))
    return enc


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ---- FoX -------------------------------------------------------------------------------------------
FORGET = [0.5, 0.25, 0.8, 0.9, 0.1, 0.99, 0.6, 0.3]   # f_t, chosen by hand for t = 0 .. 7


def _fox_with_gates(gates):
    """FoX whose gate for head h at position t is gates[t] ** (h + 1): head h reads channel h of the
    layer input alone (unit weight, zero bias), which carries the logit of that gate."""
    enc = build("fox")
    L = len(gates)
    x = torch.zeros(1, L, H * D)
    with torch.no_grad():
        enc.gate.weight.zero_()
        enc.gate.bias.zero_()
        for h in range(H):
            enc.gate.weight[h, h] = 1.0
            for t, f in enumerate(gates):
                f_h = f ** (h + 1)
                x[0, t, h] = math.log(f_h / (1 - f_h))            # sigmoid(x) = f_h
    return enc, x


def test_fox_bias_is_the_sum_of_log_forget_gates_after_the_key():
    """bias(i, j) = sum_{t = j+1 .. i} log f_t for j <= i, with the gates set by hand (head h gets
    f_t^(h+1)): 0 on the diagonal, log f_i for the key just before; queries the last 5 of 8."""
    enc, x = _fox_with_gates(FORGET)
    L, q_len = len(FORGET), 5
    bias = enc.plan(q_len, L, x=x).full()                                        # (1, H, 5, 8)
    assert bias.shape == (1, H, q_len, L)
    for h in range(H):
        for a in range(q_len):
            i = L - q_len + a
            for j in range(i + 1):
                want = sum((h + 1) * math.log(FORGET[t]) for t in range(j + 1, i + 1))
                assert bias[0, h, a, j].item() == pytest.approx(want, abs=1e-5), (h, i, j)
    assert bias[0, 0, 0, 3].item() == 0.0 and bias[0, 0, 0, 2].item() == pytest.approx(math.log(0.9), abs=1e-6)


def test_fox_anchored_sums_are_exact_for_every_anchor():
    log_f = F.logsigmoid(randn(2, H, 40, seed=1))
    for anchor, lo, hi in [(0, 0, 40), (17, 0, 40), (17, 5, 30), (39, 10, 40)]:
        g = anchored_log_forget(log_f, anchor, lo, hi)
        assert g.shape == (2, H, hi - lo) and torch.equal(g[..., anchor - lo], torch.zeros(2, H))
        for s, t in [(lo, hi - 1), (anchor, hi - 1), (lo, anchor), (lo + 1, lo + 3)]:
            torch.testing.assert_close(g[..., t - lo] - g[..., s - lo], log_f[..., s + 1: t + 1].sum(-1))


def test_cable_is_fox_with_its_gate_negated():
    """Cable ("Context-aware Biases for Length Extrapolation", 2025; axiomlab/Cable, src/Cable.py): per
    head b_t = cumsum_s<=t -softplus(h(x_s)), h a linear map of the attention input, and bias(i, j) =
    b_i - b_j. Since -softplus(z) = log sigmoid(-z), that is FoX's sum of log f_t over t = j+1 .. i
    with the gate's weight and bias negated: no new class."""
    enc = build("fox")
    L = 12
    x = randn(2, L, H * D, seed=3)
    weight, bias = randn(H, H * D, seed=4) * 0.5, randn(H, seed=5)
    with torch.no_grad():
        enc.gate.weight.copy_(-weight)
        enc.gate.bias.copy_(-bias)
    b = torch.cumsum(-F.softplus(x @ weight.T + bias), dim=1).permute(0, 2, 1)      # (B, H, L): Cable's
    cable = b.unsqueeze(3) - b.unsqueeze(2)
    causal = torch.ones(L, L).tril().bool()
    fox = enc.plan(L, L, x=x).full()
    torch.testing.assert_close(fox[..., causal], cable[..., causal], rtol=1e-5, atol=1e-5)
    assert torch.allclose(-F.softplus(x[..., 0]), F.logsigmoid(-x[..., 0]), atol=1e-6)


def test_fox_is_trained_with_its_own_gates_and_needs_the_input():
    enc = build("fox:bias_init=3")
    assert torch.equal(enc.gate.bias.detach(), torch.full((H,), 3.0))
    assert positions.scheme("fox").input_dependent and not positions.scheme("fox").rotates
    with pytest.raises(positions.base.UsageError, match="layer input"):
        enc.prepare(randn(1, H, 4, D), randn(1, H, 4, D))


# ---- CoPE ------------------------------------------------------------------------------------------
def _cope(npos_max):
    enc = build("cope", npos_max=npos_max)
    with torch.no_grad():
        enc.embeddings.copy_(randn(D, npos_max, seed=3))
    return enc


def test_cope_counts_every_key_when_the_gates_are_open():
    """Every gate 1 (q.k / sqrt(d) = 100 everywhere): p_ij = i - j + 1 (the key itself counts),
    clipped at npos_max - 1 = 5; the bias is q_i . e[p_ij]; queries the last 6 of 10."""
    enc = _cope(6)
    q = torch.zeros(1, H, 6, D)
    q[..., 0] = 10.0
    k = torch.zeros(1, H, 10, D)
    k[..., 0] = 10.0 * math.sqrt(D)                              # q.k / sqrt(D) = 100: sigmoid(100) == 1 in fp32
    bias = enc.plan(6, 10, q, k).full()
    e = enc.embeddings.detach()
    for a in range(6):
        i = 4 + a
        for j in range(i + 1):
            p = min(i - j + 1, 5)
            torch.testing.assert_close(bias[0, :, a, j], (q[0, :, a] @ e[:, p]))


def test_cope_interpolates_fractional_positions():
    """Keys of zero: every gate sigmoid(0) = 1/2, so p_ij = (i - j + 1) / 2; at an odd count the
    position is halfway and the term is the mean of the two neighbouring embeddings' products."""
    enc = _cope(8)
    q, k = randn(1, H, 7, D, seed=4), torch.zeros(1, H, 7, D)
    bias = enc.plan(7, 7, q, k).full()
    e = enc.embeddings.detach()
    for i in range(7):
        for j in range(i + 1):
            p = (i - j + 1) / 2
            lo, hi = math.floor(p), math.ceil(p)
            want = (1 - (p - lo)) * (q[0, :, i] @ e[:, lo]) + (p - lo) * (q[0, :, i] @ e[:, hi])
            torch.testing.assert_close(bias[0, :, i, j], want, msg=f"{i}, {j}")


def test_cope_counts_only_keys_up_to_the_query():
    """Future keys close no gate of the past: a key after query i changes nothing in its row."""
    enc = _cope(16)
    q, k = randn(1, H, 9, D, seed=5), randn(1, H, 9, D, seed=6)
    k2 = k.clone()
    k2[..., 8, :] += 3.0
    a, b = enc.plan(9, 9, q, k).full(), enc.plan(9, 9, q, k2).full()
    torch.testing.assert_close(a[..., :8, :8], b[..., :8, :8], rtol=0, atol=0)


def test_cope_chunked_builds_rows_of_blocks_never_the_square(monkeypatch):
    """The chunked path asks CoPE for blocks of query rows against the keys up to the block: memory
    O(block x L), never (L, L) per head."""
    enc = _cope(16)
    q, k, v = randn(1, H, 200, D, seed=7), randn(1, H, 200, D, seed=8), randn(1, H, 200, D, seed=9)
    plan = enc.plan(200, 200, q, k)
    want = attention(q, k, v, plan, "reference")
    shapes = []
    original = CopePlan._term
    monkeypatch.setattr(CopePlan, "_term", lambda self, *a: shapes.append(a) or original(self, *a))
    monkeypatch.setattr(CopePlan, "full", lambda self: pytest.fail("materialised the square bias"))
    with torch.no_grad():
        got = chunked_attention(q, k, v, plan, block=64)
    assert shapes == [(0, 64, 0, 64), (64, 128, 0, 128), (128, 192, 0, 192), (192, 200, 0, 200)]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# ---- DAPE ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("base", ["kerple", "alibi"])
def test_dape_with_its_mlp_zeroed_is_its_base(base):
    enc = build("dape", base=base)
    with torch.no_grad():
        enc.mlp[2].weight.zero_()
        enc.mlp[2].bias.zero_()
    q, k = randn(2, H, 5, D, seed=1), randn(2, H, 9, D, seed=2)
    reference = positions.build("kerple-log" if base == "kerple" else "alibi", n_heads=H, head_dim=D)
    reference.load_state_dict(enc.base.state_dict())
    want = reference.plan(5, 9).full()                                           # (H, 5, 9)
    torch.testing.assert_close(enc.plan(5, 9, q, k).full(), want.expand(2, -1, -1, -1))


def test_dape_refines_each_pair_from_its_logits_and_base_bias():
    """bias(b, :, i, j) = B[:, i, j] + MLP([A[b, :, i, j]; B[:, i, j]]), A = q_i . k_j / sqrt(d), the
    MLP taking the H logits then the H base biases of the pair (the heads mixed)."""
    enc = build("dape")
    q, k = randn(2, H, 4, D, seed=3), randn(2, H, 7, D, seed=4)
    bias = enc.plan(4, 7, q, k).full()
    base = enc.base.plan(4, 7).full()
    w1, b1, w2, b2 = enc.mlp[0].weight, enc.mlp[0].bias, enc.mlp[2].weight, enc.mlp[2].bias
    for b in range(2):
        for a in range(4):
            for j in range(7):
                logits = torch.stack([q[b, h, a] @ k[b, h, j] for h in range(H)]) / math.sqrt(D)
                features = torch.cat([logits, base[:, a, j]])
                want = base[:, a, j] + w2 @ F.leaky_relu(w1 @ features + b1) + b2
                torch.testing.assert_close(bias[b, :, a, j], want, msg=f"{b}, {a}, {j}")


def test_dape_options_are_checked():
    with pytest.raises(positions.base.UsageError, match="base"):
        build("dape", base="rope")


# ---- every frontier variant: fast path against reference, training, commands -------------------------
@pytest.mark.parametrize("spec", FRONTIER)
@pytest.mark.parametrize("q_len, k_len", [(70, 70), (23, 70)])
def test_chunked_matches_reference_forward_and_backward(spec, q_len, k_len):
    """The chunked path in blocks of 16 rows (several blocks, a ragged last one, a query suffix)
    equals the reference path, outputs and gradients to q, k, v, the layer input and the scheme's
    own parameters: training runs through it."""
    enc = build(spec)
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(0.3 * randn(*p.shape, seed=11))
    enc.project_parameters()
    results = {}
    for path in ("reference", "chunked"):
        enc.zero_grad()
        q, k, v = randn(2, H, q_len, D, seed=1), randn(2, H, k_len, D, seed=2), randn(2, H, k_len, D, seed=3)
        x = layer_input(enc, 2, k_len, seed=4)
        for t in (q, k, v, x):
            t.requires_grad_()
        q_rot, k_rot, plan = enc.prepare(q, k, x=x)
        assert plan.requires_grad
        out = attention(q_rot, k_rot, v, plan, "reference") if path == "reference" else \
            chunked_attention(q_rot, k_rot, v, plan, block=16)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        used = [t.grad for t in (q, k, v, x) if t.grad is not None]
        results[path] = [out.detach(), *used, *(p.grad for p in enc.parameters())]
    assert all(g is not None and g.abs().sum() > 0 for g in results["chunked"][-len(list(enc.parameters())):])
    torch.testing.assert_close(results["chunked"][0], results["reference"][0], rtol=1e-5, atol=1e-5)
    for got, want in zip(results["chunked"][1:], results["reference"][1:]):   # gradients: sums over every pair
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("spec", FRONTIER)
@torch.no_grad()
def test_auto_never_runs_a_distance_path(spec):
    """CPU inference: FoX's separable bias on the linear split (its fast path), CoPE and DAPE chunked;
    none on a path that assumes a distance-only bias or a horizon. Training: chunked."""
    enc = build(spec)
    q, k, v = randn(1, H, 150, D, seed=1), randn(1, H, 150, D, seed=2), randn(1, H, 150, D, seed=3)
    q_rot, k_rot, plan = enc.prepare(q, k, x=layer_input(enc, 1, 150))
    assert not plan.distance_only and plan.horizon is None and plan.linear_slopes is None
    assert plan.separable == (spec == "fox")
    with recording() as taken:
        out = attention(q_rot, k_rot, v, plan, "auto")
    assert dict(taken) == {"split-linear" if spec == "fox" else "chunked": 1}
    torch.testing.assert_close(out, attention(q_rot, k_rot, v, plan, "reference"), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", FRONTIER)
def test_a_gpt_trains_each_and_gradients_reach_the_scheme(spec):
    from relbench.model import GPT, ModelConfig

    model = GPT(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=H, train_length=24, position=spec))
    assert len(model.positions) == 2                                          # one per layer
    tokens = torch.randint(0, 64, (2, 25), generator=torch.Generator().manual_seed(0))
    logits = model(tokens[:, :-1])
    F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    grads = {name: p.grad for name, p in model.positions.named_parameters()}
    assert grads and all(g is not None and g.isfinite().all() for g in grads.values())
    assert any(g.abs().sum() > 0 for g in grads.values())


def test_train_and_extrapolate_commands_run_each(tmp_path):
    from typer.testing import CliRunner

    from relbench.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["train", "--preset", "tiny", "--variants", "fox", "cope", "dape", "--steps", "3",
                                 "--run-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["extrapolate", "--run-dir", str(tmp_path), "--lengths", "32", "64",
                                 "--mode", "nonoverlap"])
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "extrapolation.csv")
    assert set(rows["variant"]) == {"fox", "cope", "dape"} and (rows["status"] == "ok").all()
    assert (rows["ppl"] > 1).all()
    paths = rows.groupby("variant")["path"].agg(set)
    assert paths.to_dict() == {"fox": {"split-linear"}, "cope": {"chunked"}, "dape": {"chunked"}}


def test_profile_and_variants_commands_run_each(tmp_path):
    from typer.testing import CliRunner

    from relbench.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["profile", "--lengths", "64", "--variants", "fox", "cope", "dape", "--repeats", "1",
                                 "--heads", "2", "--head-dim", "8", "--run-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "profile.csv")
    assert set(rows["variant"]) == {"fox", "cope", "dape"} and (rows["status"] == "ok").all()
    assert (rows["bias_ms"] > 0).all() and (rows["attention_ms"] > 0).all()
    result = runner.invoke(app, ["variants", "--heads", "4"], env={"COLUMNS": "250"})
    assert result.exit_code == 0 and all(name in result.output for name in ("fox", "cope", "dape"))
