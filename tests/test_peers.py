"""benchmarks/peers.py: without x-transformers it stops with one line; with it, every scheme it
configures in x-transformers computes the same attention as relbench's (and the check notices a
mismatch), its Decoder flags are what the installed x-transformers accepts, and the parameter
difference it prints is exactly the one it explains."""

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from relbench.config import resolve
from relbench.model import GPT

PEERS_PY = Path(__file__).resolve().parents[1] / "benchmarks" / "peers.py"


@pytest.fixture(scope="module")
def peers():
    spec = importlib.util.spec_from_file_location("benchmarks_peers", PEERS_PY)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module            # dataclasses look their module up while it executes
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def quick(name):
    return dataclasses.replace(resolve("quick")[0], position=name)


def test_without_x_transformers_it_says_how_to_install_in_one_line(peers, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "x_transformers", None)       # `import x_transformers` raises ImportError
    assert peers.main(["--no-train"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == peers.INSTALL + "\n"
    assert "pip install -e '.[peers]'" in captured.err


@pytest.mark.parametrize("name", ["alibi", "t5", "dynamic", "xpos", "rope"])
def test_attention_rows_compare_the_same_scheme(peers, name):
    pytest.importorskip("x_transformers")
    heads, head_dim = 4, 16
    xt = peers.xt_position(name, heads, head_dim)
    enc = peers.relbench_position(name, heads, head_dim)
    assert peers.difference(name, xt, enc, length=37) < 1e-5


def test_the_check_notices_a_different_scheme(peers, monkeypatch):
    pytest.importorskip("x_transformers")
    from x_transformers.x_transformers import RelativePositionBias

    heads, head_dim = 4, 16
    other_buckets = RelativePositionBias(scale=head_dim ** 0.5, causal=True, max_distance=64, heads=heads)
    assert peers.difference("t5", other_buckets, peers.relbench_position("t5", heads, head_dim), length=150) > 1e-3
    # rotary pairs left in relbench's layout: x-transformers rotates other channel pairs
    monkeypatch.setattr(peers, "interleaved_channels", lambda head_dim: torch.arange(head_dim))
    rope = peers.xt_position("rope", heads, head_dim)
    assert peers.difference("rope", rope, peers.relbench_position("rope", heads, head_dim)) > 1e-3


@pytest.mark.parametrize("name", ["alibi", "t5", "dynamic", "xpos", "rope"])
def test_trained_decoders_match_relbench_and_their_parameter_difference_is_explained(peers, name):
    pytest.importorskip("x_transformers")
    config = quick(name)
    theirs = peers.xt_model(name, config, flash=False)
    ours = GPT(config, seed=0)
    assert peers.difference(name, peers.xt_position_of(theirs), ours.position(0)) < 1e-5
    extra, _ = peers.explained_difference(name, config)
    assert ours.n_params() - sum(p.numel() for p in theirs.parameters()) == extra
    logits = theirs(torch.randint(0, config.vocab_size, (2, 16)))
    assert logits.shape == (2, 16, config.vocab_size)


@pytest.mark.parametrize("name", ["alibi", "t5", "dynamic", "xpos", "rope"])
def test_flash_is_allowed_exactly_where_the_decoder_accepts_it(peers, name):
    pytest.importorskip("x_transformers")
    if peers.PEERS[name].flash_allowed:
        peers.xt_model(name, quick(name), flash=True)
    else:
        with pytest.raises(AssertionError, match="flash"):
            peers.xt_model(name, quick(name), flash=True)


def test_a_small_run_prints_both_tables(peers, capsys):
    pytest.importorskip("x_transformers")
    assert peers.main(["--lengths", "64", "--repeats", "1", "--steps", "1", "--warmup", "0",
                       "--schemes", "alibi", "t5", "rope"]) == 0
    out = capsys.readouterr().out
    assert "Attention forward" in out and "Training, preset quick" in out
    assert out.count("yes (") == 6 and "NO (" not in out           # 3 schemes x (attention, training)
