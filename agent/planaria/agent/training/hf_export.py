"""A trained Hugging Face model's layer states written in its family's safetensors layout.

    export(shape, states, out_dir)  ->  out_dir/model.safetensors, out_dir/config.json

`states` are the model's planner-layer states (a persistent checkpoint's, `checkpoints.
load_checkpoint`); only the parameters are written (AdamW's moments stay in the checkpoint).
Tensor names are transformers' (`hf_models.export_names`), so `LlamaForCausalLM.
from_pretrained(out_dir)` / `GPT2LMHeadModel.from_pretrained(out_dir)` loads the model as
trained. The vocabulary is the one trained (a tokenizer's; read off the embedding), and a
GPT-2's head copy is written beside `wte` with `tie_word_embeddings: false` (`hf_models`).

Errors: ExportError (ValueError) when the states do not match the model (layer count, names,
shapes): one line naming the first difference and the fix.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

import torch

from planaria.agent.training import hf_models, model
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
    from safetensors.torch import save_file  # planaria[hf]; only an export needs it

    out_dir.mkdir(parents=True, exist_ok=True)
    weights = out_dir / WEIGHTS_FILE
    save_file(tensors, str(weights), metadata={"format": "pt"})
    config = json.dumps(hf_models.export_config(shape), indent=2, sort_keys=True)
    (out_dir / CONFIG_FILE).write_text(config + "\n", encoding="utf-8")
    return weights


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
