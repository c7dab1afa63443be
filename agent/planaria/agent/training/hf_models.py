"""Hugging Face causal LMs (Llama, GPT-2) cut into the planner's ordered layers.

A shape whose `family` is one of `shapes.HF_FAMILIES` carries its Hugging Face config as JSON
(`shapes.hf_reference`); `build_layer` builds one planner layer of it from `transformers`' own
modules, wrapped so that every layer is called with one tensor, as Planaria's GPT layers are:

    layer 0            embeddings      Llama: embed_tokens; GPT-2: wte + wpe
    layers 1..L        decoder block   hidden -> hidden; position ids, rotary cos/sin (Llama)
                                       and the causal mask (SDPA's is_causal) made inside
    layer L + 1        final norm + lm_head

Initialisation is Planaria's, not transformers': each layer's parameters are drawn on the CPU
from a generator seeded with (seed, layer index) (`model.layer_seed`), in module order, with
the family's scheme (matrices N(0, initializer_range), GPT-2's residual projections scaled by
1 / sqrt(2 * n_layer), biases zero, norm gains one), so any worker building any subset of the
layers has bit-identical parameters. Dropout is forced to 0 (the same inputs give the same
outputs wherever a layer runs), and the model's vocabulary is the shape's (a tokenizer's).

Initial weights from a local model folder (`shape.hf_weights`: model.safetensors, or the shards
a model.safetensors.index.json names): each layer, once built as above, takes its tensors from
the files (`load_weights`, memory-mapped: a worker reads only its layers), every worker alike.
A tied model's folder without `lm_head.weight` gives the head the token embeddings' tensor.

Tied embeddings (`tie_word_embeddings`, GPT-2's default; `ties_embeddings`): the head layer
holds its own copy of the matrix as `lm_head.weight` (`tied_matrix`), initialised equal to the
token embeddings (drawn from the embedding layer's generator, or read from the checkpoint's
embedding tensor); training keeps the two copies one parameter (`tying`: one summed gradient,
the same AdamW update), and the export writes the one tensor with `tie_word_embeddings: true`.

`transformers` is imported lazily, only when an HF layer is built: the core install and the
built-in GPT never pay for it.

Not here: the shared seam (`model.build_layer` dispatches here), the optimizer and per-layer
state (`model`), the safetensors export (`hf_export`).

Errors: HfModelError (ValueError) for a config transformers refuses, or a missing dependency.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from planaria.contract import shapes

# Config fields set whatever the user gave: no dropout, the SDPA kernel (causal without a mask).
_DROPOUT = {
    "llama": ("attention_dropout",),
    "gpt2": ("attn_pdrop", "resid_pdrop", "embd_pdrop", "summary_first_dropout"),
}


_EMBEDDING_NAMES = {"llama": "model.embed_tokens.weight", "gpt2": "transformer.wte.weight"}


class HfModelError(ValueError):
    """A Hugging Face model source that cannot be built; the message says what to change."""


@functools.lru_cache(maxsize=8)
def hf_config(shape: shapes.ModelShape) -> Any:
    """The transformers config of `shape`: its JSON with the shape's vocabulary, no dropout,
    SDPA attention and untied modules (the head holds its own copy of a tied matrix; module
    docstring)."""
    raw = json.loads(shape.hf_config)
    raw.update({key: 0.0 for key in _DROPOUT[shape.family]})
    raw.update(vocab_size=shape.vocab_size, tie_word_embeddings=False, use_cache=False)
    raw.pop("architectures", None)
    raw.pop("model_type", None)
    config_class = _transformers_class(shape.family, "Config")
    try:
        config = config_class(**raw)
    except (TypeError, ValueError) as exc:
        raise HfModelError(f"modelSource.config: transformers refuses it: {exc}") from exc
    config._attn_implementation = "sdpa"
    return config


class LlamaEmbedding(nn.Module):
    """Planner layer 0 of a Llama: token embeddings only (positions are rotary, per block)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden: torch.Tensor = self.embed_tokens(ids)
        return hidden


class Gpt2Embedding(nn.Module):
    """Planner layer 0 of a GPT-2: token plus learned position embeddings."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        hidden: torch.Tensor = self.wte(ids) + self.wpe(positions)
        return hidden


class DecoderBlock(nn.Module):
    """One transformers decoder layer called with the hidden states alone: position ids (and a
    Llama's rotary cos/sin) are made here; SDPA without a mask is causal."""

    def __init__(self, family: str, config: Any, block: int) -> None:
        super().__init__()
        self.family = family
        self.block = _transformers_class(family, "DecoderLayer")(config, layer_idx=block)
        # Buffers only (inv_freq), no parameters: not part of the layer's state.
        rotary = _transformers_class(family, "RotaryEmbedding") if family == "llama" else None
        self.rotary = None if rotary is None else rotary(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rotary is None:
            out = self.block(x)
        else:
            positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
            cos_sin = self.rotary(x, positions)
            out = self.block(x, position_ids=positions, position_embeddings=cos_sin)
        hidden: torch.Tensor = out[0] if isinstance(out, tuple) else out
        return hidden


class HfHead(nn.Module):
    """The last planner layer: the final norm and the output projection to logits."""

    produces_logits = True  # `model.is_head`

    def __init__(self, family: str, config: Any) -> None:
        super().__init__()
        if family == "llama":
            norm_class = _transformers_class(family, "RMSNorm")
            self.norm: nn.Module = norm_class(config.hidden_size, eps=config.rms_norm_eps)
        else:
            self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = self.norm if hasattr(self, "norm") else self.ln_f
        logits: torch.Tensor = self.lm_head(norm(x))
        return logits


def layer_module(shape: shapes.ModelShape, index: int) -> nn.Module:
    """Planner layer `index` of `shape`, built on the current default device, uninitialised
    (`model.build_layer` builds on meta, materialises and calls `initialise`)."""
    config = hf_config(shape)
    if index == 0:
        return LlamaEmbedding(config) if shape.family == "llama" else Gpt2Embedding(config)
    if index == shape.num_layers + 1:
        return HfHead(shape.family, config)
    return DecoderBlock(shape.family, config, index - 1)


def rotary_buffers(shape: shapes.ModelShape, layer: nn.Module) -> None:
    """Give a Llama block built on meta its rotary module again, made on the CPU (its inverse
    frequencies are computed, not drawn: no randomness)."""
    if isinstance(layer, DecoderBlock) and layer.rotary is not None:
        layer.rotary = _transformers_class(shape.family, "RotaryEmbedding")(hf_config(shape))


def initialise(
    shape: shapes.ModelShape, layer: nn.Module, index: int, generators: Sequence[torch.Generator]
) -> None:
    """The family's init of `layer`'s parameters in module order from `generators[0]` (module
    docstring). A tied model's head (`ties_embeddings`) draws its `lm_head` from
    `generators[1]`, the embedding layer's generator, so it starts equal to the embeddings."""
    config = hf_config(shape)
    std = config.initializer_range
    residual_std = std / math.sqrt(2 * shape.num_layers)
    for module_name, module in layer.named_modules():
        for name, p in module.named_parameters(recurse=False):
            if p.dim() >= 2:
                scaled = shape.family == "gpt2" and module_name.endswith("c_proj")
                source = generators[-1] if _tied_head(shape, module_name) else generators[0]
                nn.init.normal_(p, 0.0, residual_std if scaled else std, generator=source)
            elif name == "weight" and "norm" in type(module).__name__.lower():
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)


def _tied_head(shape: shapes.ModelShape, module_name: str) -> bool:
    return module_name == "lm_head" and ties_embeddings(shape)


def ties_embeddings(shape: shapes.ModelShape) -> bool:
    """Whether the config ties lm_head to the token embeddings (transformers' default: GPT-2
    does, Llama does not); the head's copy then starts equal and trains tied (`tying`)."""
    if shape.family not in shapes.HF_FAMILIES:
        return False  # Planaria's own GPT: its head is untied
    default = shape.family == "gpt2"
    return bool(json.loads(shape.hf_config).get("tie_word_embeddings", default))


_TIED_NAMES: dict[type[nn.Module], str] = {
    LlamaEmbedding: "embed_tokens.weight",
    Gpt2Embedding: "wte.weight",
    HfHead: "lm_head.weight",
}


def tied_matrix(layer: nn.Module) -> nn.Parameter:
    """The copy of the tied matrix an embedding layer or a head holds (`ties_embeddings`)."""
    name = _TIED_NAMES.get(type(layer))
    if name is None:
        raise TypeError(f"{type(layer).__name__} holds no copy of the token embeddings")
    return dict(layer.named_parameters())[name]


def load_weights(
    shape: shapes.ModelShape, index: int, layer: nn.Module, *, headers_only: bool = False
) -> None:
    """Overwrite layer `index`'s parameters with their tensors in `shape.hf_weights` (module
    docstring); `headers_only` checks names and shapes without reading a tensor. Raises
    HfModelError naming the first tensor that is missing or whose shape differs (a folder of
    another config, or another vocabulary than the tokenizer's)."""
    names, params = zip(*layer.named_parameters(), strict=True)
    files = _weight_files(Path(shape.hf_weights))
    from safetensors import safe_open  # planaria[hf]; only a job with weights needs it

    for name, param in zip(export_names(shape, index, names), params, strict=True):
        source = name
        if source == "lm_head.weight" and ties_embeddings(shape):
            # Tied: the one tensor is the embedding's (transformers ties lm_head to it on load
            # too, whatever lm_head.weight a folder also holds).
            source = embedding_name(shape)
        if source not in files:
            raise HfModelError(
                f"modelSource.checkpointPath: {shape.hf_weights!r} has no tensor {name!r}; give "
                f"a {shape.family} checkpoint of this config"
            )
        with safe_open(str(files[source]), framework="pt") as opened:
            stored = tuple(opened.get_slice(source).get_shape())
            if stored != tuple(param.shape):
                raise HfModelError(
                    f"modelSource.checkpointPath: tensor {source!r} is {stored} in "
                    f"{shape.hf_weights!r} but {tuple(param.shape)} in the model (config, "
                    "tokenizer vocabulary); give the checkpoint that matches them"
                )
            if not headers_only:
                param.copy_(opened.get_tensor(source).to(param.dtype))


def check_weights(shape: shapes.ModelShape) -> None:
    """HfModelError unless `shape.hf_weights` holds every parameter of every layer with the
    model's shape (read from the files' headers; layers built on meta, nothing allocated)."""
    hf_config(shape)  # imports transformers outside the meta context
    for index in range(shape.num_planner_layers):
        with torch.device("meta"):
            layer = layer_module(shape, index)
        with torch.device("meta"), torch.no_grad():
            load_weights(shape, index, layer, headers_only=True)


@functools.lru_cache(maxsize=4)
def _weight_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it, in `folder`."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        mapping = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return {name: folder / file for name, file in mapping.items()}
    single = folder / "model.safetensors"
    if not single.is_file():
        raise HfModelError(
            f"modelSource.checkpointPath: {str(folder)!r} holds no model.safetensors nor "
            "model.safetensors.index.json; give a local safetensors model folder"
        )
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as opened:
        return dict.fromkeys(opened.keys(), single)


def export_names(shape: shapes.ModelShape, index: int, names: Sequence[str]) -> list[str]:
    """The transformers state-dict names of layer `index`'s parameters `names` (for
    `LlamaForCausalLM` / `GPT2LMHeadModel`)."""
    base = "model." if shape.family == "llama" else "transformer."
    if index == 0:
        return [base + name for name in names]
    if index == shape.num_layers + 1:
        return [name if name.startswith("lm_head") else base + name for name in names]
    inner = "layers" if shape.family == "llama" else "h"
    return [f"{base}{inner}.{index - 1}.{name.removeprefix('block.')}" for name in names]


def embedding_name(shape: shapes.ModelShape) -> str:
    """The transformers name of the token embeddings (the one tensor of a tied checkpoint)."""
    return _EMBEDDING_NAMES[shape.family]


def export_config(shape: shapes.ModelShape, *, tied: bool) -> dict[str, Any]:
    """The config.json of an exported checkpoint: the model's, as trained (module docstring);
    `tied` says whether the export holds the one embedding tensor for lm_head too."""
    raw: dict[str, Any] = hf_config(shape).to_dict()
    raw["tie_word_embeddings"] = tied
    raw["architectures"] = ["LlamaForCausalLM" if shape.family == "llama" else "GPT2LMHeadModel"]
    return raw


def causal_lm(shape: shapes.ModelShape) -> nn.Module:
    """An empty transformers causal LM of `shape` (for loading an export back: tests, users)."""
    lm: nn.Module = _transformers_class(shape.family, "ForCausalLM")(hf_config(shape))
    return lm


def _transformers_class(family: str, suffix: str) -> Any:
    """transformers' `<Family><suffix>` class, imported on first use (module docstring)."""
    try:
        from transformers.models.gpt2 import configuration_gpt2, modeling_gpt2
        from transformers.models.llama import configuration_llama, modeling_llama
    except ImportError as exc:
        raise HfModelError(
            "a Hugging Face model needs transformers; pip install 'planaria[hf]'"
        ) from exc
    prefix = "Llama" if family == "llama" else "GPT2"
    if suffix == "Config":
        config_module = configuration_llama if family == "llama" else configuration_gpt2
        return getattr(config_module, prefix + suffix)
    if family == "gpt2":
        suffix = {"DecoderLayer": "Block", "ForCausalLM": "LMHeadModel"}.get(suffix, suffix)
    return getattr(modeling_llama if family == "llama" else modeling_gpt2, prefix + suffix)
