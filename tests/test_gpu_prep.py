"""What the GPU session (benchmarks/cuda_check.sh, issue 26) runs, checked on the CPU at toy sizes:
the bf16 forward+backward paired timing, the eager/compile throughput switch, the gpu preset."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console

from relbench import config

ROOT = Path(__file__).resolve().parents[1]


def load(name):
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_paired_timing_in_bf16_with_backward_takes_the_training_path_and_leaves_gradients():
    bench = load("attention")
    rows = bench.paired_ratios(["alibi", "xl"], [64], 1, 2, 8, "cpu", 1, Console(quiet=True), "bf16", True)
    assert list(rows["variant"]) == ["alibi", "xl"]
    assert set(rows["precision"]) == {"bf16"} and set(rows["passes"]) == {"forward+backward"}
    assert (rows["auto_ms"] > 0).all() and (rows["sdpa_ms"] > 0).all() and (rows["ratio"] > 0).all()
    # with gradients auto takes a training path (the fused CPU kernel gives none for a mask)
    assert set(rows["path"]) <= {"reference", "chunked"}
    forward = bench.paired_ratios(["alibi"], [64], 1, 2, 8, "cpu", 1, Console(quiet=True))
    assert list(forward["passes"]) == ["forward"] and list(forward["precision"]) == ["fp32"]
    assert forward["path"].iloc[0] != "reference"          # inference: a fast path


def test_throughput_steps_eager_and_compiled_models_alike(monkeypatch):
    bench = load("train_throughput")
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda model: compiled.append(model) or model)   # no inductor on CI
    tokens = torch.randint(0, 256, (5000,))
    step, per_step = bench.make_step("alibi", "fp32", "auto", "tiny", tokens, device="cpu", mode="compile")
    step(0)
    assert len(compiled) == 1 and per_step > 0
    bench.make_step("alibi", "fp32", "auto", "tiny", tokens, device="cpu", mode="eager")
    assert len(compiled) == 1


def test_the_gpu_preset_is_quick_made_wider_and_longer():
    gpu, quick = config.experiment("gpu"), config.experiment("quick")
    assert gpu.variants == quick.variants and gpu.train.position_lr_scales == quick.train.position_lr_scales
    assert (gpu.model.d_model, gpu.model.train_length, gpu.train.batch_size) == (256, 512, 32)
    assert gpu.model.d_model // gpu.model.n_heads == 64                     # flash attention's head size
    assert gpu.train.precision == "auto" and "copy" in gpu.eval.tasks
    tokens = gpu.train.steps * gpu.train.batch_size * gpu.model.train_length
    assert tokens == pytest.approx(9.8e6, rel=0.01)                         # the preset's comment


def test_paired_timing_of_a_window_and_a_layout():
    """A windowed layer runs its chunked band; a layout times each of its layers against as many unbiased ones."""
    bench = load("attention")
    rows = bench.paired_ratios(["rope:window=16", "rope:window=16,sinks=true*1,none"], [96], 1, 2, 8, "cpu", 1,
                               Console(quiet=True))
    assert list(rows["variant"]) == ["rope:window=16", "rope:window=16,sinks=true*1,none"]
    assert list(rows["path"]) == ["chunked", "chunked+sdpa"] and (rows["ratio"] > 0).all()
