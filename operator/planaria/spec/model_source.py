"""A job's model source: a Hugging Face causal LM built from its config, beside the named shapes.

    modelSource:
      family: llama                 # llama (also Mistral-style) or gpt2
      configPath: ./config.json     # a config.json file, or a folder holding one
      # config: {hidden_size: 64, ...}   # or the config inline (what Kubernetes jobs give)
      seqLen: 128                   # tokens per sample; 0: the config's maximum positions
      checkpointPath: ./my-model    # optional: initial weights from a local safetensors folder
                                    # (its config.json is the config when none is given)

`reference` reads the config (the file, when given a path) and returns the one string the
contract carries to every agent (`shapes.hf_reference`): the agents never read the config
file, and nothing is downloaded anywhere. A checkpoint folder is named by its absolute path:
every agent reads its own layers' tensors from it, so it must be readable where they run (the
same machine locally, a volume on Kubernetes). A hub name such as `meta-llama/Llama-2-7b-hf` is
not a local file and is refused with the fix (download it yourself, give the folder). The agent
builds the layers (`planaria.agent.training.hf_models`, needs planaria[hf]).

Errors: ModelSourceError (ValueError), one line naming the field and the fix.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Any

import pydantic
from pydantic import alias_generators

from planaria.contract import errors, shapes

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
MAX_CONFIG_KEYS = 256  # bounds the CRD's map (and so its CEL immutability rule's cost)


class ModelSourceError(ValueError):
    """A model source that cannot be read; the message starts with the field, ends with the fix."""


class ModelFamily(StrEnum):
    """The Hugging Face families Planaria cuts into planner layers (`shapes.HF_FAMILIES`)."""

    LLAMA = "llama"
    GPT2 = "gpt2"


class ModelSourceSpec(pydantic.BaseModel):
    """A Hugging Face causal LM from its config (docs/running.md, "Models")."""

    model_config = pydantic.ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=alias_generators.to_camel,
        populate_by_name=True,
    )

    family: ModelFamily = pydantic.Field(
        description="llama (Llama and Mistral-style models) or gpt2."
    )
    config: dict[str, Any] | None = pydantic.Field(
        None,
        description="The model's config.json inline, with transformers' field names. Give "
        "config or configPath.",
        max_length=MAX_CONFIG_KEYS,
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    config_path: str = pydantic.Field(
        "",
        description="Path of a config.json, or of a local model folder holding one (read "
        "where the job is submitted; nothing is downloaded).",
    )
    checkpoint_path: str = pydantic.Field(
        "",
        description="A local model folder (model.safetensors or a model.safetensors.index.json "
        "with its shards) the initial weights are loaded from instead of drawn from the seed; "
        "its config.json is the config when neither config nor configPath is given.",
    )
    seq_len: int = pydantic.Field(
        0,
        description="Tokens per sample; 0: the config's max_position_embeddings (n_positions).",
        strict=True,
        ge=0,
    )


def reference(source: ModelSourceSpec) -> str:
    """The contract's model string of `source` (`shapes.hf_reference`); raises ModelSourceError
    when the config is missing, unreadable, not JSON, or lacks the family's sizes."""
    if source.config is not None and source.config_path:
        raise ModelSourceError("modelSource: give one of config and configPath, not both")
    weights = _weights_folder(source.checkpoint_path) if source.checkpoint_path else ""
    if source.config is not None:
        config = source.config
    elif source.config_path or weights:
        config = _read(
            source.config_path or weights, "configPath" if source.config_path else "checkpointPath"
        )
    else:
        raise ModelSourceError("modelSource: give config, configPath or checkpointPath")
    try:
        return shapes.hf_reference(source.family.value, config, source.seq_len, weights)
    except errors.PlanInputError as exc:
        raise ModelSourceError(str(exc)) from exc


def _read(path_text: str, field: str) -> dict[str, Any]:
    path = Path(path_text)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ModelSourceError(
            f"modelSource.{field}: no file {str(path)!r}; Planaria downloads nothing: give "
            "a local config.json or model folder (e.g. one `huggingface-cli download` made)"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelSourceError(
            f"modelSource.{field}: {str(path)!r} is not a JSON config ({exc}); give a config.json"
        ) from exc
    if not isinstance(config, dict):
        raise ModelSourceError(
            f"modelSource.{field}: {str(path)!r} holds no JSON object; give a config.json"
        )
    return config


def _weights_folder(path_text: str) -> str:
    """The absolute path of a local safetensors model folder (every agent reads it)."""
    folder = Path(path_text).absolute()
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise ModelSourceError(
            f"modelSource.checkpointPath: {path_text!r} holds no {' or '.join(WEIGHT_FILES)}; "
            "Planaria downloads nothing: give a local safetensors model folder"
        )
    return str(folder)
