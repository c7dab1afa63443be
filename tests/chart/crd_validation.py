"""Validate a ResilientJob spec against the CRD the way the API server does, without a cluster.

Shared by tests/chart and the fuzzing of pydantic against the schema. `problems(crd, spec, old)`
applies the schema's defaults (the API server defaults before it validates), checks the result
against the OpenAPI schema with jsonschema (Draft 4 is OpenAPI v3.0's validation vocabulary:
boolean exclusiveMinimum; `nullable` and `x-kubernetes-int-or-string` are translated here), then
evaluates every CEL `x-kubernetes-validations` rule with cel-python: transition rules (those
naming `oldSelf`) only when an old object is given, as on an update. Values reach CEL typed by
the schema, as in the API server: a `number` field holding 3 is the double 3.0.

Each problem is one line `<path>: <message>`; an empty list means the API server would admit it.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import celpy

# jsonschema ships no type information (no types-jsonschema in the environment).
import jsonschema  # type: ignore[import-untyped]
from celpy import celtypes, evaluation


def spec_schema(crd: dict[str, Any]) -> dict[str, Any]:
    """The schema of `spec` in `crd` (a CRD object as `planaria.kube.crd.crd()` returns)."""
    return root_schema(crd)["properties"]["spec"]  # type: ignore[no-any-return]


def root_schema(crd: dict[str, Any]) -> dict[str, Any]:
    """The openAPIV3Schema of the CRD's only version."""
    (version,) = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def problems(crd: dict[str, Any], spec: Any, old: Any = None) -> list[str]:
    """What the API server would refuse in `spec` (created, or updated from `old`)."""
    return validate(spec_schema(crd), spec, old, "spec")


def document_problems(crd: dict[str, Any], doc: Any, old: Any = None) -> list[str]:
    """What the API server would refuse in a whole ResilientJob document (root rules too)."""
    return validate(root_schema(crd), doc, old, "")


def validate(schema: dict[str, Any], value: Any, old: Any, path: str) -> list[str]:
    """Problems of `value` (defaults applied) against `schema`, schema errors first; CEL rules
    run only on a schema-valid value, as their types assume it."""
    value = apply_defaults(schema, value)
    if old is not None:
        old = apply_defaults(schema, old)
    validator = jsonschema.Draft4Validator(to_jsonschema(schema))
    errors = sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.path)))
    if errors:
        return [f"{_join(path, *map(str, e.path))}: {e.message}" for e in errors]
    return cel_problems(schema, value, old, path)


def _join(*parts: str) -> str:
    return ".".join(part for part in parts if part)


# -- defaulting ------------------------------------------------------------------------------
def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """`value` with every absent property that has a default filled in, recursively (a
    default is itself defaulted further, as the API server does)."""
    if isinstance(value, dict) and schema.get("type") == "object":
        out = dict(value)
        for name, child in schema.get("properties", {}).items():
            if name not in out and "default" in child:
                out[name] = copy.deepcopy(child["default"])
            if name in out:
                out[name] = apply_defaults(child, out[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            out = {k: apply_defaults(extra, v) for k, v in out.items()}
        return out
    if isinstance(value, list) and "items" in schema:
        return [apply_defaults(schema["items"], item) for item in value]
    return value


# -- OpenAPI v3.0 to JSON Schema draft 4 -----------------------------------------------------
def to_jsonschema(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` in plain Draft 4: nullable as a null type, int-or-string as anyOf, and unknown
    properties refused (the API server prunes them; kubectl's strict field validation, the
    default, refuses them, which is what a typo deserves)."""
    out = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    out.pop("nullable", None)
    if "properties" in schema:
        out["properties"] = {k: to_jsonschema(v) for k, v in schema["properties"].items()}
        out["additionalProperties"] = False
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = to_jsonschema(schema["additionalProperties"])
    if "items" in schema:
        out["items"] = to_jsonschema(schema["items"])
    if schema.get("x-kubernetes-int-or-string"):
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable"):
        kinds = [{"type": "null"}, *out.pop("anyOf", [{"type": out.pop("type", "object")}])]
        out["anyOf"] = kinds
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


# -- CEL -------------------------------------------------------------------------------------
_ENV = celpy.Environment()


@functools.cache
def program(rule: str) -> celpy.Runner:
    """The compiled CEL rule (raises celpy.CELParseError when it does not compile)."""
    return _ENV.program(_ENV.compile(rule))


def cel_problems(schema: dict[str, Any], value: Any, old: Any, path: str) -> list[str]:
    """Messages of the CEL rules `value` breaks, at every node of `schema` it reaches."""
    found = [
        f"{path or '<root>'}{rule.get('fieldPath', '')}: {rule['message']}"
        for rule in schema.get("x-kubernetes-validations", [])
        if not _holds(rule["rule"], schema, value, old)
    ]
    if isinstance(value, dict):
        old_map = old if isinstance(old, dict) else {}
        for name, child_value in value.items():
            child = schema.get("properties", {}).get(name) or schema.get("additionalProperties")
            if isinstance(child, dict):
                found += cel_problems(child, child_value, old_map.get(name), _join(path, name))
    if isinstance(value, list) and "items" in schema:
        # The API server correlates old and new items only in map and set lists.
        for i, item in enumerate(value):
            found += cel_problems(schema["items"], item, None, _join(path, str(i)))
    return found


def _holds(rule: str, schema: dict[str, Any], value: Any, old: Any) -> bool:
    """Whether `rule` holds; a transition rule holds trivially without an old value. An
    evaluation error counts as a refusal, as in the API server."""
    if "oldSelf" in rule and old is None:
        return True
    activation: dict[str, Any] = {"self": to_cel(schema, value)}
    if old is not None:
        activation["oldSelf"] = to_cel(schema, old)
    try:
        result = program(rule).evaluate(activation)
    except evaluation.CELEvalError:
        return False
    return isinstance(result, celtypes.BoolType) and bool(result)


def to_cel(schema: dict[str, Any], value: Any) -> Any:
    """`value` as a CEL value typed by `schema` (numbers are doubles, integers ints)."""
    if value is None:
        return None
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        return celtypes.MapType(
            {
                celtypes.StringType(k): to_cel(properties.get(k) or extra or {}, v)
                for k, v in value.items()
            }
        )
    if isinstance(value, list):
        return celtypes.ListType([to_cel(schema.get("items", {}), v) for v in value])
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if schema.get("type") == "number":
        return celtypes.DoubleType(float(value))
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, float):
        return celtypes.DoubleType(value)
    return celtypes.StringType(value)
