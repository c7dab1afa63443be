"""The safetensors export of a Hugging Face model's layer states (planaria.agent.training.
hf_export).

Covers, for a tiny Llama and GPT-2 after an AdamW step (GPT-2's two copies of its tied matrix
trained tied): the folder written loads back with transformers' `from_pretrained`, and the
loaded model gives bit for bit the logits of Planaria's layers holding the exported states,
with the trained vocabulary (a tokenizer's, not the config's); GPT-2's export holds the one
tensor, no `lm_head.weight`, says `tie_word_embeddings: true`, and transformers loads it tied;
a tied config's states whose copies differ are exported untied with the same logits; states of
another config, or missing a layer, and a named (non-HF) shape are refused with one line naming
the fix. A model folder (the export; GPT-2's is a tied folder without `lm_head.weight`) gives a
new job's initial weights bit for bit, whatever the seed; a folder of another config or
vocabulary is refused from its headers with one line naming modelSource.checkpointPath and the
fix.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from planaria.agent.training import hf_export, hf_models, model
from planaria.contract import shapes
from tests import hf_models as hf_cases

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

TRAINED_VOCAB = 300  # as a tokenizer would set it (the configs say 256)


@pytest.mark.parametrize("family", list(hf_cases.FAMILIES))
def test_an_export_loads_back_into_transformers_with_the_same_logits(
    family: str, tmp_path: Path
) -> None:
    shape = dataclasses.replace(hf_cases.shape(family), vocab_size=TRAINED_VOCAB)
    layers, states = hf_cases.trained(shape)
    hf_export.export(shape, states, tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.config.vocab_size == TRAINED_VOCAB
    ids = torch.randint(0, TRAINED_VOCAB, (3, shape.seq_len), generator=torch.Generator())
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model.run_layers(layers, ids))
    weights = safetensors_torch.load_file(tmp_path / "model.safetensors")
    if family == "gpt2":  # trained tied: the one tensor, and transformers ties lm_head to it
        assert loaded.config.tie_word_embeddings and "lm_head.weight" not in weights
        assert loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()
    else:
        assert not loaded.config.tie_word_embeddings and "lm_head.weight" in weights


def test_a_tied_checkpoint_whose_copies_differ_is_exported_untied(tmp_path: Path) -> None:
    """(A tied config trained untied, as Planaria did before the tie: nothing is lost.)"""
    shape = hf_cases.shape("gpt2")
    layers, states = hf_cases.trained(shape)
    head = states[len(layers) - 1]
    with torch.no_grad():
        hf_cases.parameter(layers[-1], "lm_head.weight").add_(1.0)
        head.parameters[head.names.index("lm_head.weight")].add_(1.0)
    hf_export.export(shape, states, tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert not loaded.config.tie_word_embeddings
    ids = torch.randint(0, hf_cases.VOCAB, (2, shape.seq_len), generator=torch.Generator())
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model.run_layers(layers, ids))


def test_states_of_another_model_are_refused(tmp_path: Path) -> None:
    llama = hf_cases.shape("llama")
    _, states = hf_cases.trained(llama)
    wider = shapes.resolve(shapes.hf_reference("llama", {**hf_cases.LLAMA, "hidden_size": 64}))
    with pytest.raises(hf_export.ExportError, match=r"^layer 0 of the checkpoint does not match"):
        hf_export.export(wider, states, tmp_path)
    with pytest.raises(hf_export.ExportError, match=r"holds layers \[0, 1, 2\], the model has 4"):
        hf_export.export(llama, {i: states[i] for i in range(3)}, tmp_path)
    with pytest.raises(hf_export.ExportError, match="Planaria's own GPT"):
        hf_export.export(shapes.named("tiny"), states, tmp_path)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("tied", [False, True], ids=["its own files", "a tied GPT-2 folder"])
def test_a_model_folder_gives_the_initial_weights(tmp_path: Path, tied: bool) -> None:
    family = "gpt2" if tied else "llama"
    shape = dataclasses.replace(hf_cases.shape(family), vocab_size=TRAINED_VOCAB)
    layers, states = hf_cases.trained(shape)
    hf_export.export(shape, states, tmp_path)  # tied: without lm_head.weight, as GPT-2's
    source = shapes.hf_reference(family, hf_cases.FAMILIES[family], 0, str(tmp_path))
    loaded = dataclasses.replace(shapes.resolve(source), vocab_size=TRAINED_VOCAB)
    hf_models.check_weights(loaded)
    for index, layer in enumerate(model.build_layers(loaded, seed=99)):
        want: list[torch.Tensor] = list(layers[index].parameters())
        assert all(map(torch.equal, layer.parameters(), want)), index


def test_a_model_folder_of_another_config_or_vocabulary_is_refused(tmp_path: Path) -> None:
    shape = hf_cases.shape("llama")
    hf_export.export(shape, hf_cases.trained(shape)[1], tmp_path)
    wider = {**hf_cases.LLAMA, "hidden_size": 64}
    for config, vocab in ((wider, hf_cases.VOCAB), (hf_cases.LLAMA, TRAINED_VOCAB)):
        source = shapes.resolve(shapes.hf_reference("llama", config, 0, str(tmp_path)))
        other = dataclasses.replace(source, vocab_size=vocab)
        with pytest.raises(hf_models.HfModelError) as caught:
            hf_models.check_weights(other)
        message = str(caught.value)
        assert message.startswith("modelSource.checkpointPath: tensor 'model.embed_tokens.weight'")
        assert message.endswith("give the checkpoint that matches them") and "\n" not in message
