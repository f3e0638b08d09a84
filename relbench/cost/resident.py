"""What a training run needs in memory (training_bytes: the dry run's memory column, and what the
memory check compares with the memory the device has): on CPU, the training process's peak resident
set, which holds beyond the tensors of its step (memory.step_bytes) what this module adds.

Two terms, measured against a process that only imports relbench and torch (docs/performance.md,
"Memory"; tests/test_resident.py runs `relbench train` to check them):
- RUNTIME: the command's own libraries (75 MB), the embedded corpus (30 MB), the modules AdamW's first
  construction imports (torch._dynamo, sympy: 68 MB) and the kernels' workspaces on a first step
  (17 MB), with room for the retrieval tasks' trials;
- the heap's kept blocks: glibc serves a block below its mmap ceiling (MMAP_CEILING) from its heap,
  and a block freed there stays resident, to be reused by a later request it fits. A step allocates
  its activations (what autograd saves per sequence) in the forward and frees them in the backward,
  among temporaries of other sizes, in an order the next step's requests do not retrace, so at the
  peak the heap holds free blocks beside the live ones: HEAP_KEPT of those bytes in fp32,
  HEAP_KEPT_BF16 in bf16, where autocast's copies and the fp32 gradients of the activations double
  a step's allocations per saved byte; and HEAP_KEPT of the weights' gradients, allocated anew each
  step (zero_grad sets them to None) beside AdamW's temporaries of their sizes. What the batch shares
  (a weight's bf16 copy, a bias built once) comes back at its size each step and refills its own
  block. A block at or above the ceiling is mapped for itself and returned when freed, and keeps
  nothing: the large tensors of a large model are (the paper preset's logits at batch 1).

On CUDA none of this is device memory, and training_bytes leaves it out.

    need = training_bytes(model_config, batch_size, "bf16", device)
    memory.require(need, device, "training xl at --batch-size 64", "use a smaller --batch-size")
"""

from __future__ import annotations

import dataclasses
import functools
import json

import torch

from relbench.config import ModelConfig
from relbench.cost import memory

RUNTIME = 200 * 2**20
# A run side by side (--jobs) trains in a process of its own, which loads Python, torch and relbench
# again before it holds anything of its own: 184 MB private and 211 MB proportional (shared library
# pages counted once over the processes that map them) on a 2-core Xeon, torch 2.13, from
# /proc/self/smaps_rollup after those imports; the fault-table session measured about 220 MB per job
# above the estimate of one run. That process is not the one training_bytes measures above.
SIDE_PROCESS = 220 * 2**20
HEAP_KEPT = 0.6
HEAP_KEPT_BF16 = 1.2
MMAP_CEILING = 32 * 2**20   # glibc's largest mmap threshold on 64 bits (DEFAULT_MMAP_THRESHOLD_MAX)
ROLE_LENGTH = 32            # the storages are probed at this length (at most), and scaled to the model's

Roles = tuple[tuple[float, float], ...]   # each saved storage's bytes per sequence and shared by the batch


def training_bytes(model: ModelConfig, batch_size: int, precision: str = "fp32",
                   device: torch.device | str = "cpu") -> int:
    """The peak memory a training run of `model.position` at `batch_size` needs on `device`: on CPU,
    the peak resident set of the training process beyond what importing Python, relbench and torch
    takes (memory.step_bytes, RUNTIME and the heap's kept blocks); on CUDA, step_bytes (device
    memory). Where it is checked, after the imports and the corpus, it errs high on CPU by about
    100 MB."""
    weights, per_row, shared = memory.saved_line(json.dumps(dataclasses.asdict(model), sort_keys=True), precision)
    step = memory.with_backward(model, batch_size, weights, batch_size * per_row + shared)
    return process_bytes(model, batch_size, precision, step, batch_size * per_row, device)


def largest_batch(model: ModelConfig, precision: str, have: int, most: int, device: torch.device | str = "cpu") -> int:
    """The largest batch (at most `most`) whose training_bytes on `device` fit in `have` bytes; 0 when
    not even one sequence does. Found by bisection: the estimate grows with the batch, but for the
    heap's kept blocks, which drop where a storage passes the mmap ceiling (the answer then fits,
    and is the largest up to such a drop)."""
    if training_bytes(model, 1, precision, device) > have:
        return 0
    low, high = 1, max(1, most)
    while low < high:
        middle = (low + high + 1) // 2
        if training_bytes(model, middle, precision, device) <= have:
            low = middle
        else:
            high = middle - 1
    return low


def process_bytes(model: ModelConfig, batch_size: int, precision: str, step: int, rows: float,
                  device: torch.device | str = "cpu") -> int:
    """A training step's `step` bytes (of which autograd saves `rows` per sequence of the batch) as the
    process holds them on `device`: on CPU with RUNTIME and the heap's kept blocks (see the module
    doc), on CUDA as they are."""
    if torch.device(device).type != "cpu":
        return step
    activations = (HEAP_KEPT_BF16 if precision == "bf16" else HEAP_KEPT) * heap_share(model, batch_size, precision) * rows
    return int(step + RUNTIME + activations + HEAP_KEPT * gradient_heap_bytes(model)
               + sequence_bias_bytes(model, batch_size, precision))


def sequence_bias_bytes(model: ModelConfig, batch_size: int, precision: str) -> int:
    """The heap's blocks kept of the bias that a scheme whose bias depends on the sequence (on its
    queries, keys or layer input: Shaw, CoPE, DAPE, FoX, PaTH) builds in each of its layers for every
    sequence, a (batch, heads, pairs) tensor in the forward and its gradient in the backward: not saved
    by autograd, so memory.saved_line does not see them, and freed within the layer, at sizes the next
    step's requests do not fill again. Both counted whole, in fp32, for every such layer (measured, not
    derived: docs/performance.md, "Memory"); nothing where one layer's lies at or above the ceiling."""
    from relbench import positions

    layers = positions.parse(model.position).layers(model.n_layers)
    count = sum(1 for layer in layers if layer.cls.adds_bias and
                (layer.cls.content_dependent or layer.cls.key_dependent or layer.cls.input_dependent))
    if not count:
        return 0
    pairs = memory.visited_pairs(model.train_length, model.n_heads, memory.training_backend(model, precision))
    one_layer = memory.FLOAT * batch_size * model.n_heads * pairs
    return 2 * count * one_layer if one_layer < MMAP_CEILING else 0


def gradient_heap_bytes(model: ModelConfig) -> int:
    """The bytes of the weights' gradients (fp32, whatever the precision) that glibc serves from its
    heap: those below the ceiling (the position module's counted whole)."""
    from relbench import positions
    from relbench.model import Block

    with torch.device("meta"):
        blocks = [p.numel() for layer in positions.parse(model.position).layers(model.n_layers)
                  for p in Block(model, layer).parameters()]

    def below(numel: int) -> int:
        return memory.FLOAT * numel if memory.FLOAT * numel < MMAP_CEILING else 0

    return (sum(below(n) for n in blocks) + below(model.vocab_size * model.d_model)
            + memory.FLOAT * (2 * model.d_model + memory.parameter_count(model, positions_only=True)))


def heap_share(model: ModelConfig, batch_size: int, precision: str) -> float:
    """The share of a step's saved bytes per sequence that lie in storages below the ceiling at
    `batch_size`, composed as the saved bytes are (memory.saved_line: the scheme at one and two
    layers, the vocabulary's share from the reference model at the two vocabularies). A storage's
    bytes per sequence at the training length are its bytes at ROLE_LENGTH scaled linearly, its bytes
    shared by the batch as probed: exact for what is per token and for a weight's copy, low for what
    grows faster, which then counts as kept (an estimate that errs high). 1 when the storages could
    not be paired across batch sizes."""
    kinds = memory.layer_kinds(model)
    if len(kinds) > 1:    # a layout: the kinds' shares weighted as their layers are (an estimate of a ratio)
        return sum(share * heap_share(kind, batch_size, precision) for kind, share in kinds)
    lines = role_lines(json.dumps(dataclasses.asdict(model), sort_keys=True), precision)
    reference = memory.vocabulary_reference(model)
    vocabulary = (vocabulary_roles(json.dumps(dataclasses.asdict(reference), sort_keys=True), precision, model.train_length)
                  if model.vocab_size > memory.PROBE_VOCAB else ((), ()))
    if lines is None or vocabulary is None:
        return 1.0
    one, two, full, small = (_below(roles, batch_size) for roles in (*lines, *vocabulary))
    layers = model.n_layers - 1
    heap, total = (a + layers * (b - a) + v - w for a, b, v, w in zip(one, two, full, small))
    return min(1.0, max(0.0, heap / total)) if total > 0 else 1.0


def _below(roles: Roles, batch: int) -> tuple[float, float]:
    """(bytes per sequence of the storages below the ceiling at `batch` sequences, of all)."""
    below = [per_row for per_row, shared in roles if batch * per_row + shared < MMAP_CEILING]
    return sum(below), sum(per_row for per_row, _ in roles)


@functools.lru_cache(maxsize=64)
def role_lines(model_json: str, precision: str) -> tuple[Roles, Roles] | None:
    """The saved storages (memory.saved_storages) of the scheme's model at one and two layers and a
    vocabulary of at most PROBE_VOCAB, at the training length (see _roles); None if they do not pair."""
    from relbench.model import GPT

    model = ModelConfig(**json.loads(model_json))
    small = dataclasses.replace(model, vocab_size=min(model.vocab_size, memory.PROBE_VOCAB), n_layers=min(2, model.n_layers))
    gpt = GPT(dataclasses.replace(small, attention=memory.training_backend(model, precision))).eval()
    blocks = gpt.blocks
    lines = []
    for count in (1, small.n_layers):
        gpt.blocks = blocks[:count]
        lines.append(_roles(gpt, model.train_length, precision))
    return None if None in lines else (lines[0], lines[1])


@functools.lru_cache(maxsize=16)
def vocabulary_roles(reference_json: str, precision: str, length: int) -> tuple[Roles, Roles] | None:
    """The saved storages of the vocabulary's reference model (memory.vocabulary_reference) at its
    vocabulary and at PROBE_VOCAB, at `length` (see _roles); None if they do not pair."""
    from relbench.model import GPT

    reference = ModelConfig(**json.loads(reference_json))
    full, small = (_roles(GPT(dataclasses.replace(reference, vocab_size=vocab)).eval(), length, precision)
                   for vocab in (reference.vocab_size, memory.PROBE_VOCAB))
    return None if full is None or small is None else (full, small)


def _roles(gpt, length: int, precision: str) -> Roles | None:
    """Each saved storage's (bytes per sequence, bytes shared by the batch) at `length`: paired across
    two and three sequences (at one, some copies are views, and fewer storages are saved) at
    ROLE_LENGTH or less, the bytes per sequence scaled linearly to `length`; None if they do not pair."""
    probe = min(ROLE_LENGTH, length)
    two, three = (memory.saved_storages(gpt, batch, probe, precision) for batch in (2, 3))
    if len(two) != len(three):
        return None
    return tuple((max(0, b - a) * length / probe, max(0, 3 * a - 2 * b)) for a, b in zip(two, three))
