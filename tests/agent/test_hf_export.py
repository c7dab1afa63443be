"""The safetensors export of a Hugging Face model's layer states (planaria.agent.training.
hf_export).

Covers, for a tiny Llama and GPT-2 after an AdamW step (so the head copy of GPT-2's tie differs
from `wte`): the folder written loads back with transformers' `from_pretrained`, and the loaded
model gives bit for bit the logits of Planaria's layers holding the exported states, with the
trained vocabulary (a tokenizer's, not the config's); states of another config, or missing a
layer, and a named (non-HF) shape are refused with one line naming the fix.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from planaria.agent.training import hf_export, model
from planaria.contract import shapes
from tests.agent import test_hf_models as hf_cases

transformers = pytest.importorskip("transformers")

TRAINED_VOCAB = 300  # as a tokenizer would set it (the configs say 256)


def _trained(shape: shapes.ModelShape) -> tuple[list[torch.nn.Module], dict[int, model.LayerState]]:
    """The layers of `shape` after one AdamW step on a random batch, and their states."""
    layers = model.build_layers(shape, hf_cases.SEED)
    optimizers = [model.make_optimizer(layer, model.OptimizerConfig(lr=1e-2)) for layer in layers]
    ids = torch.randint(0, shape.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    logits = model.run_layers(layers, ids[:, :-1])
    model.micro_batch_loss(logits, ids[:, 1:], 2).backward()
    for optimizer in optimizers:
        optimizer.step()
    states = {
        i: model.extract_layer_state(i, layer, opt)
        for i, (layer, opt) in enumerate(zip(layers, optimizers, strict=True))
    }
    return layers, states


@pytest.mark.parametrize("family", list(hf_cases.FAMILIES))
def test_an_export_loads_back_into_transformers_with_the_same_logits(
    family: str, tmp_path: Path
) -> None:
    shape = dataclasses.replace(hf_cases._shape(family), vocab_size=TRAINED_VOCAB)
    layers, states = _trained(shape)
    hf_export.export(shape, states, tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.config.vocab_size == TRAINED_VOCAB
    ids = torch.randint(0, TRAINED_VOCAB, (3, shape.seq_len), generator=torch.Generator())
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model.run_layers(layers, ids))
    if family == "gpt2":  # trained untied: the two copies differ after a step
        assert not torch.equal(layers[0].wte.weight, layers[-1].lm_head.weight)


def test_states_of_another_model_are_refused(tmp_path: Path) -> None:
    llama = hf_cases._shape("llama")
    _, states = _trained(llama)
    wider = shapes.resolve(shapes.hf_reference("llama", {**hf_cases.LLAMA, "hidden_size": 64}))
    with pytest.raises(hf_export.ExportError, match=r"^layer 0 of the checkpoint does not match"):
        hf_export.export(wider, states, tmp_path)
    with pytest.raises(hf_export.ExportError, match=r"holds layers \[0, 1, 2\], the model has 4"):
        hf_export.export(llama, {i: states[i] for i in range(3)}, tmp_path)
    with pytest.raises(hf_export.ExportError, match="Planaria's own GPT"):
        hf_export.export(shapes.named("tiny"), states, tmp_path)
    assert not list(tmp_path.iterdir())
