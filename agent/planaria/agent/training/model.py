"""The GPT decoder as an ordered list of planner layers, its per-layer optimizer and state.

The model is a nanoGPT-style pre-LN decoder built from a `planaria.contract.shapes.ModelShape`
(the one config; there is no second one here). It is never one `nn.Module`: it is the list the
planner partitions into stages,

    layer 0                 `Embedding`  int64 token ids [b, T] -> hidden [b, T, d]
    layers 1..num_layers    `Block`      hidden -> hidden (causal attention + GELU MLP)
    layer num_layers + 1    `Head`       hidden -> logits [b, T, vocab] (final LN, untied proj)

so a worker holding stage layers 5..8 builds exactly those. Every layer's parameters come from
(seed, layer index) alone, drawn on the CPU in float32 and then moved to the device, so a worker
holding any subset of layers has bit-identical parameters to one process holding all of them.
There is no dropout: the same inputs give the same outputs wherever a layer runs.

Training semantics shared by the reference trainer and the pipeline executor live here too:
`micro_batch_loss` (how a micro-batch's loss is scaled so gradients sum over the global batch)
and one AdamW per layer (`make_optimizer`), with `LayerState` to copy or snapshot a layer's
parameters and optimizer state bit-exactly between processes.

Not here: data (`planaria.agent.training.data`), the training loop
(`planaria.agent.training.reference`), schedules and communication (the executor).

Errors:

    ModelError
    ├── OptimizerConfigError (ValueError)   a hyper-parameter out of range
    └── LayerStateError (ValueError)        a LayerState that does not fit its target layer
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from planaria.agent.training import hf_models
from planaria.contract import shapes

INIT_STD = 0.02  # GPT-2's initial weight standard deviation
# Multiplier and modulus turning (seed, layer index) into one torch seed without Python's hash.
SEED_STRIDE = 1_000_003
SEED_MODULUS = 2**63


class ModelError(Exception):
    """Base of the errors this module raises on purpose."""


class OptimizerConfigError(ModelError, ValueError):
    """An optimizer hyper-parameter out of range; the message names it and the valid range."""


class LayerStateError(ModelError, ValueError):
    """A LayerState whose names, shapes or layer index do not match the target layer."""


# --- layers -------------------------------------------------------------------------------------


class Embedding(nn.Module):
    """Planner layer 0: token plus learned position embeddings.

    The tables are bare parameters rather than `nn.Embedding`s: its default init draws normal
    values, which on the meta device costs seconds of one-off imports in every process.
    """

    def __init__(self, shape: shapes.ModelShape) -> None:
        super().__init__()
        self.tokens = nn.Parameter(torch.empty(shape.vocab_size, shape.d_model))
        self.positions = nn.Parameter(torch.empty(shape.seq_len, shape.d_model))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.tokens) + self.positions[: ids.shape[1]]


class Block(nn.Module):
    """A pre-LN transformer block: x + attn(LN(x)), then x + mlp(LN(x))."""

    def __init__(self, shape: shapes.ModelShape) -> None:
        super().__init__()
        d = shape.d_model
        self.num_heads = shape.num_heads
        self.ln_1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.attn_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, shape.ffn_dim)
        self.mlp_proj = nn.Linear(shape.ffn_dim, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn_proj(self.attention(self.ln_1(x)))
        mlp: torch.Tensor = self.mlp_proj(F.gelu(self.fc(self.ln_2(x))))
        return x + mlp

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        """Causal multi-head self-attention of [b, T, d] -> [b, T, d] (before the projection)."""
        b, t, d = x.shape
        q, k, v = (self._heads(z) for z in self.qkv(x).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).contiguous().view(b, t, d)

    def _heads(self, z: torch.Tensor) -> torch.Tensor:
        """[b, T, d] -> [b, heads, T, d / heads]."""
        b, t, d = z.shape
        return z.view(b, t, self.num_heads, d // self.num_heads).transpose(1, 2)


class Head(nn.Module):
    """The last planner layer: final LayerNorm and the untied output projection to logits."""

    produces_logits = True  # `is_head`

    def __init__(self, shape: shapes.ModelShape) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(shape.d_model)
        self.proj = nn.Linear(shape.d_model, shape.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.proj(self.ln_f(x))
        return logits


def is_head(layer: nn.Module) -> bool:
    """Whether `layer` is a model's last layer (it outputs logits, the loss follows it)."""
    return bool(getattr(layer, "produces_logits", False))


def layer_name(shape: shapes.ModelShape, index: int) -> str:
    """The planner's name of layer `index`: embedding, block.0 .. block.{L-1}, head."""
    _check_index(shape, index)
    if index == 0:
        return "embedding"
    if index == shape.num_layers + 1:
        return "head"
    return f"block.{index - 1}"


def layer_seed(seed: int, index: int) -> int:
    """The torch seed of layer `index`: arithmetic on (seed, index) only, never a hash."""
    return (seed * SEED_STRIDE + index) % SEED_MODULUS


def build_layer(
    shape: shapes.ModelShape,
    seed: int,
    index: int,
    device: str | torch.device = "cpu",
    *,
    initialise: bool = True,
) -> nn.Module:
    """Planner layer `index` of `shape`, initialised from (seed, index) alone.

    Modules are created on the meta device (no throw-away default init) and then filled on the
    CPU from a generator seeded with `layer_seed`, so the values do not depend on the device,
    on torch's global RNG, or on which other layers this process builds. A Hugging Face family
    (`shape.family`) builds and initialises its layers in `hf_models` the same way, then takes
    them from its local weights folder when it names one (`hf_models.load_weights`).

    `initialise=False` leaves the parameters uninitialised, allocated on `device` directly: for
    a layer whose every parameter is overwritten next (`load_layer_state`, a restore from a
    snapshot, a checkpoint or a peer). Buffers (a Llama's rotary tables) are still computed.
    The random init of gpt3-medium's layers costs about 2 s of one CPU core, a 7B model's
    stage proportionally more, on every restore.
    """
    _check_index(shape, index)
    hf = shape.family != "gpt"
    if hf:
        hf_models.hf_config(shape)  # imports transformers outside the meta context below
    with torch.device("meta"):
        layer = hf_models.layer_module(shape, index) if hf else _layer_module(shape, index)
    if not initialise:
        _materialise(layer, torch.device(device))
        if hf:
            with torch.no_grad():
                hf_models.rotary_buffers(shape, layer)
        return layer.to(device)  # buffers only: the parameters are there already
    _materialise(layer)
    generator = torch.Generator(device="cpu").manual_seed(layer_seed(seed, index))
    with torch.no_grad():
        if hf:
            hf_models.rotary_buffers(shape, layer)
            tie = torch.Generator(device="cpu").manual_seed(layer_seed(seed, 0))
            hf_models.initialise(shape, layer, index, (generator, tie))
            if shape.hf_weights:
                hf_models.load_weights(shape, index, layer)
        else:
            _initialise(layer, generator, INIT_STD / math.sqrt(2 * shape.num_layers))
    return layer.to(device)


def build_layers(
    shape: shapes.ModelShape,
    seed: int,
    indices: Sequence[int] | None = None,
    device: str | torch.device = "cpu",
) -> list[nn.Module]:
    """The layers `indices` (default: all num_layers + 2) in the order given."""
    chosen = range(shape.num_planner_layers) if indices is None else indices
    return [build_layer(shape, seed, index, device) for index in chosen]


def run_layers(layers: Sequence[nn.Module], x: torch.Tensor) -> torch.Tensor:
    """Apply a contiguous range of layers in order (a stage's forward pass)."""
    for layer in layers:
        x = layer(x)
    return x


def _layer_module(shape: shapes.ModelShape, index: int) -> nn.Module:
    if index == 0:
        return Embedding(shape)
    if index == shape.num_layers + 1:
        return Head(shape)
    return Block(shape)


def _materialise(layer: nn.Module, device: torch.device | None = None) -> None:
    """Give every meta parameter uninitialised storage of its shape and dtype on `device`
    (default: the CPU).

    `nn.Module.to_empty` does the same, but its `empty_like` from meta costs a one-off import
    of about half a second in every process, and agents are started often.
    """
    for module in layer.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            empty = torch.empty(p.shape, dtype=p.dtype, device=device)
            setattr(module, name, nn.Parameter(empty))


def _initialise(layer: nn.Module, generator: torch.Generator, residual_std: float) -> None:
    """GPT-2 init in module order: N(0, 0.02) weights, zero biases, unit LayerNorm gains; the
    projections back into the residual stream get 0.02 / sqrt(2 * num_layers)."""
    for name, module in layer.named_modules():
        if isinstance(module, Embedding):
            nn.init.normal_(module.tokens, mean=0.0, std=INIT_STD, generator=generator)
            nn.init.normal_(module.positions, mean=0.0, std=INIT_STD, generator=generator)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            std = residual_std if name in ("attn_proj", "mlp_proj") else INIT_STD
            nn.init.normal_(module.weight, mean=0.0, std=std, generator=generator)
            if module.bias is not None:
                nn.init.zeros_(module.bias)


def _check_index(shape: shapes.ModelShape, index: int) -> None:
    if not 0 <= index < shape.num_planner_layers:
        raise IndexError(
            f"layer index {index} is outside 0..{shape.num_planner_layers - 1} of {shape.name!r}"
        )


# --- semantics: loss and optimizer ----------------------------------------------------------------


def micro_batch_loss(
    logits: torch.Tensor, targets: torch.Tensor, global_batch_size: int
) -> torch.Tensor:
    """Loss of one micro-batch, scaled so that micro-batch losses and gradients simply add up.

    loss_mb = (sum of token cross-entropies of the micro-batch) / (B * T), with B the global
    batch size (samples per training step) and T the sequence length (targets.shape[1]). Summing
    loss_mb over all micro-batches of a step gives the mean token loss of the global batch, and
    summing each parameter's gradient over them (whoever computed them: accumulation in one
    process, an all-reduce across pipelines) gives that mean's gradient. This is the one place
    that scaling is defined; the reference trainer and the executor both call it.
    """
    vocab = logits.shape[-1]
    total = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1), reduction="sum")
    return total / (global_batch_size * targets.shape[1])


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerConfig:
    """AdamW hyper-parameters, the same for every layer (constant learning rate).

    Weight decay (decoupled, AdamW) applies to matrices and embeddings (parameters with >= 2
    dimensions), not to biases or LayerNorm gains, as in nanoGPT.
    """

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise OptimizerConfigError(f"optimizer lr must be finite and > 0 (got {self.lr})")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise OptimizerConfigError(
                    f"optimizer {name} must be in [0, 1) (got {getattr(self, name)})"
                )
        if not self.eps > 0:
            raise OptimizerConfigError(f"optimizer eps must be > 0 (got {self.eps})")
        if not self.weight_decay >= 0:
            raise OptimizerConfigError(
                f"optimizer weight_decay must be >= 0 (got {self.weight_decay})"
            )


def make_optimizer(layer: nn.Module, config: OptimizerConfig) -> torch.optim.AdamW:
    """One AdamW over one layer's parameters: a worker holding any subset of layers updates
    each of them exactly as the single-process reference does."""
    params = list(layer.parameters())
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        [group for group in groups if group["params"]],
        lr=config.lr,
        betas=(config.beta1, config.beta2),
        eps=config.eps,
    )


# --- per-layer state --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class LayerState:
    """A layer's parameters and AdamW state as plain tensors, in parameter-name order.

    `steps[i]` is AdamW's step count of parameter i (a 0-d float32 CPU tensor, as torch keeps
    it); a layer whose optimizer has not stepped yet has zero moments and step 0, which AdamW
    treats exactly like fresh state. Tensors are copies, detached from the layer.
    """

    index: int
    names: tuple[str, ...]
    parameters: tuple[torch.Tensor, ...]
    exp_avg: tuple[torch.Tensor, ...]
    exp_avg_sq: tuple[torch.Tensor, ...]
    steps: tuple[torch.Tensor, ...]

    def __post_init__(self) -> None:
        n = len(self.names)
        lengths = {len(self.parameters), len(self.exp_avg), len(self.exp_avg_sq), len(self.steps)}
        if lengths != {n}:
            raise LayerStateError(
                f"layer {self.index} state: {n} names but tensor groups of lengths "
                f"{sorted(lengths)}; give one parameter, moment pair and step per name"
            )

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Every tensor in one stable order: parameters, exp_avg, exp_avg_sq, steps."""
        return (*self.parameters, *self.exp_avg, *self.exp_avg_sq, *self.steps)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


def extract_layer_state(
    index: int, layer: nn.Module, optimizer: torch.optim.Optimizer
) -> LayerState:
    """Copy layer `index`'s parameters and its AdamW state out of `layer` and `optimizer`."""
    names, params = zip(*layer.named_parameters(), strict=True)
    moments = [_moments(optimizer, p) for p in params]
    return LayerState(
        index=index,
        names=tuple(names),
        parameters=tuple(p.detach().clone() for p in params),
        exp_avg=tuple(m[0] for m in moments),
        exp_avg_sq=tuple(m[1] for m in moments),
        steps=tuple(m[2] for m in moments),
    )


def initial_state(
    shape: shapes.ModelShape, seed: int, index: int, optimizer: OptimizerConfig
) -> LayerState:
    """Layer `index` as built from `seed`, with a fresh AdamW (zero moments of the parameters'
    shapes, a 0-d float32 step): the state of step 0, laid out as any trained state of the
    layer is (a layer copy receives its bytes into it)."""
    layer = build_layer(shape, seed, index)
    return extract_layer_state(index, layer, make_optimizer(layer, optimizer))


def load_layer_state(
    index: int, layer: nn.Module, optimizer: torch.optim.Optimizer, state: LayerState
) -> None:
    """Overwrite layer `index`'s parameters and AdamW state with `state`, bit-exactly.

    Parameters are copied in place (the optimizer keeps referring to the same tensors). Raises
    LayerStateError when the state belongs to another layer index or its names or shapes differ.
    """
    if state.index != index:
        raise LayerStateError(f"state of layer {state.index} cannot be loaded into layer {index}")
    named = dict(layer.named_parameters())
    if tuple(named) != state.names:
        raise LayerStateError(
            f"layer {index} has parameters {tuple(named)} but the state holds {state.names}"
        )
    with torch.no_grad():
        for name, p, value, avg, avg_sq, step in _zipped(named, state):
            if value.shape != p.shape:
                raise LayerStateError(
                    f"layer {index} parameter {name}: shape {tuple(p.shape)} but the state "
                    f"holds {tuple(value.shape)}"
                )
            p.copy_(value)
            optimizer.state[p] = {
                "step": step.detach().clone().to(device="cpu", dtype=torch.float32),
                "exp_avg": avg.detach().to(p.device, copy=True),  # one copy, also to a GPU
                "exp_avg_sq": avg_sq.detach().to(p.device, copy=True),
            }


def _zipped(
    named: dict[str, nn.Parameter], state: LayerState
) -> Iterator[tuple[str, nn.Parameter, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    return zip(
        named,
        named.values(),
        state.parameters,
        state.exp_avg,
        state.exp_avg_sq,
        state.steps,
        strict=True,
    )


def _moments(
    optimizer: torch.optim.Optimizer, p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(exp_avg, exp_avg_sq, step) of `p` as copies; zeros and step 0 before the first step."""
    state = optimizer.state.get(p)
    if not state:
        zeros = torch.zeros_like(p, memory_format=torch.preserve_format).detach()
        return zeros, zeros.clone(), torch.tensor(0.0, dtype=torch.float32)
    return (
        state["exp_avg"].detach().clone(),
        state["exp_avg_sq"].detach().clone(),
        state["step"].detach().clone().to(device="cpu", dtype=torch.float32),
    )
