"""Randomized positions (Ruoss et al. 2023), `VARIANT:random_positions=N`: each training sequence's
positions a sorted random subset of [0, N); validation and evaluation at 0 .. L - 1. The draw's range,
order and reproducibility by hand, the encodings at chosen positions against the same scheme's
encodings of a longer sequence read at those positions (every scheme that declares takes_positions),
and training that really uses them."""

import dataclasses

import pytest
import torch
from typer.testing import CliRunner

from relbench import config, positions
from relbench.cli import app
from relbench.config import ModelConfig
from relbench.data import load_splits
from relbench.errors import UsageError
from relbench.model import GPT
from relbench.positions.plan import DensePlan
from relbench.training.batches import random_positions
from relbench.training.train import train_variant

TAKES = [n for n in positions.names() if positions.get(n).takes_positions]
H, D = 2, 8


def test_the_schemes_that_take_positions():
    # every index-based scheme; the data-dependent ones, tables of absolute rows and none do not
    assert set(TAKES) == {"alibi", "bam", "dynamic", "fire", "hope", "kerple-log", "kerple-power", "partial_rope", "pope",
                          "rope", "sandwich", "sinusoidal", "t5", "t5-log2", "xl", "xpos"}


def test_drawn_positions_are_sorted_distinct_and_in_range():
    drawn = random_positions(seed=3, step=7, count=16, length=40, limit=100)
    assert drawn.shape == (16, 40) and drawn.dtype == torch.int64
    assert int(drawn.min()) >= 0 and int(drawn.max()) < 100
    assert bool((drawn[:, 1:] > drawn[:, :-1]).all())                 # strictly increasing: distinct, in order
    assert len({tuple(row.tolist()) for row in drawn}) == 16           # each sequence its own draw
    assert torch.equal(drawn, random_positions(3, 7, 16, 40, 100))     # a function of (seed, step): resumable
    assert not torch.equal(drawn, random_positions(3, 8, 16, 40, 100))
    assert not torch.equal(drawn, random_positions(4, 7, 16, 40, 100))
    # a subset drawn uniformly: over many rows each position is taken about length / limit of the time
    many = random_positions(0, 0, 2000, 40, 100)
    share = torch.bincount(many.flatten(), minlength=100).float() / 2000
    assert float((share - 0.4).abs().max()) < 0.06
    # the full range is the identity
    assert torch.equal(random_positions(0, 0, 2, 10, 10), torch.arange(10).expand(2, 10))


def positions_for(batch: int, length: int, limit: int) -> torch.Tensor:
    return random_positions(5, 0, batch, length, limit)


@pytest.mark.parametrize("name", TAKES)
def test_encoding_at_chosen_positions_is_the_long_sequence_read_there(name):
    """Positions p (B, L) drawn from [0, N): the bias, rotation or embedding at p equals the scheme's
    ordinary one for a sequence of N tokens, read at rows p_i and columns p_j."""
    torch.manual_seed(0)
    B, L, N = 2, 12, 48
    enc = positions.build(name, n_heads=H, head_dim=D, d_model=H * D, train_length=16)
    enc.reset_parameters(torch.Generator().manual_seed(1))
    with torch.no_grad():
        for p in enc.parameters():       # learned tables and MLPs away from their zero or tiny start
            p.add_(torch.randn(p.shape) * 0.3)
        enc.project_parameters()
    p = positions_for(B, L, N)
    if enc.adds_bias:
        dense = enc.plan(L, L, positions=p)
        assert isinstance(dense, DensePlan)
        long = enc.plan(N, N).full()                                                   # (H, N, N)
        for b in range(B):
            expected = long[:, p[b]][:, :, p[b]]                                       # rows p_i, columns p_j
            torch.testing.assert_close(dense.full()[b], expected, rtol=1e-5, atol=1e-6)
        # a chunk of queries at the end of the keys: the last rows of the square plan
        tail = enc.plan(5, L, positions=p)
        torch.testing.assert_close(tail.full(), dense.full()[..., L - 5:, :])
    if enc.rotates:
        q, k = torch.randn(B, H, L, D), torch.randn(B, H, L, D)
        q_at, k_at = enc.rotate(q, k, positions=p)
        for b in range(B):
            # the long sequence's rotation, with the tokens placed at p[b] (zeros elsewhere)
            q_long, k_long = torch.zeros(1, H, N, D), torch.zeros(1, H, N, D)
            q_long[0, :, p[b]], k_long[0, :, p[b]] = q[b], k[b]
            q_ref, k_ref = enc.rotate(q_long, k_long)
            logits = q_at[b] @ k_at[b].transpose(-1, -2)
            expected = q_ref[0, :, p[b]] @ k_ref[0, :, p[b]].transpose(-1, -2)
            torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
        q_tail, _ = enc.rotate(q[..., L - 5:, :], k, positions=p)                      # queries: the last 5 keys
        torch.testing.assert_close(q_tail @ k_at.transpose(-1, -2), (q_at @ k_at.transpose(-1, -2))[..., L - 5:, :],
                                   rtol=1e-4, atol=1e-4)
    at = enc.embed(L, positions=p)
    if at is not None:
        long = enc.embed(N)
        for b in range(B):
            torch.testing.assert_close(at[b], long[p[b]])


@pytest.mark.parametrize("name", TAKES)
def test_ordinary_positions_given_change_nothing(name):
    """positions = 0 .. L - 1 passed explicitly: the model's logits equal those without them."""
    cfg = ModelConfig(vocab_size=256, d_model=H * D, n_layers=2, n_heads=H, train_length=16, position=name)
    model = GPT(cfg, seed=0)
    tokens = torch.randint(0, 256, (2, 16))
    torch.testing.assert_close(model(tokens, positions=torch.arange(16).expand(2, 16)), model(tokens),
                               rtol=1e-5, atol=1e-6)


def test_a_relative_bias_sees_only_the_gaps():
    """ALiBi at positions p: bias -m_h |p_i - p_j| by hand, and a shift of every position changes nothing."""
    enc = positions.build("alibi", n_heads=2, head_dim=D, train_length=16)
    p = torch.tensor([[0, 3, 4, 10]])
    bias = enc.plan(4, 4, positions=p).full()[0]                                   # (H, 4, 4)
    gaps = torch.tensor([[0, 3, 4, 10], [3, 0, 1, 7], [4, 1, 0, 6], [10, 7, 6, 0]], dtype=torch.float32)
    slopes = torch.tensor([2 ** -4, 2 ** -8])                                      # m_h = 2^(-8h/H), H = 2
    torch.testing.assert_close(bias, -slopes[:, None, None] * gaps)
    torch.testing.assert_close(enc.plan(4, 4, positions=p + 1000).full(), bias[None])


def test_spec_errors_are_one_line():
    with pytest.raises(UsageError, match=r"fox.*cannot place its tokens.*alibi"):
        positions.training_options("fox:random_positions=512")
    with pytest.raises(UsageError, match="must be 0"):
        positions.training_options("alibi:random_positions=-4")
    cfg = ModelConfig(vocab_size=256, d_model=16, n_layers=1, n_heads=2, train_length=32, position="rope:random_positions=32")
    with pytest.raises(UsageError, match="must exceed the training length 32"):
        GPT(cfg)
    model = GPT(dataclasses.replace(cfg, position="fox"))
    with pytest.raises(UsageError, match="cannot place its tokens"):
        model(torch.zeros(1, 4, dtype=torch.long), positions=torch.arange(4)[None])
    assert positions.training_options("rope:random_positions=512") == {"random_positions": 512}
    assert positions.parse_spec("rope:random_positions=512") == ("rope", {})


def tiny_training(spec: str, steps: int = 12):
    exp = config.experiment("tiny")
    model_config = dataclasses.replace(exp.model, position=spec)
    train = dataclasses.replace(exp.train, steps=steps, eval_every=steps)
    return train_variant(spec, model_config, train, load_splits(), torch.device("cpu"))


@pytest.mark.parametrize("name", ["alibi", "rope", "sinusoidal"])
def test_training_draws_its_positions_and_validates_at_ordinary_ones(name, monkeypatch):
    """Training passes every step's drawn positions (range N) to the model, validation passes none,
    and the weights differ from the same training at 0 .. L - 1."""
    from relbench.training import train as train_module

    seen = []
    original = GPT.forward

    def spy(self, tokens, observe=None, backend=None, positions=None):
        seen.append((torch.is_grad_enabled(), None if positions is None else positions.clone()))
        return original(self, tokens, observe, backend, positions)

    monkeypatch.setattr(GPT, "forward", spy)
    model, _rows, summary = tiny_training(f"{name}:random_positions=256")
    steps = [p for grad, p in seen if grad]
    assert len(steps) == 12 and all(p is not None for p in steps)
    for step, p in enumerate(steps):
        torch.testing.assert_close(p, train_module.random_positions(0, step, 8, 32, 256))
    assert all(p is None for grad, p in seen if not grad)                 # validation and checks: 0 .. L - 1
    monkeypatch.setattr(GPT, "forward", original)
    plain, _rows, plain_summary = tiny_training(name)
    moved = [k for k, v in plain.state_dict().items() if not torch.equal(v, model.state_dict()[k])]
    assert moved and summary["val_loss"] != plain_summary["val_loss"]


def test_command_line_trains_a_randomized_variant(tmp_path):
    result = CliRunner().invoke(app, ["train", "--preset", "tiny", "--variants", "xl:random_positions=128", "--steps", "6",
                                      "--run-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    bad = CliRunner().invoke(app, ["train", "--preset", "tiny", "--variants", "cope:random_positions=128", "--steps", "6",
                                   "--run-dir", str(tmp_path / "bad")])
    assert bad.exit_code != 0 and "cannot place its tokens" in bad.output.splitlines()[-1]
