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
from relbench.positions.plan import BiasPlan, RowScaledPlan, log_keys

__all__ = ["GPT", "ModelConfig"]

Observer = Callable[[Tensor, Tensor, "BiasPlan | None"], None]


class SelfAttention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.proj = nn.Linear(config.d_model, config.d_model, bias=False)
        # Scalable-Softmax (Nakanishi 2025), "VARIANT:ssmax=true": the logits of query i, content and bias,
        # times s_h log n_i (n_i = i + 1 keys), s_h learned per layer and head from 1 (BAM's bam_ssmax)
        options = positions.training_options(config.position)
        self.ssmax = nn.Parameter(torch.ones(config.n_heads)) if options.get("ssmax", False) else None
        self.ssmax_bias = options.get("ssmax_bias", True)     # false: the content logits only

    def forward(self, x: Tensor, position: PositionEncoding, plan: BiasPlan | None, backend: str,
                observe: Observer | None = None, positions: Tensor | None = None) -> Tensor:
        B, L, D = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.n_heads, D // self.n_heads).permute(2, 0, 3, 1, 4)  # (B, H, L, Dh) each
        q, k, plan = position.prepare(q, k, plan, x, positions)               # x: FoX's gates read the input
        if self.ssmax is not None:
            q, plan = scalable_softmax(q, plan, self.ssmax, k.shape[-2], self.ssmax_bias)
        if observe is not None:
            observe(q, k, plan)
        y = scheme_attention(position, q, k, v, plan, backend)                # (B, H, L, Dh)
        return self.proj(y.transpose(1, 2).reshape(B, L, D))                  # (B, L, D)


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


class Block(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.ln_attn = nn.LayerNorm(config.d_model)
        self.attn = SelfAttention(config)
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
        name, options = positions.parse_spec(config.position)
        options.update(config.position_options)
        cls = positions.get(name)
        shape = config.position_shape
        copies = 1 if cls.layers_share(options) else config.n_layers
        self.positions = nn.ModuleList(positions.build(name, **shape, **options) for _ in range(copies))
        self.tok = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_out = nn.LayerNorm(config.d_model)
        check_backend(config.attention, cls)
        # randomized positions (VARIANT:random_positions=N): training draws each sequence's positions
        # from [0, N) (training/batches.py: random_positions) and passes them to forward
        self.random_positions = int(positions.training_options(config.position).get("random_positions", 0))
        if self.random_positions and self.random_positions <= config.train_length:
            raise UsageError(f'random_positions={self.random_positions} in variant "{config.position}" draws the '
                             f"positions of a training sequence from [0, N): N must exceed the training length "
                             f"{config.train_length}")
        self.reset_parameters(seed)

    def position(self, layer: int) -> PositionEncoding:
        """The encoding layer `layer` uses (the same object for every layer when shared)."""
        return self.positions[0] if len(self.positions) == 1 else self.positions[layer]

    @property
    def max_length(self) -> int | None:
        first = self.positions[0]
        return first.max_length if first.form is None else first.form.max_length(first)

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
        first = self.positions[0]
        first.check_length(L)
        if positions is None and first.form is not None:
            positions = first.form.placement(first, tokens)        # an evaluation form's positions (drawn)
        given = first.placed(positions)
        absolute = first.embed(L, **given)
        if absolute is not None:
            x = x + absolute.to(x.dtype)                           # (L, D) or (B, L, D) broadcast over B
        # a bias shared by all layers that does not depend on the batch is planned once per forward pass
        batch_dependent = first.content_dependent or first.key_dependent or first.input_dependent
        shared = len(self.positions) == 1 and first.adds_bias and not batch_dependent
        plan = first.plan(L, L, **given) if shared else None
        backend = self.config.attention if backend is None else backend
        for i, block in enumerate(self.blocks):
            hook = None if observe is None else (lambda q, k, p, layer=i: observe(layer, q, k, p))
            x = block(x, self.position(i), plan, backend, hook, positions)
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
            elif isinstance(module, SelfAttention) and module.ssmax is not None:
                module.ssmax.fill_(1.0)

    def project_parameters(self) -> None:
        """After an optimiser step: each position module restores its parameters' constraints."""
        for module in self.positions:
            module.project_parameters()

    def n_params(self, positions_only: bool = False) -> int:
        params = self.positions.parameters() if positions_only else self.parameters()
        return sum(p.numel() for p in params)
