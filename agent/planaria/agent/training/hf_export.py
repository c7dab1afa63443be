"""A trained Hugging Face model's layer states written in its family's safetensors layout.

    export(shape, states, out_dir)  ->  out_dir/model.safetensors, out_dir/config.json

`states` are the model's planner-layer states (a persistent checkpoint's, `checkpoints.
load_checkpoint`); only the parameters are written (AdamW's moments stay in the checkpoint).
Tensor names are transformers' (`hf_models.export_names`), so `LlamaForCausalLM.
from_pretrained(out_dir)` / `GPT2LMHeadModel.from_pretrained(out_dir)` loads the model as
trained. The vocabulary is the one trained (a tokenizer's; read off the embedding).

Tied embeddings (`tying`): the embedding layer's and the head's copies of the tied matrix are
trained bit-identical, so the export writes the one tensor (as the embedding: `wte`,
`embed_tokens`), no `lm_head.weight`, and `tie_word_embeddings: true`, which transformers loads
back as the tied model. Should the copies differ (a checkpoint of a tied config trained untied
by an earlier Planaria), both tensors are written with `tie_word_embeddings: false`, so what
loads back is still what was trained.

Errors: ExportError (ValueError) when the states do not match the model (layer count, names,
shapes): one line naming the first difference and the fix.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

import torch

from planaria.agent.training import hf_models, model, tying
from planaria.contract import shapes

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


class ExportError(ValueError):
    """Layer states that are not the model's; the message says which and what to change."""


def export(shape: shapes.ModelShape, states: Mapping[int, model.LayerState], out_dir: Path) -> Path:
    """Write `states` of `shape` into `out_dir` (created) as model.safetensors + config.json;
    returns the weights file. The shape's vocabulary is replaced by the embedding's rows."""
    if shape.family not in shapes.HF_FAMILIES:
        raise ExportError(
            f"model {shape.name!r} is Planaria's own GPT; export writes Hugging Face families "
            "only (give the job a modelSource)"
        )
    if sorted(states) != list(range(shape.num_planner_layers)):
        raise ExportError(
            f"the checkpoint holds layers {sorted(states)}, the model has "
            f"{shape.num_planner_layers}; give the checkpoint of this job's model"
        )
    shape = dataclasses.replace(shape, vocab_size=int(states[0].parameters[0].shape[0]))
    tensors: dict[str, torch.Tensor] = {}
    for index, state in sorted(states.items()):
        _check_layer(shape, index, state)
        names = hf_models.export_names(shape, index, state.names)
        for name, value in zip(names, state.parameters, strict=True):
            tensors[name] = value.detach().cpu().contiguous()
    tied = _tied(shape, tensors)
    if tied:
        del tensors["lm_head.weight"]  # the embedding's tensor (module docstring)
    from safetensors.torch import save_file  # planaria[hf]; only an export needs it

    out_dir.mkdir(parents=True, exist_ok=True)
    weights = out_dir / WEIGHTS_FILE
    save_file(tensors, str(weights), metadata={"format": "pt"})
    config = json.dumps(hf_models.export_config(shape, tied=tied), indent=2, sort_keys=True)
    (out_dir / CONFIG_FILE).write_text(config + "\n", encoding="utf-8")
    return weights


def _tied(shape: shapes.ModelShape, tensors: Mapping[str, torch.Tensor]) -> bool:
    """Whether `shape` ties its embeddings and `tensors` (export names) hold its two copies
    bit-identical."""
    if not tying.ties(shape):
        return False
    return torch.equal(tensors["lm_head.weight"], tensors[hf_models.embedding_name(shape)])


def _check_layer(shape: shapes.ModelShape, index: int, state: model.LayerState) -> None:
    """ExportError unless `state` has the names and shapes layer `index` of `shape` has."""
    hf_models.hf_config(shape)  # imports transformers outside the meta context
    with torch.device("meta"):  # shapes only, nothing allocated
        layer = hf_models.layer_module(shape, index)
    expected = {n: tuple(p.shape) for n, p in layer.named_parameters()}
    got = {n: tuple(p.shape) for n, p in zip(state.names, state.parameters, strict=True)}
    if got != expected:
        differ = sorted(set(got.items()) ^ set(expected.items()))[:1]
        raise ExportError(
            f"layer {index} of the checkpoint does not match the model's config (first "
            f"difference: {differ}); export with the job file the checkpoint was trained with"
        )
