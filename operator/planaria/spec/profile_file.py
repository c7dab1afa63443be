"""The profile file: a versioned JSON document holding a `planaria.contract.profile.Profile`.

Written by `planaria profile` (measured or synthetic), read by the planner's callers and by
`planaria profile --check` for profiles users bring from their own clusters. The format is
documented field by field in docs/profile-format.md; the pydantic models below are its schema
(extra fields forbidden, camelCase names).

Version rule: `version` is an integer, 1 today; any change to the format bumps it, and a reader
accepts only the versions it knows, so an old planaria never misreads a newer file.

Errors:

    ValueError
    └── ProfileFileError   one line: `<file>: <field path>: <problem and fix>`

Cross-field rules pydantic cannot express per field (forwardS and backwardS of equal length, one
M for all layers, the layer count of a known model) are checked here with the same message form.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
from pydantic import alias_generators

from planaria.contract import errors, shapes
from planaria.contract import precision as arithmetic
from planaria.contract import profile as planner_profile

FORMAT = "planaria.profile"
VERSION = 1
SUPPORTED_VERSIONS = (1,)


class ProfileFileError(ValueError):
    """A profile file is missing, unreadable, not JSON or breaks the format; one line saying
    which file, which field, and what to change."""


Seconds = Annotated[float, pydantic.Field(ge=0, allow_inf_nan=False)]
Bytes = Annotated[int, pydantic.Field(ge=0)]
Name = Annotated[str, pydantic.Field(min_length=1)]


class _Model(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(
        extra="forbid",
        strict=True,
        frozen=True,
        alias_generator=alias_generators.to_camel,
        populate_by_name=True,
    )


Bandwidth = Annotated[float, pydantic.Field(gt=0, allow_inf_nan=False)]


class LinkDocument(_Model):
    """`intraNode` / `interNode`: moving b bytes takes latencyS + b / bandwidthBytesPerS; a ring
    all-reduce step the allreduce* figures, optional within version 1 (absent: the
    point-to-point ones, as files written before them meant)."""

    bandwidth_bytes_per_s: Bandwidth
    latency_s: Seconds
    allreduce_bandwidth_bytes_per_s: Bandwidth | None = None
    allreduce_latency_s: Seconds | None = None


class LayerDocument(_Model):
    """One planner layer; forwardS[k-1] / backwardS[k-1] are seconds with k GPUs per stage."""

    name: Name
    forward_s: Annotated[list[Seconds], pydantic.Field(min_length=1)]
    backward_s: Annotated[list[Seconds], pydantic.Field(min_length=1)]
    parameter_bytes: Bytes
    gradient_bytes: Bytes
    optimizer_bytes: Bytes
    activation_bytes: Bytes
    output_bytes: Bytes
    optimizer_s: Seconds = 0.0


class ProfileDocument(_Model):
    """The whole file (see docs/profile-format.md)."""

    format: Literal["planaria.profile"]
    version: Literal[1]
    model: Name
    accelerator: Name
    synthetic: bool = False
    # Optional within version 1: files written before it are float32 measurements or analytic
    # profiles whose state is 16 bytes per parameter in every precision (docs/profile-format.md).
    precision: Annotated[arithmetic.Precision, pydantic.Field(strict=False)] = (
        arithmetic.Precision.FP32
    )
    assumptions: str = ""
    micro_batch_size: Annotated[int, pydantic.Field(ge=1)]
    memory_bytes: Annotated[int, pydantic.Field(ge=1)]
    intra_node: LinkDocument
    inter_node: LinkDocument
    layers: Annotated[list[LayerDocument], pydantic.Field(min_length=1)]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileFile:
    """A parsed profile file: the planner's profile and the file's free-text assumptions."""

    profile: planner_profile.Profile
    assumptions: str = ""


def load_profile(path: str | os.PathLike[str]) -> planner_profile.Profile:
    """The profile stored at `path`; raises ProfileFileError (a ValueError) saying what to fix."""
    return read_profile_file(path).profile


def read_profile_file(path: str | os.PathLike[str]) -> ProfileFile:
    """The profile and assumptions stored at `path`; raises ProfileFileError."""
    source = os.fspath(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProfileFileError(
            f"{source}: no such file; give the path of a profile written by `planaria profile`"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileFileError(f"{source}: cannot read the file ({exc})") from exc
    return parse_profile_file(text, source=source)


def parse_profile(text: str, *, source: str = "profile") -> planner_profile.Profile:
    """The profile in the JSON `text`; `source` names it in error messages."""
    return parse_profile_file(text, source=source).profile


def parse_profile_file(text: str, *, source: str = "profile") -> ProfileFile:
    """Parse and validate `text`; every problem raises ProfileFileError prefixed by `source`."""
    raw = _decode_json(text, source)
    _check_format_and_version(raw, source)
    try:
        document = ProfileDocument.model_validate(raw)
    except pydantic.ValidationError as exc:
        raise ProfileFileError(f"{source}: {_describe(exc)}") from None
    _check_layer_widths(document, source)
    _check_some_time(document, source)
    _check_named_model(document, source)
    try:
        return ProfileFile(profile=_to_profile(document), assumptions=document.assumptions)
    except errors.PlanInputError as exc:
        raise ProfileFileError(f"{source}: {exc}") from exc


def dump_profile(
    profile: planner_profile.Profile, path: str | os.PathLike[str], *, assumptions: str = ""
) -> None:
    """Write `profile` to `path` (replacing it atomically); raises ProfileFileError on I/O."""
    target = Path(path)
    partial = target.with_name(f".{target.name}.partial")
    try:
        partial.write_text(render_profile(profile, assumptions=assumptions), encoding="utf-8")
        partial.replace(target)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise ProfileFileError(
            f"{os.fspath(path)}: cannot write the profile ({exc.strerror or exc}); "
            "check that the directory exists and is writable"
        ) from exc


def render_profile(profile: planner_profile.Profile, *, assumptions: str = "") -> str:
    """The file text of `profile`: one field per line, one layer per line."""
    # exclude_none: a link without collective figures is written as files before them were
    document = _to_document(profile, assumptions).model_dump(
        mode="json", by_alias=True, exclude_none=True
    )
    layers = document.pop("layers")
    lines = [f"  {json.dumps(key)}: {json.dumps(value)}" for key, value in document.items()]
    layer_lines = ",\n".join(f"    {json.dumps(layer)}" for layer in layers)
    lines.append(f'  "layers": [\n{layer_lines}\n  ]')
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _decode_json(text: str, source: str) -> dict[str, Any]:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileFileError(
            f"{source}: not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); "
            "a profile is the JSON document `planaria profile` writes"
        ) from None
    if not isinstance(raw, dict):
        raise ProfileFileError(
            f"{source}: must be a JSON object with format {FORMAT!r} (got {type(raw).__name__})"
        )
    return raw


def _check_format_and_version(raw: dict[str, Any], source: str) -> None:
    # Checked before the schema so that a newer file gets one clear line, not a field per change.
    if raw.get("format") != FORMAT:
        raise ProfileFileError(
            f'{source}: format: must be "{FORMAT}" (got {_shown(raw.get("format"))}); '
            "is this a planaria profile?"
        )
    if "version" not in raw:
        raise ProfileFileError(f'{source}: version: missing; add "version": {VERSION}')
    version = raw["version"]
    if version not in SUPPORTED_VERSIONS or isinstance(version, bool):
        known = ", ".join(str(v) for v in SUPPORTED_VERSIONS)
        raise ProfileFileError(
            f"{source}: version: unknown version {_shown(version)}; this planaria reads "
            f"version {known}: use the planaria that wrote the file, or rewrite it as version 1"
        )


def _check_layer_widths(document: ProfileDocument, source: str) -> None:
    width = len(document.layers[0].forward_s)
    for i, layer in enumerate(document.layers):
        if len(layer.backward_s) != len(layer.forward_s):
            raise ProfileFileError(
                f"{source}: layers.{i}.backwardS: has {_entries(layer.backward_s)} but "
                f"forwardS has {len(layer.forward_s)}; give one time per GPU count 1..M in both"
            )
        if len(layer.forward_s) != width:
            raise ProfileFileError(
                f"{source}: layers.{i}.forwardS: has {_entries(layer.forward_s)} but "
                f"layers.0 has {width}; every layer needs times for 1..M GPUs with the same M"
            )


def _check_some_time(document: ProfileDocument, source: str) -> None:
    # Every time 0 makes a step take no time: throughputs divide by it (the policy's eq. 8).
    if any(t > 0 for layer in document.layers for t in (*layer.forward_s, *layer.backward_s)):
        return
    raise ProfileFileError(
        f"{source}: layers: every forwardS and backwardS is 0; a profile needs the layers' "
        "times (`planaria profile` measures them)"
    )


def _entries(values: list[float]) -> str:
    return f"{len(values)} entry" if len(values) == 1 else f"{len(values)} entries"


def _check_named_model(document: ProfileDocument, source: str) -> None:
    shape = shapes.NAMED_SHAPES.get(document.model)
    if shape is None or len(document.layers) == shape.num_planner_layers:
        return
    raise ProfileFileError(
        f"{source}: layers: profile has {len(document.layers)} layers but model {shape.name} "
        f"has {shape.num_planner_layers}: embedding, {shape.num_layers} blocks, head"
    )


# Pydantic error types rephrased as what the value must be.
_MUST_BE = {
    "int_type": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "model_type": "must be an object",
    "dict_type": "must be an object",
    "finite_number": "must be a finite number",
}


def _describe(exc: pydantic.ValidationError) -> str:
    """The first problem as `field.path: problem`, and how many more there are."""
    problems = exc.errors()
    first = problems[0]
    path = ".".join(str(part) for part in first["loc"]) or "(top level)"
    line = f"{path}: {_problem(first)}"
    if len(problems) > 1:
        line += f" (and {len(problems) - 1} more)"
    return line


def _problem(error: Any) -> str:
    kind, ctx, value = error["type"], error.get("ctx", {}), error.get("input")
    if kind == "missing":
        return "missing; add it (see docs/profile-format.md)"
    if kind == "extra_forbidden":
        return "unknown field; remove it or fix its spelling (fields are camelCase, e.g. forwardS)"
    if kind == "greater_than_equal":
        return f"must be >= {ctx['ge']:g} (got {_shown(value)})"
    if kind == "greater_than":
        return f"must be > {ctx['gt']:g} (got {_shown(value)})"
    if kind in ("too_short", "string_too_short"):
        return "must not be empty"
    if kind in _MUST_BE:
        return f"{_MUST_BE[kind]} (got {_shown(value)})"
    message: str = error["msg"]
    return f"{message[0].lower()}{message[1:]} (got {_shown(value)})"


def _shown(value: object) -> str:
    """A short JSON rendering of a offending value for an error message."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _to_profile(document: ProfileDocument) -> planner_profile.Profile:
    return planner_profile.Profile(
        model=document.model,
        accelerator=document.accelerator,
        micro_batch_size=document.micro_batch_size,
        memory_bytes=document.memory_bytes,
        layers=tuple(_to_layer(layer) for layer in document.layers),
        intra_node=_to_link(document.intra_node),
        inter_node=_to_link(document.inter_node),
        synthetic=document.synthetic,
        precision=document.precision,
    )


def _to_layer(layer: LayerDocument) -> planner_profile.LayerProfile:
    return planner_profile.LayerProfile(
        name=layer.name,
        forward_s=tuple(layer.forward_s),
        backward_s=tuple(layer.backward_s),
        parameter_bytes=layer.parameter_bytes,
        gradient_bytes=layer.gradient_bytes,
        optimizer_bytes=layer.optimizer_bytes,
        activation_bytes=layer.activation_bytes,
        output_bytes=layer.output_bytes,
        optimizer_s=layer.optimizer_s,
    )


def _to_link(link: LinkDocument) -> planner_profile.LinkProfile:
    return planner_profile.LinkProfile(
        bandwidth_bytes_per_s=link.bandwidth_bytes_per_s,
        latency_s=link.latency_s,
        allreduce_bandwidth_bytes_per_s=link.allreduce_bandwidth_bytes_per_s,
        allreduce_latency_s=link.allreduce_latency_s,
    )


def _to_document(profile: planner_profile.Profile, assumptions: str) -> ProfileDocument:
    return ProfileDocument(
        format="planaria.profile",
        version=1,
        model=profile.model,
        accelerator=profile.accelerator,
        synthetic=profile.synthetic,
        precision=profile.precision,
        assumptions=assumptions,
        micro_batch_size=profile.micro_batch_size,
        memory_bytes=profile.memory_bytes,
        intra_node=_from_link(profile.intra_node),
        inter_node=_from_link(profile.inter_node),
        layers=[_from_layer(layer) for layer in profile.layers],
    )


def _from_layer(layer: planner_profile.LayerProfile) -> LayerDocument:
    return LayerDocument(
        name=layer.name,
        forward_s=[float(t) for t in layer.forward_s],
        backward_s=[float(t) for t in layer.backward_s],
        parameter_bytes=int(layer.parameter_bytes),
        gradient_bytes=int(layer.gradient_bytes),
        optimizer_bytes=int(layer.optimizer_bytes),
        activation_bytes=int(layer.activation_bytes),
        output_bytes=int(layer.output_bytes),
        optimizer_s=float(layer.optimizer_s),
    )


def _from_link(link: planner_profile.LinkProfile) -> LinkDocument:
    def number(value: float | None) -> float | None:
        return None if value is None else float(value)

    return LinkDocument(
        bandwidth_bytes_per_s=float(link.bandwidth_bytes_per_s),
        latency_s=float(link.latency_s),
        allreduce_bandwidth_bytes_per_s=number(link.allreduce_bandwidth_bytes_per_s),
        allreduce_latency_s=number(link.allreduce_latency_s),
    )
