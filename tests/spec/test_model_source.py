"""A job's modelSource (planaria.spec.model_source, consistency.check, conversion.to_settings) and
the contract's reference string it becomes (planaria.contract.shapes.hf_reference / resolve).

Covers: an inline config, a config.json path and a model folder each become one `hf:` model
string in the settings, which resolves to the family's shape (sizes, grouped-query heads,
seqLen, the config kept as canonical JSON) and whose planner counts follow the family; every
bad input is one line naming the field and the fix: a hub name without local files, a file
that is not JSON, a config lacking a size, an unknown family, both config and configPath or
neither, model beside modelSource, a seqLen beyond the config's positions; and the model
string of a named shape is unchanged.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from planaria.contract import errors, shapes
from planaria.spec import conversion, job, job_file

LLAMA = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}


def _settings_model(text: str) -> str:
    parsed = job_file.parse_job(text, source="job.yaml")
    return conversion.to_settings(parsed.spec, parsed.name, "/stdlib").training.model


def _error(text: str) -> str:
    with pytest.raises(job.JobSpecError) as caught:
        job_file.parse_job(text, source="job.yaml")
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_an_inline_config_becomes_the_family_shape() -> None:
    model = _settings_model(
        "modelSource: {family: llama, seqLen: 32, config: " + json.dumps(LLAMA) + "}"
    )
    shape = shapes.resolve(model)
    assert model.startswith(shapes.HF_PREFIX)
    assert (shape.family, shape.num_layers, shape.d_model, shape.num_heads) == ("llama", 3, 64, 4)
    assert (shape.num_kv_heads, shape.ffn_dim, shape.seq_len, shape.vocab_size) == (2, 96, 32, 512)
    assert json.loads(shape.hf_config) == LLAMA
    # Llama: bias-free q, o (d x d) and k, v (d x d/2), gated MLP, two RMSNorm gains.
    assert shape.block_parameters() == 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 96 + 2 * 64
    assert shape.layer_parameters()[0] == 512 * 64
    assert shape.layer_parameters()[-1] == 64 + 64 * 512


def test_a_config_file_or_a_model_folder_is_read(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA), encoding="utf-8")
    by_file = _settings_model(f"modelSource: {{family: llama, configPath: {tmp_path}/config.json}}")
    by_folder = _settings_model(f"modelSource: {{family: llama, configPath: {tmp_path}}}")
    assert by_file == by_folder
    assert shapes.resolve(by_file).seq_len == 128  # seqLen 0: the config's maximum


def test_a_named_shape_stays_its_name() -> None:
    assert _settings_model("model: small") == "small"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "modelSource: {family: llama, configPath: meta-llama/Llama-2-7b-hf}",
            r"^job.yaml: modelSource.configPath: no file 'meta-llama/Llama-2-7b-hf'; Planaria "
            "downloads nothing",
        ),
        (
            "modelSource: {family: llama, config: {hidden_size: 64}}",
            r"^job.yaml: modelSource.config: a llama config needs num_hidden_layers as an integer",
        ),
        (
            "modelSource: {family: mistral, config: {}}",
            r"^job.yaml: modelSource.family: must be one of 'llama' or 'gpt2' "
            r'\(got "mistral"\)$',
        ),
        (
            "modelSource: {family: gpt2}",
            r"^job.yaml: modelSource: give config, configPath or checkpointPath$",
        ),
        (
            "{model: tiny, modelSource: {family: llama, config: " + json.dumps(LLAMA) + "}}",
            r"^job.yaml: model: a job trains either a named model or a modelSource; remove one$",
        ),
        (
            "modelSource: {family: llama, seqLen: 129, config: " + json.dumps(LLAMA) + "}",
            r"^job.yaml: modelSource.seqLen: 129 is outside 1..128",
        ),
    ],
    ids=[
        "a hub name without local files",
        "a config without the family's sizes",
        "an unknown family",
        "neither config nor configPath",
        "a named model beside a modelSource",
        "a sequence longer than the config's positions",
    ],
)
def test_a_bad_model_source_is_one_line_naming_the_field(text: str, expected: str) -> None:
    message = _error(text)
    assert re.search(expected, message), message
    assert "modelSource" in message or "model:" in message


def test_a_config_file_that_is_not_json_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{hidden_size: 64", encoding="utf-8")
    message = _error(f"modelSource: {{family: gpt2, configPath: {tmp_path}}}")
    assert (
        message.startswith("job.yaml: modelSource.configPath: ") and "not a JSON config" in message
    )


def test_an_unknown_family_in_a_reference_is_refused() -> None:
    with pytest.raises(
        errors.PlanInputError, match="unknown family 'opt'; give one of llama, gpt2"
    ):
        shapes.hf_reference("opt", LLAMA)


def test_a_checkpoint_folder_gives_the_config_and_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA), encoding="utf-8")
    (folder / "model.safetensors").write_bytes(b"")  # read by the agents, not here
    monkeypatch.chdir(tmp_path)
    shape = shapes.resolve(
        _settings_model("modelSource: {family: llama, checkpointPath: my-model}")
    )
    assert shape.hf_weights == str(folder) and json.loads(shape.hf_config) == LLAMA
    message = _error("modelSource: {family: llama, checkpointPath: meta-llama/Llama-2-7b-hf}")
    assert message.startswith(
        "job.yaml: modelSource.checkpointPath: 'meta-llama/Llama-2-7b-hf' holds no "
        "model.safetensors or model.safetensors.index.json; Planaria downloads nothing"
    )
