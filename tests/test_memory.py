"""The memory check that refuses hopeless configurations before any work: sizes, estimates, budget."""

import dataclasses

import pytest
import torch

from relbench import memory
from relbench.config import ModelConfig, resolve
from relbench.errors import RelbenchError, UsageError
from relbench.model import GPT


@pytest.mark.parametrize("text, expected", [("4GB", 4 * 2**30), ("512mb", 512 * 2**20), ("1.5 GB", 3 * 2**29),
                                            ("100", 100), ("2k", 2048), ("1tb", 2**40)])
def test_parse_size(text, expected):
    assert memory.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "x", "-1GB", "0", "4 GiB", "1e9"])
def test_parse_size_refuses_what_is_not_a_size(text):
    with pytest.raises(UsageError, match=memory.ENV):
        memory.parse_size(text)


@pytest.mark.parametrize("position", ["none", "learned", "alibi", "rope"])
def test_parameter_count_is_the_models_own_where_the_variant_adds_none_beyond_the_table(position):
    model, _, _ = resolve("tiny")
    model.position = position
    assert memory.parameter_count(model) == GPT(model).n_params()


def test_parameter_count_is_a_lower_bound_for_every_variant():
    from relbench import positions

    model, _, _ = resolve("tiny")
    for name in positions.names():
        model.position = name
        assert memory.parameter_count(model) <= GPT(model).n_params(), name


def test_parameter_count_by_hand():
    # d 8, hidden 32, 1 layer, vocab 10: embedding, qkv + out, MLP, two norms, final norm
    model = ModelConfig(vocab_size=10, d_model=8, n_layers=1, n_heads=2, train_length=4)
    assert memory.parameter_count(model) == 10 * 8 + (4 * 64 + 2 * 8 * 32 + 4 * 8) + 2 * 8 == 896


@pytest.mark.parametrize("position", ["xl", "fire", "rope", "shaw", "transformer-xl"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_training_bytes_extrapolates_what_autograd_saves(position, precision):
    """Fitted at lengths 16 and 32, batches 1 and 2, the estimate matches a direct measurement of the
    saved tensors at length 96 and batch 3 (the reference path at this size: exactly a L + b L^2 per
    sequence, c L^2 + k per batch)."""
    model = ModelConfig(vocab_size=256, d_model=32, n_layers=2, n_heads=2, position=position, train_length=96,
                        attention="reference" if position != "rope" else "auto")
    estimate = memory.training_bytes(model, 3, precision)
    gpt = GPT(model)
    direct = 16 * gpt.n_params() + memory._saved_bytes(gpt, 3, 96, precision)
    assert estimate == pytest.approx(direct, rel=0.03)


def test_a_bias_built_on_every_pair_is_counted_once_per_batch():
    # FIRE runs its MLP (width 32) on every (query, key) pair: far more per pair than xl's table lookup
    model = ModelConfig(vocab_size=256, d_model=32, n_layers=2, n_heads=2, train_length=512)
    fire = memory.training_bytes(dataclasses.replace(model, position="fire"), 1)
    xl = memory.training_bytes(dataclasses.replace(model, position="xl"), 1)
    assert fire - xl > 2 * 32 * 4 * 512 * 512 / 2   # at least the hidden layer, causal half, per layer


def test_budget_is_capped_by_the_environment(monkeypatch):
    monkeypatch.setenv(memory.ENV, "1MB")
    assert memory.budget("cpu") == 2**20
    memory.require(2**20, "cpu", "x", "y")                                  # exactly fits
    with pytest.raises(RelbenchError, match=r"training xl needs at least 2\.0 MB of memory and cpu has 1\.0 MB "
                                            r"available \(RELBENCH_MEMORY caps it\); use less"):
        memory.require(2**21, "cpu", "training xl", "use less")
    monkeypatch.setenv(memory.ENV, "lots")
    with pytest.raises(UsageError, match="not a memory size"):
        memory.budget("cpu")


def test_available_memory_on_cpu_is_positive_and_below_the_total():
    have = memory.available("cpu")
    if have is None:
        pytest.skip("no /proc/meminfo")
    total = int(open("/proc/meminfo").read().split()[1]) * 1024
    assert 0 < have <= total


@pytest.mark.parametrize("error, expected", [
    (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 10 bytes"), True),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
    (MemoryError(), True),
    (RuntimeError("shape mismatch"), False),
])
def test_is_out_of_memory(error, expected):
    assert memory.is_out_of_memory(error) is expected


def test_human():
    assert memory.human(3 * 2**30) == "3.0 GB" and memory.human(1536 * 2**20) == "1.5 GB"
    assert memory.human(2**10) == "1 KB" and memory.human(5 * 2**52) == "2.05e+04 TB"


def test_evaluation_bytes_by_hand():
    # d 8, hidden 32, vocab 10, 2 heads; 3 windows of 4 tokens: 12 tokens x (7 d + 2 hidden + 2 V) floats
    model = ModelConfig(vocab_size=10, d_model=8, n_layers=3, n_heads=2, train_length=4)
    activations = 4 * 12 * (7 * 8 + 2 * 32 + 2 * 10)
    square = 4 * 2 * 4 * 4                                   # one (H, L, L) fp32 tensor
    assert memory.evaluation_bytes(model, "reference", 4, 3, True) == activations + (3 * 3 + 2) * square
    assert memory.evaluation_bytes(model, "sdpa", 4, 3, True) == activations + (3 + 3) * square
    assert memory.evaluation_bytes(model, "sdpa", 4, 3, False) == activations
    for backend in ("auto", "chunked", "split", "flex"):
        assert memory.evaluation_bytes(model, backend, 4, 3, True) == activations
