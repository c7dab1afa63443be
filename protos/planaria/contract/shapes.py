"""Model shapes: the named GPT-like model sizes the planner, profiler and agent agree on.

A shape is pure data (no torch). The agent builds its `GPT` from a `ModelShape`; the synthetic
profiler derives layer costs from it; the planner reasons about its layers. The planner's layer
list is always: embedding, `num_layers` transformer blocks, then the final norm + head, so a
shape has `num_layers + 2` planner layers.
"""

from __future__ import annotations

from dataclasses import dataclass

from planaria.contract import errors


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """Hyper-parameters of a GPT decoder.

    `ffn_dim` defaults to 4 * d_model (GPT-2/3); Llama-style shapes set it explicitly.
    """

    name: str
    num_layers: int
    d_model: int
    num_heads: int
    seq_len: int
    vocab_size: int
    ffn_dim: int = 0

    def __post_init__(self) -> None:
        for field in ("num_layers", "d_model", "num_heads", "seq_len", "vocab_size"):
            if getattr(self, field) < 1:
                raise errors.PlanInputError(f"model shape {self.name!r}: {field} must be >= 1")
        if self.d_model % self.num_heads:
            raise errors.PlanInputError(
                f"model shape {self.name!r}: d_model ({self.d_model}) must be divisible by "
                f"num_heads ({self.num_heads})"
            )
        if self.ffn_dim == 0:
            object.__setattr__(self, "ffn_dim", 4 * self.d_model)
        elif self.ffn_dim < 0:
            raise errors.PlanInputError(f"model shape {self.name!r}: ffn_dim must be >= 0")

    @property
    def num_planner_layers(self) -> int:
        """Embedding + blocks + head: the unit the planner partitions into stages."""
        return self.num_layers + 2

    def block_parameters(self) -> int:
        """Parameters of one transformer block: attention (qkv + proj), MLP, two layer norms."""
        d, f = self.d_model, self.ffn_dim
        attention = 3 * d * d + 3 * d + d * d + d
        mlp = d * f + f + f * d + d
        norms = 2 * 2 * d
        return attention + mlp + norms

    def embedding_parameters(self) -> int:
        """Token and position embeddings."""
        return self.vocab_size * self.d_model + self.seq_len * self.d_model

    def head_parameters(self) -> int:
        """Final layer norm and the (untied) output projection."""
        return 2 * self.d_model + self.d_model * self.vocab_size

    def layer_parameters(self) -> tuple[int, ...]:
        """Parameter count of every planner layer, in order."""
        blocks = (self.block_parameters(),) * self.num_layers
        return (self.embedding_parameters(), *blocks, self.head_parameters())


# Sizes of the papers' models (Oobleck §7 Table 1, Odyssey §V, REFT §6). `seq_len` and vocab
# follow the original models; the tiny and small shapes are ours, sized for CPU tests and demos.
_SHAPES = (
    ModelShape(name="tiny", num_layers=4, d_model=64, num_heads=4, seq_len=64, vocab_size=256),
    ModelShape(name="small", num_layers=8, d_model=128, num_heads=4, seq_len=128, vocab_size=256),
    ModelShape(
        name="bert-large",
        num_layers=24,
        d_model=1024,
        num_heads=16,
        seq_len=512,
        vocab_size=30522,
    ),
    ModelShape(
        name="gpt2", num_layers=48, d_model=1600, num_heads=25, seq_len=1024, vocab_size=50257
    ),
    ModelShape(
        name="gpt3-medium",
        num_layers=24,
        d_model=1024,
        num_heads=16,
        seq_len=2048,
        vocab_size=50257,
    ),
    ModelShape(
        name="gpt3-2.7b", num_layers=32, d_model=2560, num_heads=32, seq_len=2048, vocab_size=50257
    ),
    ModelShape(
        name="gpt3-6.7b", num_layers=32, d_model=4096, num_heads=32, seq_len=2048, vocab_size=50257
    ),
    ModelShape(
        name="llama2-7b",
        num_layers=32,
        d_model=4096,
        num_heads=32,
        seq_len=4096,
        vocab_size=32000,
        ffn_dim=11008,
    ),
    ModelShape(
        name="llama2-34b",
        num_layers=48,
        d_model=8192,
        num_heads=64,
        seq_len=4096,
        vocab_size=32000,
        ffn_dim=22016,
    ),
)

NAMED_SHAPES: dict[str, ModelShape] = {shape.name: shape for shape in _SHAPES}


def named(name: str) -> ModelShape:
    """The shape registered under `name`; raises PlanInputError listing the known names."""
    try:
        return NAMED_SHAPES[name]
    except KeyError:
        known = ", ".join(sorted(NAMED_SHAPES))
        raise errors.PlanInputError(f"unknown model {name!r}; choose one of: {known}") from None
