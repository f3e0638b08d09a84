"""What a configuration needs in memory, checked before any work starts.

Linux lets a process ask for more memory than the machine has and then kills it (the OOM killer),
with no exception to catch and no message. A typing slip such as `--batch-size 100000` would end
that way, minutes into a run. So each command that sizes a model or a batch from user input first
compares what it needs with the memory the device has, and refuses at once, in one line, when it
does not fit. For training that is the peak resident set of the training process beyond Python
and torch (relbench.cost.resident.training_bytes): the step's tensors (step_bytes here: the saved
tensors measured on the real model, backward's gradients of the logits and of one layer on top) and,
on CPU, what the process holds besides them (the command's libraries and corpus, the freed blocks
the C allocator keeps). tests/test_memory.py checks the estimates against real training steps and a
real evaluation, and against the peak resident set of real `relbench train` runs, each in a fresh
process.

    need = resident.training_bytes(model_config, batch_size, "bf16", device)    # relbench.cost.resident
    require(need, device, "training xl at --batch-size 64 x --train-length 4096", "use a smaller --batch-size")

`RELBENCH_MEMORY` (for example `4GB` or `512MB`) caps the budget below what the device has, for a
machine shared with other jobs.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from pathlib import Path

import torch

from relbench.config import ModelConfig
from relbench.errors import RelbenchError, UsageError

ENV = "RELBENCH_MEMORY"
FLOAT = 4       # bytes per parameter and per optimiser moment (fp32)
UNITS = {"": 1, "b": 1, "kb": 2**10, "mb": 2**20, "gb": 2**30, "tb": 2**40}  # "k" means "kb", and so on


def parse_size(text: str) -> int:
    """'4GB' -> 4 * 2**30; a bare number is bytes. Binary units, case-insensitive."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?b?)\s*", text.lower())
    if not match or float(match.group(1)) <= 0:
        raise UsageError(f'{ENV}="{text}" is not a memory size; use for example 4GB or 512MB')
    return int(float(match.group(1)) * UNITS[match.group(2).rstrip("b") + "b" if match.group(2) else ""])


def available(device: torch.device | str = "cpu") -> int | None:
    """Bytes the device can still give: MemAvailable on CPU, free memory on CUDA; None if unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def budget(device: torch.device | str = "cpu") -> int | None:
    """The memory a command may plan to use: what the device has, capped by RELBENCH_MEMORY."""
    have = available(device)
    cap = os.environ.get(ENV)
    if cap:
        cap_bytes = parse_size(cap)
        return cap_bytes if have is None else min(have, cap_bytes)
    return have


def human(n: float) -> str:
    if n >= 2**50:
        return f"{n / 2**40:.3g} TB"
    for unit, size in (("TB", 2**40), ("GB", 2**30), ("MB", 2**20)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n / 2**10:,.0f} KB"


def parameter_count(model: ModelConfig, positions_only: bool = False) -> int:
    """Exactly the number of parameters `GPT(model)` has (`GPT.n_params(positions_only)`), counted
    without allocating its weights: the tied token embedding and the final norm, a block per layer
    (with that layer's options: a sink logit per head, Scalable-Softmax's scales) and the position
    modules (one per scheme and options where the class is `shared_across_layers`, else one per
    layer: `model.layer_encodings`), built on the meta device (shapes, no storage)."""
    from relbench import positions
    from relbench.model import Block, layer_encodings

    layout = positions.parse(model.position).layers(model.n_layers)
    with torch.device("meta"):
        encodings, _ = layer_encodings(model, layout)
        own = sum(enc.n_params() for enc in encodings)
        if positions_only:
            return own
        blocks = sum(p.numel() for layer in layout for p in Block(model, layer).parameters())
    d = model.d_model
    return model.vocab_size * d + blocks + 2 * d + own


def model_bytes(model: ModelConfig) -> int:
    """The weights alone, in fp32."""
    return FLOAT * parameter_count(model)


def qkv_bytes(length: int, batch: int, heads: int, head_dim: int) -> int:
    """q, k, v and the output of one attention call (fp32): needed by every backend."""
    return FLOAT * 4 * batch * heads * length * head_dim


def scores_bytes(backend: str, length: int, batch: int, heads: int, has_bias: bool) -> int:
    """Rough peak of the (H, L, L)-sized tensors a backend creates in a forward without gradients
    (fp32): the reference path holds two (B, H, L, L) tensors at a time (each step, from the scores
    through scaling, bias, mask and softmax, makes a new one from the last) and the (H, L, L) bias
    when there is one (measured peak RSS: tests/test_memory.py); sdpa a bias mask (and its math
    fallback the scores); chunked, split, toeplitz and flex stay O(L) per query block, and auto picks among
    those."""
    square = FLOAT * heads * length * length
    if backend == "reference":
        return (2 * batch + int(has_bias)) * square
    if backend == "sdpa" and has_bias:
        return (batch + 3) * square
    return 0


def evaluation_bytes(model: ModelConfig, backend: str, length: int, batch: int, has_bias: bool,
                     dense_bias: bool = False) -> int:
    """One evaluation forward of `batch` windows of `length` (no gradients): a layer's activations
    (residual, norm, q/k/v, attention output, MLP hidden before and after GELU), the logits and
    their fp32 log-probabilities, and what the attention backend materialises; with `dense_bias`, a
    (batch, heads, L, L) bias each sequence has its own of (a relative bias at drawn positions)."""
    tokens = batch * length
    hidden = int(model.mlp_ratio * model.d_model)
    dense = FLOAT * batch * model.n_heads * length * length if dense_bias and has_bias else 0
    return (FLOAT * tokens * (7 * model.d_model + 2 * hidden + 2 * model.vocab_size)
            + scores_bytes(backend, length, batch, model.n_heads, has_bias) + dense)


# the peak of a training step over what is resident when backward starts (tests/test_memory.py,
# measured on the second step of a fresh process, when AdamW's moments exist): backward holds the
# loss's gradient with respect to the logits and the gradient flowing into them beside the logits
# themselves (LOGIT_COPIES x B L V fp32), and one layer's gradients of its saved activations at a
# time (about BACKWARD_SHARE of the layer's share of them)
LOGIT_COPIES = 2.5
BACKWARD_SHARE = 0.5


def step_bytes(model: ModelConfig, batch_size: int, precision: str = "fp32") -> int:
    """The peak of the tensors one training step of `model.position` at `batch_size` holds: weights,
    gradients and AdamW's two moments (16 bytes per parameter), every tensor autograd saves for
    backward, and backward's own (LOGIT_COPIES, BACKWARD_SHARE). The saved tensors are measured,
    not guessed: real models run a forward and the loss at three short lengths (8, 16 and 32;
    fewer and shorter for a model trained shorter) and two batch sizes under `saved_tensors_hooks`,
    with the attention path training would take at the full length and the given precision, and
    the totals fix the five terms of
        saved(B, L) = B (a L + b P(L)) + c P(L) + e L + k,
    P(L) the (query, key) pairs that path visits: activations per token (a), attention scores per
    pair (b), a bias built once for the batch (c: FIRE's MLP runs on every pair), what the batch
    shares per position (e: without it, two lengths read the chunked path's per-position terms as
    per-pair ones, and xl at length 1024, batch 2 was estimated at 106 MB for the 73 MB a real step
    holds) and constants (k). tests/test_memory.py checks the estimate against the measured peak of
    real steps (vocabularies 256 to 50,257, fp32 and bf16, three attention paths). The probed
    models are the scheme's at one and two layers with a small vocabulary, and the vocabulary's
    share is probed once (saved_line: the configured model is never built). The probes run once
    per model and precision (a batch is then a line)."""
    weights, per_row, shared = saved_line(json.dumps(dataclasses.asdict(model), sort_keys=True), precision)
    return with_backward(model, batch_size, weights, batch_size * per_row + shared)


PROBE_VOCAB = 256   # the vocabulary of the per-layer probes (see saved_line)


@functools.lru_cache(maxsize=64)
def saved_line(model_json: str, precision: str) -> tuple[float, float, float]:
    """(weights and optimiser state, saved bytes per sequence, saved bytes shared by the batch) of
    a model (its ModelConfig as JSON) at its training length: saved(B) is linear in B.

    The saved bytes are linear in the number of layers too (every block saves the same tensors; a
    bias planned once for all layers is part of the constant), and the vocabulary's share (the
    logits, the embedding's autocast copy) does not depend on the scheme. So a deep model or a
    large vocabulary is never built: the scheme is probed at one and two layers with a vocabulary
    of PROBE_VOCAB, and the vocabulary's share is the difference of one one-layer model without
    position encoding at the two vocabularies, probed once per shape (_vocabulary_line). The
    weights are counted from the configuration (parameter_count)."""
    model = ModelConfig(**json.loads(model_json))
    weights = FLOAT * 4 * parameter_count(model)
    kinds = layer_kinds(model)
    if len(kinds) > 1:    # a layout: each kind of layer's share (its model alone at this depth, weighted)
        lines = [(share, saved_line(json.dumps(dataclasses.asdict(kind), sort_keys=True), precision)) for kind, share in kinds]
        return weights, sum(s * line[1] for s, line in lines), sum(s * line[2] for s, line in lines)
    if model.n_layers <= 2 and model.vocab_size <= PROBE_VOCAB:
        return (weights, *probe_line(model, precision))
    small = dataclasses.replace(model, vocab_size=min(model.vocab_size, PROBE_VOCAB), n_layers=min(2, model.n_layers))
    one, two = _probe_lines(small, precision, (1, small.n_layers))
    vocabulary = (_vocabulary_line(_reference_json(model), precision) if model.vocab_size > PROBE_VOCAB
                  else (0.0, 0.0))
    per_row, shared = (max(0.0, a + (model.n_layers - 1) * (b - a) + v) for a, b, v in zip(one, two, vocabulary))
    return weights, per_row, shared


def layer_kinds(model: ModelConfig) -> list[tuple[ModelConfig, float]]:
    """Each kind of layer in the model's layout as a model of that one kind at the same depth, with its
    share of the layers: what a step saves and takes is linear in the layers (saved_line), so a layout's
    is the shares' weighted sum of those models' (their common part, embedding and loss, once). A
    one-scheme model is its own one kind."""
    from relbench import positions

    texts = [layer.text for layer in positions.parse(model.position).layers(model.n_layers)]
    kinds = dict.fromkeys(texts)
    if len(kinds) == 1:
        return [(model, 1.0)]
    return [(dataclasses.replace(model, position=text), texts.count(text) / len(texts)) for text in kinds]


def vocabulary_reference(model: ModelConfig) -> ModelConfig:
    """The one-layer model without position encoding whose vocabulary share stands for every scheme's."""
    return dataclasses.replace(model, position="none", position_options={}, n_layers=1, attention="auto")


def _reference_json(model: ModelConfig) -> str:
    return json.dumps(dataclasses.asdict(vocabulary_reference(model)), sort_keys=True)


@functools.lru_cache(maxsize=16)
def _vocabulary_line(reference_json: str, precision: str) -> tuple[float, float]:
    """The saved bytes (per sequence, shared) that the model's vocabulary adds to PROBE_VOCAB's."""
    reference = ModelConfig(**json.loads(reference_json))
    full = probe_line(reference, precision)
    small = probe_line(dataclasses.replace(reference, vocab_size=PROBE_VOCAB), precision)
    return full[0] - small[0], full[1] - small[1]


def probe_line(model: ModelConfig, precision: str) -> tuple[float, float]:
    """(saved bytes per sequence, saved bytes shared by the batch) of the real model `model`, built
    and probed at three short lengths and two batch sizes (see step_bytes)."""
    return _probe_lines(model, precision, (model.n_layers,))[0]


def _probe_lines(model: ModelConfig, precision: str, layers: tuple[int, ...]) -> list[tuple[float, float]]:
    """probe_line of `model` with each number of layers in `layers` (at most model.n_layers): one
    model is built, and its first blocks stand for the shallower ones."""
    from relbench.model import GPT

    backend = training_backend(model, precision)
    probe = dataclasses.replace(model, attention=backend)
    gpt = GPT(probe).eval()  # a probe, not training: no layer behaves differently, gradients still flow
    blocks = gpt.blocks
    lines = []
    for count in layers:
        gpt.blocks = blocks[:count]
        lines.append(_fit_line(gpt, model, backend, precision))
    return lines


def _fit_line(gpt, model: ModelConfig, backend: str, precision: str) -> tuple[float, float]:
    """The saved bytes of `gpt` probed and fitted (see step_bytes)."""
    top = model.train_length
    longest = min(32, top)
    lengths = sorted({max(2, longest // 4), max(2, longest // 2), longest}) if top > 2 else [top]

    def pairs(length: int) -> int:
        return visited_pairs(length, model.n_heads, backend)

    per_sequence, whole = [], []
    for length in lengths:
        one, two = (saved_bytes(gpt, batch, length, precision) for batch in (1, 2))
        per_sequence.append(two - one)                    # a L + b P(L)
        whole.append(2 * one - two)                       # c P(L) + e L + k
    if len(lengths) == 1:                                 # too short to separate L from L^2: scale by B alone
        return per_sequence[0], whole[0]

    def fit(columns: list[list[float]], totals: list[int]) -> list[float]:
        """The non-negative coefficients of the columns that give the totals (as many as columns)."""
        solved = torch.linalg.solve(torch.tensor(columns, dtype=torch.float64),
                                    torch.tensor(totals, dtype=torch.float64))
        return [max(0.0, float(x)) for x in solved]

    a, b = fit([[n, pairs(n)] for n in lengths[-2:]], per_sequence[-2:])
    if len(lengths) == 3:
        c, e, k = fit([[pairs(n), n, 1] for n in lengths], whole)
    else:                                                 # two lengths: no separate per-position term
        (c, k), e = fit([[pairs(n), 1] for n in lengths], whole), 0.0
    length, target = model.train_length, pairs(model.train_length)
    return a * length + b * target, c * target + e * length + k


def visited_pairs(length: int, heads: int, backend: str) -> int:
    """The (query, key) pairs an attention path computes a score for at `length`: every pair where it
    builds the square, the causal blocks' where it runs chunked."""
    from relbench.attention import chunk_block

    if backend != "chunked":
        return length * length
    block = chunk_block(length, heads)
    return sum((end := min(length, start + block)) * (end - start) for start in range(0, length, block))


def with_backward(model: ModelConfig, batch_size: int, weights: float, saved: float) -> int:
    """Weights and optimiser state, the saved tensors, and what backward adds at its peak."""
    logits = FLOAT * batch_size * model.train_length * model.vocab_size
    layers = max(0.0, saved - 2 * logits)     # the saved tensors of the blocks, not of the loss
    return int(weights + saved + LOGIT_COPIES * logits + BACKWARD_SHARE * layers / max(1, model.n_layers))


def training_backend(model: ModelConfig, precision: str) -> str:
    """The attention path training takes at the model's length (what `attention.choose` picks; in a
    layout, the most memory-hungry of its layers': reference, then chunked, then the rest)."""
    from relbench import positions
    from relbench.attention import choose

    if model.attention != "auto":
        return model.attention
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    q = torch.zeros(1, model.n_heads, 2, model.head_dim, dtype=dtype)
    x = torch.zeros(1, 2, model.d_model, dtype=dtype)        # the layer input, for input-dependent schemes
    paths = []
    for layer in positions.parse(model.position).pattern:
        enc = layer.build(**model.position_shape)
        path = choose(enc.plan(2, 2, q, q, x) if enc.adds_bias else None, q, model.train_length, grad=True)
        paths.append("chunked" if (layer.window or layer.chunk or layer.sinks) and path != "reference" else path)
    return next((path for path in ("reference", "chunked") if path in paths), paths[0])


def saved_bytes(gpt, batch: int, length: int, precision: str) -> int:
    """Bytes of the distinct storages autograd saves for backward in one forward and loss
    (parameters excluded, and the transposed views of them a linear layer saves: they are counted
    with their optimiser state)."""
    return sum(saved_storages(gpt, batch, length, precision))


def saved_storages(gpt, batch: int, length: int, precision: str) -> list[int]:
    """The bytes of each storage saved_bytes counts, in the order autograd first saves it: the same
    storages in the same order at every batch size above one (the same operations run; at one, some
    copies are views, and fewer storages are saved)."""
    import torch.nn.functional as F

    storages: dict[int, int] = {}
    weights = {p.untyped_storage().data_ptr() for p in gpt.parameters()}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            storages[storage.data_ptr()] = storage.nbytes()
        # detached: a saved output kept with its own grad_fn is a reference cycle through C++ that
        # no gc.collect() frees when backward never runs (here it never does), and every probe's
        # model and graph would stay resident (1.9 GB per variant of the paper preset)
        return tensor.detach()

    tokens = torch.zeros(batch, length, dtype=torch.long)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        logits = gpt(tokens)
        F.cross_entropy(logits.float().flatten(0, 1), tokens.flatten())
    return list(storages.values())


def require(need: int, device: torch.device | str, what: str, fix: str) -> None:
    """Refuse (RelbenchError) when `need` bytes do not fit in the budget of `device`."""
    have = budget(device)
    if have is not None and need > have:
        capped = f" ({ENV} caps it)" if os.environ.get(ENV) else ""
        raise RelbenchError(f"{what} needs at least {human(need)} of memory and {torch.device(device)} has "
                            f"{human(have)} available{capped}; {fix}")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether an exception is an allocation failure (CUDA's OutOfMemoryError, CPU's allocator, Python)."""
    text = str(error).lower()
    return (isinstance(error, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in text
            or "can't allocate memory" in text)
