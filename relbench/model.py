"""A small pre-LayerNorm GPT whose position scheme is chosen by name.

    from relbench.model import GPT, ModelConfig
    model = GPT(ModelConfig(vocab_size=256, position="alibi"))
    logits = model(tokens)            # tokens (B, L) int64 -> logits (B, L, V)

Every variant shares the same token embedding (tied to the output layer), blocks and
initialisation; parameters are initialised per name, so two models with the same seed start
from identical weights wherever their parameters coincide.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable

import torch
from torch import Tensor, nn

from relbench import positions
from relbench.attention import check as check_backend
from relbench.attention import scheme_attention
from relbench.config import INIT_STD, ModelConfig
from relbench.errors import UsageError
from relbench.positions.base import PositionEncoding
from relbench.positions.forms import logn_scale
from relbench.positions.plan import BiasPlan, RowScaledPlan, log_keys
from relbench.positions.spec import Layer

__all__ = ["GPT", "ModelConfig"]

Observer = Callable[[Tensor, Tensor, "BiasPlan | None"], None]


class SelfAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer: Layer):
        super().__init__()
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.proj = nn.Linear(config.d_model, config.d_model, bias=False)
        # Scalable-Softmax (Nakanishi 2025), "VARIANT:ssmax=true": the logits of query i, content and bias,
        # times s_h log n_i (n_i = i + 1 keys), s_h learned per layer and head from 1 (BAM's bam_ssmax)
        self.ssmax = nn.Parameter(torch.ones(config.n_heads)) if layer.ssmax else None
        self.ssmax_bias = layer.ssmax_bias     # false: the content logits only
        # the layer options of positions/spec.py: a sliding window, chunks, a sink logit per head, a query temperature
        self.window, self.chunk = layer.window, layer.chunk
        self.sinks = nn.Parameter(torch.zeros(config.n_heads)) if layer.sinks else None
        self.layer = layer

    def forward(self, x: Tensor, position: PositionEncoding, plan: BiasPlan | None, backend: str,
                observe: Observer | None = None, positions: Tensor | None = None) -> Tensor:
        B, L, D = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.n_heads, D // self.n_heads).permute(2, 0, 3, 1, 4)  # (B, H, L, Dh) each
        q, k, plan = position.prepare(q, k, plan, x, positions)               # x: FoX's gates read the input
        if self.ssmax is not None:
            q, plan = scalable_softmax(q, plan, self.ssmax, k.shape[-2], self.ssmax_bias)
        if self.layer.temperature != "none":
            q = q * query_temperature(self.layer, position.train_length, k.shape[-2] - L, k.shape[-2],
                                      q.device).to(q.dtype)[:, None]
        if observe is not None:
            observe(q, k, plan)
        y = scheme_attention(position, q, k, v, plan, backend, self.window, self.sinks, self.chunk)   # (B, H, L, Dh)
        return self.proj(y.transpose(1, 2).reshape(B, L, D))                  # (B, L, D)


def query_temperature(layer: Layer, train_length: int, q_start: int, q_end: int, device=None) -> Tensor:
    """(q,) the factor a layer's `temperature` option multiplies the queries at positions [q_start, q_end)
    by (positions/spec.py): Llama 4's log(floor((p + 1) / floor) + 1) * scale + 1 (floor 0: the training
    length), or the `@logn` form's log-length factor at each query, log(p + 1) / log(L_train) beyond training."""
    p = torch.arange(q_start, q_end, device=device, dtype=torch.float32)
    if layer.temperature == "logn":
        return torch.tensor([logn_scale(int(n), train_length) for n in (p + 1).tolist()], device=device)
    floor = layer.temperature_floor or train_length
    return torch.log(torch.floor((p + 1) / floor) + 1) * layer.temperature_scale + 1


def scalable_softmax(q: Tensor, plan: BiasPlan | None, scales: Tensor, k_len: int,
                     bias: bool = True) -> tuple[Tensor, BiasPlan | None]:
    """Queries and plan with every logit of query row i (absolute position k_len - q_len + i) times
    scales_h * log(n_i), n_i the keys it sees: q scaled per row and head, the bias by a RowScaledPlan
    (with `bias` false the bias is left as it is: the content logits alone are scaled)."""
    q_len = q.shape[-2]
    factor = scales.to(q.dtype)[:, None] * log_keys(k_len - q_len, k_len, q.device).to(q.dtype)   # (H, q_len)
    return q * factor[..., None], (RowScaledPlan(plan, scales) if plan is not None and bias else plan)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        hidden = int(config.mlp_ratio * config.d_model)
        self.fc = nn.Linear(config.d_model, hidden, bias=False)
        self.proj = nn.Linear(hidden, config.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(nn.functional.gelu(self.fc(x)))


def layer_encodings(config: ModelConfig, layout: tuple[Layer, ...]) -> tuple[list[PositionEncoding], list[int]]:
    """The position modules of a model with this layout, and the module each layer uses: one instance
    for all the layers with the same scheme and options where the scheme shares across layers (T5,
    ALiBi, absolute), one per layer otherwise. A one-scheme spec gives one module, or one per layer, as
    relbench has always built them (checkpoints keep their parameter names)."""
    instances: list[PositionEncoding] = []
    index: list[int] = []
    shared: dict[str, int] = {}
    for layer in layout:
        options = {**layer.options, **config.position_options}
        share = layer.cls.layers_share(options)
        if share and layer.key in shared:
            index.append(shared[layer.key])
            continue
        if share:
            shared[layer.key] = len(instances)
        index.append(len(instances))
        instances.append(positions.build(layer.scheme, **config.position_shape, **options))
    return instances, index


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: Layer):
        super().__init__()
        self.ln_attn = nn.LayerNorm(config.d_model)
        self.attn = SelfAttention(config, layer)
        self.ln_mlp = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(self, x: Tensor, position: PositionEncoding, plan: BiasPlan | None, backend: str,
                observe: Observer | None = None, positions: Tensor | None = None) -> Tensor:
        x = x + self.attn(self.ln_attn(x), position, plan, backend, observe, positions)
        return x + self.mlp(self.ln_mlp(x))


class GPT(nn.Module):
    def __init__(self, config: ModelConfig, seed: int = 0):
        super().__init__()
        self.config = config
        spec = positions.parse(config.position)
        self.layout = spec.layers(config.n_layers)
        instances, self.layer_position = layer_encodings(config, self.layout)
        self.positions = nn.ModuleList(instances)
        self.tok = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config, layer) for layer in self.layout)
        self.ln_out = nn.LayerNorm(config.d_model)
        for cls in spec.schemes:
            check_backend(config.attention, cls)
        # randomized positions (VARIANT:random_positions=N): training draws each sequence's positions
        # from [0, N) (training/batches.py: random_positions) and passes them to forward
        self.random_positions = spec.random_positions
        if self.random_positions and self.random_positions <= config.train_length:
            raise UsageError(f'random_positions={self.random_positions} in variant "{config.position}" draws the '
                             f"positions of a training sequence from [0, N): N must exceed the training length "
                             f"{config.train_length}")
        self.reset_parameters(seed)

    def position(self, layer: int) -> PositionEncoding:
        """The encoding layer `layer` uses (one object for the layers that share it)."""
        return self.positions[self.layer_position[layer]]

    @property
    def max_length(self) -> int | None:
        limits = [enc.max_length if enc.form is None else enc.form.max_length(enc) for enc in self.positions]
        known = [limit for limit in limits if limit is not None]
        return min(known) if known else None

    def forward(self, tokens: Tensor, observe: Callable[[int, Tensor, Tensor, BiasPlan | None], None] | None = None,
                backend: str | None = None, positions: Tensor | None = None) -> Tensor:
        """Logits (B, L, V) for tokens (B, L). `observe(layer, q, k, plan)`, when given, sees each
        layer's rotated queries and keys and its bias plan just before attention (relbench inspect
        reads attention from here); `backend` overrides the configured attention backend.
        `positions` (B, L), increasing integers: where the tokens sit when not at 0 .. L - 1
        (randomized positions in training; schemes that declare `takes_positions`); None: 0 .. L - 1, or
        where the encodings' evaluation form places them (`drawn`)."""
        _B, L = tokens.shape
        x = self.tok(tokens)                                       # (B, L, D)
        for enc in self.positions:
            enc.check_length(L)
        placing = next((enc for enc in self.positions if enc.form is not None and enc.form.places), None)
        if positions is None and placing is not None:
            positions = placing.form.placement(placing, tokens)    # an evaluation form's positions (drawn)
        for enc in self.positions:                                 # an absolute scheme acts at the input
            absolute = enc.embed(L, **enc.placed(positions))
            if absolute is not None:
                x = x + absolute.to(x.dtype)                       # (L, D) or (B, L, D) broadcast over B
        # a bias that layers share and that does not depend on the batch is planned once per forward pass
        uses = [self.layer_position.count(i) for i in range(len(self.positions))]
        plans: dict[int, BiasPlan | None] = {}
        backend = self.config.attention if backend is None else backend
        for i, block in enumerate(self.blocks):
            index, enc = self.layer_position[i], self.position(i)
            batch_dependent = enc.content_dependent or enc.key_dependent or enc.input_dependent
            if index not in plans and uses[index] > 1 and enc.adds_bias and not batch_dependent:
                plans[index] = enc.plan(L, L, **enc.placed(positions))
            hook = None if observe is None else (lambda q, k, p, layer=i: observe(layer, q, k, p))
            x = block(x, enc, plans.get(index), backend, hook, positions)
        x = self.ln_out(x)
        return torch.matmul(x, self.tok.weight.t())               # (B, L, V), tied embedding

    @staticmethod
    def generator(module_name: str, seed: int = 0) -> torch.Generator:
        """The generator that initialises module `module_name`: seeded by (seed, module name), so a
        module's initial weights do not depend on which other modules the model has."""
        return torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(module_name.encode()))

    @torch.no_grad()
    def reset_parameters(self, seed: int = 0) -> None:
        """Initialise every parameter from a generator seeded by (seed, module name). A position
        module initialises its own children (FIRE's and dynamic's MLPs, transformer-xl's W_R) with
        its own rule; the model hands it a generator and never reaches past it."""
        residual_std = INIT_STD / math.sqrt(2 * self.config.n_layers)   # GPT-2's scaled residual init
        owned: list[str] = []   # names of position modules: their descendants are theirs to initialise
        for module_name, module in self.named_modules():
            if any(module_name.startswith(prefix + ".") for prefix in owned):
                continue
            generator = self.generator(module_name, seed)
            if isinstance(module, PositionEncoding):
                owned.append(module_name)
                module.reset_parameters(generator)
            elif isinstance(module, (nn.Linear, nn.Embedding)):
                std = residual_std if module_name.endswith(("attn.proj", "mlp.proj")) else INIT_STD
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * std)
            elif isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()
            elif isinstance(module, SelfAttention):
                if module.ssmax is not None:
                    module.ssmax.fill_(1.0)
                if module.sinks is not None:      # gpt-oss: normal(0, initializer_range)
                    module.sinks.copy_(torch.randn(module.sinks.shape, generator=generator) * INIT_STD)

    def project_parameters(self) -> None:
        """After an optimiser step: each position module restores its parameters' constraints."""
        for module in self.positions:
            module.project_parameters()

    def n_params(self, positions_only: bool = False) -> int:
        params = self.positions.parameters() if positions_only else self.parameters()
        return sum(p.numel() for p in params)
