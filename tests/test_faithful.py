"""Each variant is built and trained as its paper (or official code) says, inside a real GPT:
initialisations survive the model's own init walk, FIRE's threshold is exercised at the training
length, KERPLE follows its official code, the sinusoidal baseline is not drowned in position signal."""

import math

import pytest
import torch

from relbench import positions
from relbench.config import INIT_STD
from relbench.model import GPT, ModelConfig
from relbench.positions.base import PositionEncoding

ALL = positions.names()


def gpt(name, seed=0, **overrides):
    config = {"vocab_size": 256, "d_model": 32, "n_layers": 3, "n_heads": 4, "train_length": 64, "position": name}
    config.update(overrides)
    return GPT(ModelConfig(**config), seed=seed)


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("name", ALL)
def test_position_modules_keep_their_own_initialisation_inside_a_gpt(name):
    """After GPT's init, every position module holds exactly what its own reset_parameters draws
    from the generator the model hands it: the model never reaches past a position module."""
    model = gpt(name, seed=3)
    for index, module in enumerate(model.positions):
        assert isinstance(module, PositionEncoding)
        after_gpt = _state(module)
        module.reset_parameters(model.generator(f"positions.{index}", seed=3))
        for key, value in _state(module).items():
            torch.testing.assert_close(after_gpt[key], value, rtol=0, atol=0, msg=f"{name}: {key}")


def test_dynamic_starts_unbiased_inside_a_gpt():
    model = gpt("dynamic")
    for module in model.positions:
        assert module.distance_bias(torch.arange(-50, 50)).abs().max() == 0


def test_fire_mlp_has_its_own_initialisation_inside_a_gpt():
    """PyTorch's default Linear init with one input: weights and biases of the first layer in
    U(-1, 1), so several of the 32 ReLU kinks -b/w fall inside [0, 1], where the inputs live."""
    model = gpt("fire", n_heads=4)
    first = torch.cat([m.mlp[0].weight[:, 0] for m in model.positions])            # 3 layers x 32 units
    assert first.abs().max() <= 1 and first.std() > 0.4                             # U(-1, 1): std 0.577
    kinks = torch.cat([-m.mlp[0].bias / m.mlp[0].weight[:, 0] for m in model.positions])
    assert int(((kinks >= 0) & (kinks <= 1)).sum()) >= 6                            # about a quarter of 96


def test_fire_threshold_starts_below_the_training_length():
    """FIRE trains at 2048 with its threshold initialised at 512 (Li et al. 2023): a quarter of the
    training length, so most training queries lie beyond it and the progressive interpolation
    psi(i - j) / psi(i) is what the MLP learns. relbench keeps the ratio."""
    for train_length in (64, 256, 2048):
        enc = positions.build("fire", n_heads=2, head_dim=8, train_length=train_length)
        enc.reset_parameters(torch.Generator().manual_seed(0))
        assert float(enc.threshold()) == pytest.approx(train_length / 4)
    enc = positions.build("fire", n_heads=2, head_dim=8, train_length=256)
    enc.reset_parameters(torch.Generator().manual_seed(0))
    full = enc.plan(256, 256).full()                                                # (H, 256, 256)
    # beyond the threshold (64) the same distance is read differently by different queries
    assert not torch.allclose(full[:, 100, 90], full[:, 250, 240])


def test_kerple_shares_one_kernel_across_layers_as_the_official_code():
    for name in ("kerple-log", "kerple-power"):
        assert len(gpt(name).positions) == 1


def test_kerple_initialisation_follows_the_official_code():
    """Official code (chijames/KERPLE, megatron/mpu/layers.py): log kernel -p log(1 + a|m-n|) with
    p ~ U(0, 2), a ~ U(0, 1); power kernel -a |m-n|^p with the scale a ~ U(0, 1), p ~ U(0, 2)."""
    g = torch.Generator().manual_seed(0)
    log = positions.build("kerple-log", n_heads=4096, head_dim=8)
    log.reset_parameters(g)
    power = positions.build("kerple-power", n_heads=4096, head_dim=8)
    power.reset_parameters(g)
    for values, high in ((log.r1, 2.0), (log.r2, 1.0), (power.r1, 1.0), (power.r2, 2.0)):
        assert values.min() >= 0 and values.max() <= high
        assert values.mean().item() == pytest.approx(high / 2, abs=0.05 * high)


def test_kerple_parameters_are_projected_in_place_after_each_step():
    """The official code clamps the stored values (p, a >= 0.01; the power's p <= 2), so a step that
    pushes a parameter below its floor leaves it at the floor, not below it."""
    from relbench.config import TrainConfig
    from relbench.training.step import make_optimizer, optimizer_step

    for name in ("kerple-log", "kerple-power"):
        model = gpt(name)
        with torch.no_grad():
            model.positions[0].r1.fill_(0.02)
            model.positions[0].r2.fill_(1.99)
        optimizer = make_optimizer(model, TrainConfig(lr=1.0))
        for group in optimizer.param_groups:
            group["lr"] = 1.0
        model.positions[0].r1.grad = torch.ones(4)          # Adam moves each entry by about lr = 1
        model.positions[0].r2.grad = -torch.ones(4)
        optimizer_step(model, optimizer)
        assert torch.equal(model.positions[0].r1.detach(), torch.full((4,), 0.01))
        top = 2.0 if name == "kerple-power" else 2.99
        assert model.positions[0].r2.max().item() == pytest.approx(top)


@pytest.mark.parametrize("d_model", [64, 128])
def test_sinusoidal_positions_are_scaled_by_one_over_sqrt_d(d_model):
    """Each (sin, cos) pair has a sum of squares of 1, so the table's RMS is 1/sqrt(2) before
    scaling; the default scale d^-1/2 (chosen by validation loss, see the class) puts it at
    1/sqrt(2 d): 0.0625 at d = 128, 3.1x the tokens' RMS at initialisation."""
    model = gpt("sinusoidal", d_model=d_model)
    positions_rms = model.positions[0].embed(256).pow(2).mean().sqrt()
    assert float(positions_rms) == pytest.approx(1 / math.sqrt(2 * d_model), rel=1e-3)
    assert float(model.tok.weight.pow(2).mean().sqrt()) == pytest.approx(INIT_STD, rel=0.05)
    half = gpt("sinusoidal", d_model=d_model, position_options={"scale": 0.01}).positions[0].embed(256).pow(2).mean().sqrt()
    assert float(half) == pytest.approx(0.01 / math.sqrt(2), rel=1e-3)


def test_window_diagnostics_hand_computed():
    """Uniform attention (no position term, zero content logits) has mean distance (L - 1) / 4; ALiBi
    with 4 heads hides every key 30 nats down in head 0 (slope 1/4: distances >= 120) of every layer."""
    from relbench.cost.inspection import window_diagnostics

    tokens = torch.randint(0, 256, (2, 256))
    flat = gpt("none", n_layers=2, d_model=32, n_heads=4)
    with torch.no_grad():
        for block in flat.blocks:
            block.attn.qkv.weight[:64].zero_()                      # q and k rows: every content logit 0
    stats = window_diagnostics(flat, tokens)
    assert stats["mean_distance"] == pytest.approx(255 / 4, rel=1e-5)
    assert stats["max_logit"] == 0 and stats["hard_heads"] == 0 and math.isnan(stats["hard_window"])
    alibi = window_diagnostics(gpt("alibi", n_layers=2, d_model=32, n_heads=4), tokens)
    assert alibi["heads"] == 8 and alibi["hard_heads"] == 2 and alibi["hard_window"] == 120
    assert alibi["mean_distance"] < 255 / 4
