"""A CRD's structural schema applied as the API server does: prune, default, validate.

`admit(schema, obj, old)` takes a custom object as written by a client and returns what the
server stores: unknown fields pruned (unless `x-kubernetes-preserve-unknown-fields`), `default`s
filled in, then validated by jsonschema (the OpenAPI v3 schema translated, with
`x-kubernetes-int-or-string` as integer-or-string, `nullable`, OpenAPI's boolean
`exclusiveMinimum`/`exclusiveMaximum`) and by the CEL rules in `x-kubernetes-validations`
(cel-python). Transition rules (those naming `oldSelf`) run on update only, where the old value
exists, correlated through object properties and map values (not through list items).

Not emulated: `x-kubernetes-list-type` uniqueness, `messageExpression` cost limits, CEL's
Kubernetes extension libraries (quantity, url, ip), `fieldValidation=Strict` (unknown fields
are pruned silently, as with the default `Warn`); CEL rules run only if the schema holds.

Errors: `SchemaError` (a ValueError) carries `causes`, a list of (field path, message), from
which the emulator builds the 422 Invalid `Status`.
"""

import copy
import functools
import json
from collections.abc import Mapping
from typing import Any

import celpy
import celpy.adapter
import jsonschema  # type: ignore[import-untyped]  # no stubs are installed (pyproject is fixed)

Schema = Mapping[str, Any]
_ROOT_KEEP = ("apiVersion", "kind", "metadata")
_PASSTHROUGH = (
    "type",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minProperties",
    "maxProperties",
    "required",
    "multipleOf",
)


class SchemaError(ValueError):
    """The object violates its schema; `causes` are (field path, message) pairs."""

    def __init__(self, causes: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{field}: {message}" for field, message in causes))
        self.causes = causes


def to_json_schema(node: Schema) -> dict[str, Any]:
    """Translate one OpenAPI v3 (structural) schema node to JSON Schema draft 2020-12."""
    out: dict[str, Any] = {key: node[key] for key in _PASSTHROUGH if key in node}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    for bound, limit in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if node.get(bound) is True and limit in node:
            out[bound] = out.pop(limit)
    if "properties" in node:
        out["properties"] = {k: to_json_schema(v) for k, v in node["properties"].items()}
    if isinstance(node.get("additionalProperties"), Mapping):
        out["additionalProperties"] = to_json_schema(node["additionalProperties"])
    if "items" in node:
        out["items"] = to_json_schema(node["items"])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in node:
            out[key] = [*out.get(key, []), *(to_json_schema(sub) for sub in node[key])]
    if "not" in node:
        out["not"] = to_json_schema(node["not"])
    return out


def prune(node: Schema, value: Any, *, root: bool = False) -> Any:
    """Drop fields the schema does not declare (in place; returns the value)."""
    if isinstance(value, list) and "items" in node:
        return [prune(node["items"], item) for item in value]
    if not isinstance(value, dict) or node.get("type") != "object":
        return value
    props: Mapping[str, Any] = node.get("properties", {})
    extra = node.get("additionalProperties")
    keep_unknown = node.get("x-kubernetes-preserve-unknown-fields") or extra is True
    embedded = root or node.get("x-kubernetes-embedded-resource")
    for key in list(value):
        if key in props:
            value[key] = prune(props[key], value[key])
        elif isinstance(extra, Mapping):
            value[key] = prune(extra, value[key])
        elif not keep_unknown and not (embedded and key in _ROOT_KEEP):
            del value[key]
    return value


def apply_defaults(node: Schema, value: Any) -> Any:
    """Fill absent properties that have a `default` (in place; returns the value)."""
    if isinstance(value, list) and "items" in node:
        return [apply_defaults(node["items"], item) for item in value]
    if not isinstance(value, dict):
        return value
    for key, sub in node.get("properties", {}).items():
        if key not in value and "default" in sub:
            value[key] = copy.deepcopy(sub["default"])
        if key in value:
            value[key] = apply_defaults(sub, value[key])
    extra = node.get("additionalProperties")
    if isinstance(extra, Mapping):
        for key in value:
            if key not in node.get("properties", {}):
                value[key] = apply_defaults(extra, value[key])
    return value


def _field(path: list[str | int]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _shown(value: Any) -> str:
    """How the API server prints an invalid value: the type for containers, else JSON."""
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    return json.dumps(value)


def schema_causes(node: Schema, value: Any) -> list[tuple[str, str]]:
    """Every jsonschema violation as (field path, message), sorted by path."""
    validator = jsonschema.Draft202012Validator(to_json_schema(node))
    causes = []
    for error in validator.iter_errors(value):
        path = list(error.absolute_path)
        if error.validator == "required":
            missing = [key for key in error.validator_value if key not in error.instance]
            causes += [(_field([*path, key]), "Required value") for key in missing]
        else:
            field = _field(path)
            causes.append((field, f"Invalid value: {_shown(error.instance)}: {error.message}"))
    return sorted(causes)


@functools.lru_cache(maxsize=512)
def _program(rule: str) -> celpy.Runner:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def _evaluate(rule: str, activation: dict[str, Any]) -> tuple[bool, str]:
    try:
        result = _program(rule).evaluate(activation)
    except Exception as exc:  # CEL parse and evaluation errors both mean the rule fails
        return False, f"rule {rule!r} could not be evaluated: {str(exc).splitlines()[0][:200]}"
    return bool(result), ""


def _rule_causes(
    node: Schema, value: Any, old: Any, has_old: bool, path: list[str | int]
) -> list[tuple[str, str]]:
    causes = []
    for rule in node.get("x-kubernetes-validations", []):
        text = rule["rule"]
        if "oldSelf" in text and not has_old:
            continue  # a transition rule: only on update, where the old value exists
        activation = {"self": celpy.adapter.json_to_cel(value)}
        if has_old:
            activation["oldSelf"] = celpy.adapter.json_to_cel(old)
        passed, error = _evaluate(text, activation)
        if not passed:
            message = error or rule.get("message") or f"failed rule: {text}"
            field = _field([*path, *rule.get("fieldPath", "").strip(".").split(".")])
            causes.append((field.rstrip("."), f"Invalid value: {_shown(value)}: {message}"))
    return causes


def cel_causes(
    node: Schema,
    value: Any,
    old: Any = None,
    *,
    has_old: bool = False,
    path: list[str | int] | None = None,
) -> list[tuple[str, str]]:
    """Violations of `x-kubernetes-validations` rules anywhere under `node`."""
    path = path or []
    causes = _rule_causes(node, value, old, has_old, path)
    if isinstance(value, dict):
        props, extra = node.get("properties", {}), node.get("additionalProperties")
        for key, item in value.items():
            sub = props.get(key, extra if isinstance(extra, Mapping) else None)
            if sub is not None:
                old_has = has_old and isinstance(old, dict) and key in old
                old_item = old.get(key) if old_has else None
                causes += cel_causes(sub, item, old_item, has_old=old_has, path=[*path, key])
    elif isinstance(value, list) and "items" in node:
        for index, item in enumerate(value):
            causes += cel_causes(node["items"], item, path=[*path, index])
    return causes


def admit(schema: Schema, obj: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
    """Prune, default and validate a custom object; raises SchemaError with every cause."""
    stored: dict[str, Any] = apply_defaults(schema, prune(schema, copy.deepcopy(obj), root=True))
    checked = {key: val for key, val in stored.items() if key not in _ROOT_KEEP}
    causes = schema_causes({**schema, "required": _required_sans_meta(schema)}, checked)
    if not causes:
        old_body = {k: v for k, v in (old or {}).items() if k not in _ROOT_KEEP}
        causes = cel_causes(schema, checked, old_body, has_old=old is not None)
    if causes:
        raise SchemaError(causes)
    return stored


def _required_sans_meta(schema: Schema) -> list[str]:
    return [key for key in schema.get("required", []) if key not in _ROOT_KEEP]
