"""pydantic's JSON Schema (2020-12) as a structural OpenAPI v3.0 schema, the dialect a
CustomResourceDefinition takes: every node typed, $refs inlined, `X | None` as `nullable`,
`int | str` as `x-kubernetes-int-or-string`, exclusive bounds as boolean flags, maps as
`additionalProperties`, null defaults dropped, integer bounds within 2**53 - 1; titles dropped,
descriptions and defaults kept.

What does not live here: the CRD itself and its CEL rules (`planaria.kube.crd`).

Errors:

    ValueError
    └── SchemaError   a construct with no structural form (a new field type this translation
                      does not know yet: extend it rather than emit a schema the API server
                      would refuse)
"""

from __future__ import annotations

from typing import Any

import pydantic

from planaria.wire import messages

# The API server compares integer bounds as float64: a `maximum` of 2**63 - 1 rounds to 2**63 and
# the server refuses the CRD ("should be less than or equal to -9223372036854775808"). Bounds are
# kept within what a JSON number carries exactly.
MAX_INTEGER = messages.MAX_JSON_INTEGER
# Keywords copied unchanged from pydantic's schema into the structural one.
_KEPT = frozenset(
    {
        "type",
        "nullable",
        "x-kubernetes-int-or-string",
        "description",
        "enum",
        "format",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "required",
        "default",
        "x-kubernetes-preserve-unknown-fields",  # free-form maps (a model's config)
    }
)
_DROPPED = frozenset({"title", "additionalProperties", "$defs"})


class SchemaError(ValueError):
    """A pydantic schema construct with no structural form."""


def structural(model: type[pydantic.BaseModel]) -> dict[str, Any]:
    """`model`'s JSON schema (by alias) as a structural OpenAPI v3 schema, without CEL rules."""
    raw = model.model_json_schema(by_alias=True)
    return _node(raw, raw.get("$defs", {}))


def _node(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    node = _inline(node, defs)
    if "anyOf" in node:
        node = _any_of(node, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _KEPT:
            out[key] = value
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            # JSON Schema 2020-12 states the bound itself; OpenAPI v3.0 a flag beside it.
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "properties":
            out[key] = {name: _node(child, defs) for name, child in value.items()}
        elif key == "items":
            out[key] = _node(value, defs)
        elif key == "patternProperties":
            # Structural schemas have no patternProperties: keys are checked by the operator
            # (pydantic) and, for label keys, by the API server when it creates the pods.
            (child,) = value.values()
            out["additionalProperties"] = _node(child, defs)
        elif key == "const":
            out["enum"] = [value]
        elif key not in _DROPPED:
            raise SchemaError(f"no structural form for {key!r} in {node}; extend kube.openapi")
    if node.get("additionalProperties") not in (None, False, True):
        out["additionalProperties"] = _node(node["additionalProperties"], defs)
    return _bounded(_without_nulls(out))


def _inline(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """`node` with its $ref replaced by the definition (the node's own keys win)."""
    if "$ref" not in node:
        return node
    name = node["$ref"].removeprefix("#/$defs/")
    merged = {**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
    return _inline(merged, defs)


def _any_of(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """`X | None` becomes X with `nullable`; `int | str` becomes int-or-string."""
    options = [_inline(option, defs) for option in node["anyOf"]]
    rest = {k: v for k, v in node.items() if k != "anyOf"}
    kinds = [option for option in options if option.get("type") != "null"]
    if len(kinds) < len(options):
        rest["nullable"] = True
    if sorted(option.get("type", "") for option in kinds) == ["integer", "string"]:
        if any(len(option) > 1 for option in kinds):
            raise SchemaError(f"int-or-string with rules per branch: {node}; extend kube.openapi")
        return {**rest, "x-kubernetes-int-or-string": True}
    if len(kinds) != 1:
        raise SchemaError(f"no structural form for a union of {kinds}; extend kube.openapi")
    return {**kinds[0], **rest}


def _without_nulls(node: dict[str, Any]) -> dict[str, Any]:
    """Null defaults are dropped: an absent optional field means the same, and a null default
    would make the API server write explicit nulls into every object."""
    if "default" in node:
        if node["default"] is None:
            del node["default"]
        else:
            node["default"] = _strip_none(node["default"])
    return node


def _strip_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_none(v) for v in value]
    return value


def _bounded(node: dict[str, Any]) -> dict[str, Any]:
    if node.get("type") == "integer":
        for key in ("minimum", "maximum"):
            if key in node and node[key] > MAX_INTEGER:
                node[key] = MAX_INTEGER
                node.pop("exclusiveMaximum", None)
    return node
