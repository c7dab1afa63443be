"""Model shapes: the named GPT-like model sizes the planner, profiler and agent agree on.

A shape is pure data (no torch). The agent builds its `GPT` from a `ModelShape`; the synthetic
profiler derives layer costs from it; the planner reasons about its layers. The planner's layer
list is always: embedding, `num_layers` transformer blocks, then the final norm + head, so a
shape has `num_layers + 2` planner layers.

Besides Planaria's own GPT (`family` "gpt"), a shape can describe a Hugging Face causal LM
(`family` "llama" or "gpt2", `HF_FAMILIES`) built from its config: the config travels as
canonical JSON in `hf_config`, and on the wire (`TrainingSettings.model`, `ProfileOrder.model`)
the whole source is one string, `hf_reference(...)`, that `resolve` turns back into the shape on
every process. The counts here are what the planner and the synthetic profiles reason with; the
agent builds the layers themselves (`planaria.agent.training.hf_models`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from planaria.contract import errors

HF_PREFIX = "hf:"  # a model string that starts so is a Hugging Face source, not a shape name
HF_FAMILIES = ("llama", "gpt2")
# The config keys each family reads its sizes from (Hugging Face's names).
_HF_KEYS = {
    "llama": ("num_hidden_layers", "hidden_size", "num_attention_heads", "max_position_embeddings"),
    "gpt2": ("n_layer", "n_embd", "n_head", "n_positions"),
}


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
    family: str = "gpt"  # "gpt" (Planaria's own) or one of HF_FAMILIES
    hf_config: str = ""  # the Hugging Face config as canonical JSON (HF families only)
    hf_weights: str = ""  # a local safetensors model folder the initial weights come from
    num_kv_heads: int = 0  # key/value heads (grouped-query attention); 0: num_heads

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
        if self.num_kv_heads == 0:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        elif self.num_kv_heads < 0 or self.num_heads % self.num_kv_heads:
            raise errors.PlanInputError(
                f"model shape {self.name!r}: num_heads ({self.num_heads}) must be a multiple "
                f"of num_key_value_heads ({self.num_kv_heads})"
            )

    @property
    def num_planner_layers(self) -> int:
        """Embedding + blocks + head: the unit the planner partitions into stages."""
        return self.num_layers + 2

    def block_parameters(self) -> int:
        """Parameters of one transformer block: attention (qkv + proj), MLP, two layer norms."""
        d, f = self.d_model, self.ffn_dim
        if self.family == "llama":  # bias-free; k and v have num_kv_heads; gated MLP; RMSNorm
            kv = d // self.num_heads * self.num_kv_heads
            return 2 * d * d + 2 * d * kv + 3 * d * f + 2 * d
        attention = 3 * d * d + 3 * d + d * d + d
        mlp = d * f + f + f * d + d
        norms = 2 * 2 * d
        return attention + mlp + norms

    def embedding_parameters(self) -> int:
        """Token and position embeddings (Llama: tokens only, positions are rotary)."""
        if self.family == "llama":
            return self.vocab_size * self.d_model
        return self.vocab_size * self.d_model + self.seq_len * self.d_model

    def head_parameters(self) -> int:
        """Final norm and the output projection (the head stage's own copy when tied)."""
        if self.family == "llama":
            return self.d_model + self.d_model * self.vocab_size
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


def hf_reference(
    family: str, config: Mapping[str, Any], seq_len: int = 0, weights: str = ""
) -> str:
    """The one string naming a Hugging Face model source: family, config, the sequence length
    trained on (0: the config's maximum) and the folder of initial weights ("": drawn from the
    seed). `resolve` reads it back; raises PlanInputError for an unknown family or a config
    that lacks the family's sizes."""
    body = {"family": family, "config": dict(config), "seqLen": seq_len, "weights": weights}
    reference = HF_PREFIX + json.dumps(body, sort_keys=True, separators=(",", ":"))
    resolve(reference)  # the same checks every process applies, raised here first
    return reference


def resolve(model: str) -> ModelShape:
    """The shape of `model`: a shape name (`named`) or an `hf_reference`."""
    if not model.startswith(HF_PREFIX):
        return named(model)
    try:
        body = json.loads(model[len(HF_PREFIX) :])
        family, config, seq_len = body["family"], body["config"], body["seqLen"]
        weights = str(body.get("weights", ""))
    except (ValueError, KeyError, TypeError) as exc:
        raise errors.PlanInputError(f"model source {model[:60]!r}... does not parse") from exc
    if family not in HF_FAMILIES:
        raise errors.PlanInputError(
            f"modelSource.family: unknown family {family!r}; give one of {', '.join(HF_FAMILIES)}"
        )
    return _hf_shape(family, config, seq_len, weights)


def _hf_shape(family: str, config: Mapping[str, Any], seq_len: int, weights: str) -> ModelShape:
    layers, d, heads, positions = (_config_int(config, family, key) for key in _HF_KEYS[family])
    if family == "llama":
        ffn = _config_int(config, family, "intermediate_size")
        kv = int(config.get("num_key_value_heads") or heads)
    else:
        ffn, kv = int(config.get("n_inner") or 4 * d), heads
    if not 0 <= seq_len <= positions:
        raise errors.PlanInputError(
            f"modelSource.seqLen: {seq_len} is outside 1..{positions} (the config's maximum "
            "positions); give a length in range or 0 for the maximum"
        )
    return ModelShape(
        name=f"hf-{family}",
        num_layers=layers,
        d_model=d,
        num_heads=heads,
        seq_len=seq_len or positions,
        vocab_size=_config_int(config, family, "vocab_size"),
        ffn_dim=ffn,
        family=family,
        hf_config=json.dumps(dict(config), sort_keys=True, separators=(",", ":")),
        hf_weights=weights,
        num_kv_heads=kv,
    )


def _config_int(config: Mapping[str, Any], family: str, key: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise errors.PlanInputError(
            f"modelSource.config: a {family} config needs {key} as an integer >= 1 "
            f"(got {value!r}); add it to the config"
        )
    return value
