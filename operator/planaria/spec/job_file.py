"""Reading a job file: YAML (or JSON) holding a bare job spec or a whole ResilientJob document.

`load_job` returns the job's name and its validated `job.JobSpec`; every problem is one
`job.JobSpecError` line naming the file, the field path as written in the file (`spec.workers`
in a whole document, `workers` in a bare spec) and what to change. Overrides (the command
line's `--workers N` and friends) are applied to the document before validation, so they are
checked by the same rules and reported at the same paths.

A bare spec has no name: the caller gives one (`planaria run` derives it from the file name).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
import yaml

from planaria.spec import consistency, job


@dataclass(frozen=True, slots=True, kw_only=True)
class JobFile:
    """A parsed job file: the job's name (metadata.name, or the caller's for a bare spec), its
    spec, and whether the file was a whole ResilientJob document."""

    name: str
    spec: job.JobSpec
    document: bool


def load_job(
    path: str | os.PathLike[str], *, overrides: Mapping[str, Any] | None = None
) -> JobFile:
    """The job in the file at `path`, with `overrides` (spec field -> value) applied."""
    source = os.fspath(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise job.JobSpecError(
            f"{source}: no such file; give the path of a job file (see examples/tiny-job.yaml)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise job.JobSpecError(f"{source}: cannot read the file ({exc})") from exc
    return parse_job(text, source=source, default_name=name_from_path(path), overrides=overrides)


def name_from_path(path: str | os.PathLike[str]) -> str:
    """A job name from a file name: `Tiny_Job.yaml` -> `tiny-job` (an RFC 1123 label)."""
    stem = re.sub(r"[^a-z0-9-]+", "-", Path(path).stem.lower()).strip("-")[:63].strip("-")
    return stem or "job"


def parse_job(
    text: str,
    *,
    source: str = "job",
    default_name: str = "job",
    overrides: Mapping[str, Any] | None = None,
) -> JobFile:
    """Parse and validate the YAML `text`; problems raise JobSpecError prefixed by `source`."""
    raw = _decode_yaml(text, source)
    whole = "apiVersion" in raw or "kind" in raw
    spec_raw = _spec_of(raw, source) if whole else raw
    for key, value in (overrides or {}).items():
        spec_raw[key] = value
    prefix = ("spec",) if whole else ()
    try:
        if whole:
            document = job.ResilientJob.model_validate({**raw, "spec": spec_raw})
            name, spec = document.metadata.name, document.spec
        else:
            name, spec = default_name, job.JobSpec.model_validate(spec_raw)
    except pydantic.ValidationError as exc:
        raise job.JobSpecError(f"{source}: {describe(exc)}") from None
    problems = consistency.check(spec)
    if problems:
        path, problem = problems[0]
        raise job.JobSpecError(f"{source}: {'.'.join((*prefix, path))}: {problem}")
    if job.NAME_PATTERN.match(name) is None:
        where = "metadata.name" if whole else "the file name"
        raise job.JobSpecError(f"{source}: {where}: {name!r} is not a valid job name; {job.NAMING}")
    return JobFile(name=name, spec=spec, document=whole)


def _decode_yaml(text: str, source: str) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise job.JobSpecError(
            f"{source}: not valid YAML{where}; a job file is a YAML mapping of spec fields "
            "(see examples/tiny-job.yaml)"
        ) from None
    except RecursionError:
        # PyYAML composes nested collections recursively: a file nested a few thousand levels
        # deep would otherwise end `planaria run` with a traceback.
        raise job.JobSpecError(
            f"{source}: nested too deeply to be a job file; a job file is a YAML mapping of "
            "spec fields (see examples/tiny-job.yaml)"
        ) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise job.JobSpecError(
            f"{source}: must be a mapping of spec fields or a ResilientJob document "
            f"(got {type(raw).__name__})"
        )
    return raw


def _spec_of(raw: dict[str, Any], source: str) -> dict[str, Any]:
    spec = raw.get("spec", {})
    if spec is None:
        return {}
    if not isinstance(spec, dict):
        raise job.JobSpecError(
            f"{source}: spec: must be a mapping of spec fields (got {type(spec).__name__})"
        )
    return dict(spec)


# Pydantic error types rephrased as what the value must be, with the fix.
_MUST_BE = {
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "model_type": "must be a mapping",
    "dict_type": "must be a mapping",
    "finite_number": "must be a finite number",
}


def describe(exc: pydantic.ValidationError) -> str:
    """The first problem as `field.path: problem`, and how many more there are."""
    problems = exc.errors()
    first = problems[0]
    path = ".".join(str(part) for part in first["loc"] if not _is_union_tag(part))
    line = f"{path or '(top level)'}: {_problem(first)}"
    if len(problems) > 1:
        line += f" (and {len(problems) - 1} more)"
    return line


def _is_union_tag(part: object) -> bool:
    # A union's errors carry the member type in their path (`worker.int`): not a field.
    return isinstance(part, str) and (
        part in {"int", "str", "float"} or part.startswith("literal[")
    )


_LOOKS_LIKE = {  # what a value of a patterned field looks like, for the error message
    job.BYTES_PATTERN: "a byte quantity like 512Mi, 40Gi, 1.5G or 1000000",
    job.QUANTITY_PATTERN: "a Kubernetes quantity like 2, 500m or 8Gi",
}


def _problem(error: Any) -> str:
    kind, ctx, value = error["type"], error.get("ctx", {}), error.get("input")
    if kind == "missing":
        return "missing; add it (see docs/running.md)"
    if kind == "extra_forbidden":
        return (
            "unknown field; remove it or fix its spelling (fields are camelCase, e.g. stepSeconds)"
        )
    for bound, word in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
        if bound in ctx:
            return f"must be {word} {ctx[bound]} (got {_shown(value)})"
    if kind in ("literal_error", "enum"):
        return f"must be one of {ctx.get('expected', '')} (got {_shown(value)})"
    if kind in ("too_short", "string_too_short"):
        return "must not be empty"
    if kind in _MUST_BE:
        return f"{_MUST_BE[kind]} (got {_shown(value)})"
    if kind == "string_pattern_mismatch" and ctx.get("pattern") in _LOOKS_LIKE:
        return f"must be {_LOOKS_LIKE[ctx['pattern']]} (got {_shown(value)})"
    message: str = error["msg"].removeprefix("Value error, ")
    return f"{message[0].lower()}{message[1:]}"


def _shown(value: object) -> str:
    """A short rendering of an offending value for an error message."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    try:
        text = json.dumps(_clipped(value, depth=3), default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _clipped(value: object, depth: int) -> object:
    """`value` with at most 8 items per list or mapping, `depth` levels deep: enough to show,
    and bounded. YAML aliases share one list among many (`[*a, *a, ...]`), so rendering the
    whole value of a 500-byte file could take exponential time and memory."""
    if isinstance(value, list | dict) and depth == 0:
        return "..."
    if isinstance(value, list):
        return [_clipped(item, depth - 1) for item in value[:8]]
    if isinstance(value, dict):
        items = list(value.items())[:8]
        return {str(key): _clipped(item, depth - 1) for key, item in items}
    return value
