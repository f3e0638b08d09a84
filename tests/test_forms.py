"""Evaluation forms (positions/forms.py, rope_forms.py, table_forms.py): each form against a hand
computation from its paper, on every attention path, through the model, and through the CLI."""

import hashlib
import math

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from relbench import positions
from relbench.attention import attention, check, recording
from relbench.cli import app
from relbench.errors import UsageError
from relbench.model import GPT, ModelConfig
from relbench.positions import forms
from relbench.positions.plan import causal_mask
from relbench.positions.rope import apply_rotary, rope_angles, rope_frequencies
from relbench.positions.rope_forms import ntk_base

H, D = 2, 16


def encoding(spec, train_length=16, head_dim=D):
    """The trained variant of `spec` with random parameters, its form (if any) set on it."""
    enc = positions.build_spec(forms.trained_spec(spec), n_heads=H, head_dim=head_dim, train_length=train_length)
    enc.reset_parameters(torch.Generator().manual_seed(0))
    with torch.no_grad():
        for p in enc.parameters():
            p.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    enc.form = forms.parse_form(spec)
    return enc


def qkv(length, batch=2, head_dim=D):
    g = torch.Generator().manual_seed(2)
    return [torch.randn(batch, H, length, head_dim, generator=g) for _ in range(3)]


# ---- rotary forms ---------------------------------------------------------------------------------
def test_pi_at_factor_2_rotates_position_2m_as_the_trained_model_rotates_m():
    enc, plain = encoding("rope@pi:factor=2"), encoding("rope")
    vector = torch.randn(1, H, 1, D)
    q = vector.expand(1, H, 64, D).contiguous()
    q_pi, _ = enc.rotate(q, q)
    q_base, _ = plain.rotate(q, q)
    torch.testing.assert_close(q_pi[..., ::2, :], q_base[..., :32, :], rtol=0, atol=1e-5)
    assert not torch.allclose(q_pi[..., 1:32, :], q_base[..., 1:32, :], atol=1e-3)


def test_pi_without_a_factor_follows_the_evaluated_length():
    enc = encoding("rope@pi")      # training length 16
    theta = rope_frequencies(D)
    torch.testing.assert_close(enc.frequencies(64), theta / 4)
    torch.testing.assert_close(enc.frequencies(16), theta)      # at (and below) training: as trained
    torch.testing.assert_close(enc.frequencies(8), theta)


def test_ntk_multiplies_the_base_by_factor_to_the_d_over_d_minus_2():
    assert ntk_base(10000.0, 4.0, 16) == pytest.approx(10000 * 4 ** (16 / 14))
    freq = encoding("rope@ntk:factor=4").frequencies(16)
    theta = rope_frequencies(D)
    assert freq[0] == 1.0                                                     # highest frequency kept
    torch.testing.assert_close(freq[-1], theta[-1] / 4, rtol=1e-5, atol=0)   # lowest one interpolated by s
    torch.testing.assert_close(freq, (10000 * 4 ** (16 / 14)) ** (-torch.arange(0, 16, 2) / 16.0), rtol=1e-5, atol=0)


# YaRN at L_train = 1024, d = 16, base 10^4, s = 8: r_i = 1024 theta_i / (2 pi) = 162.97, 51.54, 16.30,
# 5.154, 1.630, 0.515, 0.163, 0.052; gamma = (r - 1) / 31 on the ramp, 1 above 32, 0 below 1
YARN_GAMMA = [1.0, 1.0, 0.4934667, 0.1339907, 0.0203144, 0.0, 0.0, 0.0]
YARN_CODE_GAMMA = [1.0, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0, 0.0]   # index ramp: floor(1.414) = 1 .. ceil(4.424) = 5


@pytest.mark.parametrize("ramp, gamma", [("paper", YARN_GAMMA), ("code", YARN_CODE_GAMMA)])
def test_yarn_frequencies_per_dimension_match_the_paper(ramp, gamma):
    enc = encoding(f"rope@yarn:factor=8,ramp={ramp}", train_length=1024)
    theta = 10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    gamma = torch.tensor(gamma, dtype=torch.float64)
    expected = (1 - gamma) * theta / 8 + gamma * theta
    torch.testing.assert_close(enc.frequencies(4096).double(), expected, rtol=1e-6, atol=0)
    if ramp == "paper":
        assert enc.frequencies(4096)[2].item() == pytest.approx(0.0556783, rel=1e-5)   # 0.1 (0.5065 / 8 + 0.4935)


def test_yarn_temperature_scales_the_logits_by_the_square_of_0_1_ln_s_plus_1():
    enc = encoding("rope@yarn:factor=8", train_length=1024)
    assert enc.form.logit_scale(enc, 64) == pytest.approx((0.1 * math.log(8) + 1) ** 2)
    assert enc.form.logit_scale(enc, 64) == pytest.approx(1.4591291)
    q, k, _ = qkv(64)
    q2, k2, _ = enc.prepare(q, k)
    cos, sin = rope_angles(torch.arange(64), D, inv_freq=enc.frequencies(64))
    logits = q2 @ k2.transpose(-2, -1)
    by_hand = apply_rotary(q, cos, sin) @ apply_rotary(k, cos, sin).transpose(-2, -1) * 1.4591291
    torch.testing.assert_close(logits, by_hand, rtol=1e-4, atol=1e-4)


def test_prope_removes_the_lowest_frequencies():
    freq = encoding("rope@prope:p=0.75").frequencies(64)
    theta = rope_frequencies(D)
    torch.testing.assert_close(freq[:6], theta[:6])         # int(0.75 * 16 // 2) = 6 kept
    assert (freq[6:] == 0).all()


# ---- log-length scaling -------------------------------------------------------------------------------
LOGN_SPECS = ["alibi", "xl:k=5", "t5", "shaw:k=3", "transformer-xl", "rope", "fire", "kerple-log", "none"]


def expected_attention(enc, q, k, v, scale):
    """softmax(scale * (q.k / sqrt(d) + bias)) v from the scheme as trained, by hand."""
    q, k, plan = enc.prepare(q, k)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if plan is not None:
        scores = scores + plan.full()
    scores = (scores * scale).masked_fill(causal_mask(q.shape[-2], k.shape[-2]), float("-inf"))
    return torch.softmax(scores, -1) @ v


@pytest.mark.parametrize("spec", LOGN_SPECS)
@torch.no_grad()
def test_logn_scales_the_whole_logit_by_log_l_over_log_l_train_on_every_backend(spec):
    length = 160              # >= every horizon + the split path's band: the split runs
    enc, plain = encoding(f"{spec}@logn"), encoding(spec)
    q, k, v = qkv(length)
    expected = expected_attention(plain, q, k, v, math.log(160) / math.log(16))
    q2, k2, plan = enc.prepare(q, k)
    ran = set()
    for backend in ("reference", "sdpa", "chunked", "split", "toeplitz"):
        try:
            check(backend, type(enc))
        except UsageError:
            continue
        with recording() as taken:
            out = attention(q2, k2, v, plan, backend)
        ran |= set(taken)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4, msg=f"{spec} on {backend}")
    if enc.adds_bias and enc.distance_only:
        assert "toeplitz" in ran
    if enc.has_horizon and spec != "t5":
        assert "split" in ran


@torch.no_grad()
def test_logn_on_the_flex_path():
    """The scaled score_mod of a plan with no O(L) form of its own (Shaw's, query-dependent); a
    distance plan scales its values and keeps its own score_mod. One compile: about 15 s on 2 cores."""
    enc, plain = encoding("shaw:k=3@logn"), encoding("shaw:k=3")
    q, k, v = qkv(64, batch=1)
    q2, k2, plan = enc.prepare(q, k)
    out = attention(q2, k2, v, plan, "flex")
    torch.testing.assert_close(out, expected_attention(plain, q, k, v, math.log(64) / math.log(16)), rtol=1e-4, atol=1e-4)


def tiny_model(position, train_length=16):
    return GPT(ModelConfig(vocab_size=64, position=position, d_model=32, n_layers=2, n_heads=2,
                           train_length=train_length), seed=1).eval()


@pytest.mark.parametrize("spec", ["alibi", "rope", "transformer-xl", "xl:k=5"])
@torch.no_grad()
def test_logn_leaves_the_model_as_trained_up_to_its_training_length(spec):
    model = tiny_model(spec)
    tokens = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(3))
    trained = {n: model(tokens[:, :n]) for n in (8, 16, 40)}
    forms.apply(model, f"{spec}@logn")
    for n in (8, 16):
        torch.testing.assert_close(model(tokens[:, :n]), trained[n], rtol=0, atol=0)
    assert not torch.allclose(model(tokens), trained[40], atol=1e-4)


# ---- table forms ----------------------------------------------------------------------------------------
def linear_table(enc, slope=0.1):
    """Rows of distance d >= 0 set to slope * d + head offset, the future rows to noise."""
    with torch.no_grad():
        d = torch.arange(-enc.k, enc.k + 1, dtype=torch.float32)
        enc.table.copy_(slope * d[:, None] + torch.tensor([0.0, 1.0])[None, :])
        enc.table[: enc.k] = torch.randn(enc.k, H, generator=torch.Generator().manual_seed(5))


def test_extend_reads_the_table_within_the_clip_and_continues_its_line_beyond():
    enc, plain = encoding("xl:k=6@extend:fit=4"), encoding("xl:k=6")
    for e in (enc, plain):
        linear_table(e)
    got, trained = enc.plan(40, 40).values, plain.plan(40, 40).values          # distances -39 .. 39
    within = slice(0, 39 + 7)                                                  # distances up to k = 6
    torch.testing.assert_close(got[:, within], trained[:, within])
    far = torch.tensor([20, 39])
    torch.testing.assert_close(got[:, far + 39], torch.tensor([[2.0, 3.9], [3.0, 4.9]]), rtol=1e-5, atol=1e-5)
    assert enc.plan(40, 40).horizon is None


def test_extend_stops_at_the_last_trained_distance_when_the_clip_is_beyond_training():
    enc = encoding("xl:k=128@extend:fit=4", train_length=16)
    linear_table(enc, slope=0.5)
    with torch.no_grad():
        enc.table[128 + 16:] = 99.0                          # rows of distances the model never trained on
    values = enc.plan(1, 64).values                          # distances 0 .. 63
    torch.testing.assert_close(values[0, :16], 0.5 * torch.arange(16.0))
    torch.testing.assert_close(values[0, 40], torch.tensor(20.0))     # the line through rows 12 .. 15


def test_logidx_spreads_distances_logarithmically_over_the_trained_rows():
    enc, plain = encoding("xl:k=8@logidx:log_from=4"), encoding("xl:k=8")
    with torch.no_grad():
        plain.table.copy_(torch.arange(17.0)[:, None].expand(17, H) - 8)   # the row's distance
        enc.table.copy_(plain.table)
    rows = enc.plan(1, 64).values[0]                         # distances 0 .. 63, each the row it reads
    torch.testing.assert_close(rows[:4], torch.arange(4.0))            # below c: their own rows
    # row(d) = 4 + round(4 ln(d / 4) / ln(63 / 4)): d = 4 -> 4, 8 -> 5, 16 -> 6, 63 -> 8
    assert [int(rows[d]) for d in (4, 8, 16, 63)] == [4, 5, 6, 8]
    assert (rows[1:] >= rows[:-1]).all() and rows.max() == 8
    # every distance within the clip: the table as trained
    torch.testing.assert_close(enc.plan(9, 9).values, plain.plan(9, 9).values)


def test_table_forms_refuse_a_table_trained_with_log_from():
    model = tiny_model("xl:k=8,log_from=2,log_buckets=4")
    with pytest.raises(UsageError, match="log_from=2") as error:
        forms.apply(model, "xl:k=8,log_from=2,log_buckets=4@extend")
    assert "\n" not in str(error.value)


# ---- the registry --------------------------------------------------------------------------------------
# the options a form needs on a variant trained without them (drawn: the range of a model trained at 0 .. L - 1)
REQUIRED = {"drawn": ":limit=64"}

@pytest.mark.parametrize("form", forms.form_names())
@torch.no_grad()
def test_every_form_runs_on_every_scheme_it_declares_and_refuses_the_others(form):
    cls = forms.get_form(form)
    tokens = torch.randint(0, 64, (1, 24), generator=torch.Generator().manual_seed(4))
    for name in positions.names():
        spec = f"{name}@{form}" + REQUIRED.get(form, "")
        if not cls.applies(positions.get(name)):
            with pytest.raises(UsageError, match=f'form "{form}" does not apply to "{name}"') as error:
                forms.parse_form(spec)
            assert "\n" not in str(error.value)
            continue
        model = tiny_model(name)
        length = min(24, model.max_length or 24)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        assert forms.apply(model, spec) is not None
        logits = model(tokens[:, :length])
        assert logits.shape == (1, length, 64) and torch.isfinite(logits).all(), spec
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())   # weights untouched
    assert forms.schemes_of(cls), f"{form} applies to no scheme"


@pytest.mark.parametrize("spec, fragment", [
    ("rope@yarnn", 'unknown evaluation form "yarnn" (did you mean "yarn"?)'),
    ("rope@yarn:factr=4", 'unknown option of form "yarn" "factr" (did you mean "factor"?)'),
    ("rope@yarn:factor=x", "not a valid float"),
    ("rope@pi:factor=0.5", "must be at least 1"),
    ("rope@pi@logn", "more than one evaluation form"),
    ("alibi@yarn", 'does not apply to "alibi"; it applies to: hope, partial_rope, rope, xpos'),
    ("alibi@logn:x=1", 'unknown option of form "logn" "x"'),
    ("ropes@pi", 'unknown position variant "ropes"'),
])
def test_bad_form_specs_are_refused_in_one_line(spec, fragment):
    with pytest.raises(UsageError) as error:
        forms.parse_form(spec)
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_a_plain_variant_has_no_form():
    assert forms.parse_form("xl:k=64") is None
    assert forms.split_spec("rope:base=500@yarn:factor=16") == ("rope:base=500", "yarn:factor=16")


# ---- the command line --------------------------------------------------------------------------------
runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_extrapolate_evaluates_forms_of_trained_checkpoints(tmp_path):
    run_dir = tmp_path / "run"
    result = run("train", "--preset", "tiny", "--variants", "rope", "xl:k=8", "--steps", 3, "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    weights = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in run_dir.glob("checkpoints/*/model.pt")}
    specs = ["rope", "rope@yarn:factor=4", "rope@logn", "xl:k=8@extend:fit=4", "xl:k=8@logidx"]
    result = run("extrapolate", "--run-dir", run_dir, "--variants", *specs, "--lengths", 32, 64, "--task", "perplexity")
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(run_dir / "extrapolation.csv", keep_default_na=False)
    assert sorted(set(rows["variant"])) == sorted(specs) and len(rows) == 2 * len(specs)
    assert (rows["status"] == "ok").all()
    assert dict(zip(rows["variant"], rows["form"])) == {
        "rope": "", "rope@yarn:factor=4": "yarn:factor=4", "rope@logn": "logn",
        "xl:k=8@extend:fit=4": "extend:fit=4", "xl:k=8@logidx": "logidx"}
    ppl = rows.set_index(["variant", "length"])["ppl"].astype(float)
    assert ppl["rope@logn", 32] == ppl["rope", 32]              # logn: as trained at the training length
    assert ppl["rope@logn", 64] != ppl["rope", 64]
    assert ppl["rope@yarn:factor=4", 64] != ppl["rope", 64]
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in weights} == weights   # nothing retrained or written
    result = run("report", "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    assert "| rope@yarn:factor=4 |" in (run_dir / "report.md").read_text()

    result = run("extrapolate", "--run-dir", run_dir, "--variants", "alibi@logn", "--lengths", 64)
    assert result.exit_code == 1
    assert "variant alibi seed 0 (evaluated as alibi@logn) has no finished checkpoint" in result.output
    result = run("extrapolate", "--run-dir", run_dir, "--variants", "xl:k=8@yarn", "--lengths", 64)
    assert result.exit_code == 2 and 'does not apply to "xl"' in result.output
    assert len(result.output.strip().splitlines()) == 1
    result = run("extrapolate", "--run-dir", run_dir, "--variants", "xl:k=8@extend:fit=20", "--lengths", 64)
    assert result.exit_code == 2 and "fit=20 rows; this xl trained only 9" in result.output
    result = run("train", "--preset", "tiny", "--variants", "rope@yarn", "--run-dir", run_dir)
    assert result.exit_code == 2 and 'evaluation form of "rope": train "rope"' in result.output
