"""Label and field selectors as the Kubernetes API server parses them.

Label selectors: `a=b`, `a==b`, `a!=b`, `a`, `!a`, `a in (x,y)`, `a notin (x,y)`, joined by
commas. Field selectors: `path=value`, `path==value`, `path!=value` where path is any dotted
field path (`metadata.name`, `status.phase`, `spec.nodeName`); a real server accepts only a few
paths per kind, this one accepts every path (a known leniency).

Errors: `SelectorError` (a ValueError) for a selector that does not parse.
"""

import re
from collections.abc import Callable, Mapping
from typing import Any

Predicate = Callable[[Mapping[str, Any]], bool]

_SET_TERM = re.compile(r"^\s*([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ_TERM = re.compile(r"^\s*([\w./-]+)\s*(==|!=|=)\s*([\w./-]*)\s*$")
_EXISTS_TERM = re.compile(r"^\s*(!?)\s*([\w./-]+)\s*$")


class SelectorError(ValueError):
    """A label or field selector that does not parse; the message names the bad term."""


def _split_terms(selector: str) -> list[str]:
    """Split on commas that are not inside `in (...)` parentheses."""
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [term for term in terms if term.strip()]


def _label_term(term: str) -> Callable[[Mapping[str, str]], bool]:
    if match := _SET_TERM.match(term):
        key, op, raw = match.groups()
        values = {value.strip() for value in raw.split(",") if value.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if match := _EQ_TERM.match(term):
        key, op, value = match.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if match := _EXISTS_TERM.match(term):
        negated, key = match.groups()
        return lambda labels: (key in labels) != bool(negated)
    raise SelectorError(f"unable to parse requirement {term!r}: use a=b, a!=b, a, !a, a in (x,y)")


def label_selector(selector: str | None) -> Predicate:
    """A predicate over whole objects (their metadata.labels); None or "" selects everything."""
    terms = [_label_term(term) for term in _split_terms(selector or "")]

    def matches(obj: Mapping[str, Any]) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(term(labels) for term in terms)

    return matches


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The value at a dotted path as the API server compares it (missing: empty string)."""
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        return ""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _field_term(term: str) -> Predicate:
    match = _EQ_TERM.match(term)
    if match is None:
        raise SelectorError(f"invalid field selector {term!r}: use path=value or path!=value")
    path, op, value = match.groups()
    if op == "!=":
        return lambda obj: field_value(obj, path) != value
    return lambda obj: field_value(obj, path) == value


def field_selector(selector: str | None) -> Predicate:
    """A predicate over whole objects; None or "" selects everything."""
    terms = [_field_term(term) for term in _split_terms(selector or "")]
    return lambda obj: all(term(obj) for term in terms)
