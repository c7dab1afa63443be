"""The three PATCH flavours of the Kubernetes API, applied to plain JSON documents.

- `merge_patch`: RFC 7386 (`application/merge-patch+json`): maps merge, `null` deletes,
  everything else (lists included) replaces.
- `json_patch`: RFC 6902 (`application/json-patch+json`): add, remove, replace, move, copy,
  test, with RFC 6901 pointers (`~0`, `~1`, `-` to append).
- `strategic_merge_patch` (`application/strategic-merge-patch+json`): a merge patch, except
  that lists whose items are maps merge item by item on a key, `name` for containers, ports,
  env, volumes, volumeMounts and `type` for conditions (the patch-merge keys of the Go types
  these lists come from). Directives (`$patch`, `$retainKeys`, `$deleteFromPrimitiveList`)
  are not supported.

Nothing is mutated in place: each function returns a new document.
Errors: `PatchError` (a ValueError) for a malformed patch or a failed `test` operation.
"""

import copy
from typing import Any

# Strategic merge keys by list field name (a stand-in for the Go struct tags).
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "ports": "containerPort",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "conditions": "type",
    "containerStatuses": "name",
    "imagePullSecrets": "name",
}


class PatchError(ValueError):
    """A patch that cannot be applied; the message says which operation and why."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 merge of `patch` into a copy of `target`."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A merge patch that merges known lists of maps by their merge key (see module doc)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif key in _MERGE_KEYS and isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(result[key], value, _MERGE_KEYS[key])
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result


def _merge_list(current: list[Any], patch: list[Any], merge_key: str) -> list[Any]:
    merged = copy.deepcopy(current)
    for item in patch:
        key = item.get(merge_key) if isinstance(item, dict) else None
        index = next(
            (
                i
                for i, old in enumerate(merged)
                if isinstance(old, dict) and key is not None and old.get(merge_key) == key
            ),
            None,
        )
        if index is None:
            merged.append(copy.deepcopy(item))
        else:
            merged[index] = strategic_merge_patch(merged[index], item)
    return merged


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer {path!r} must start with '/'")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> Any:
    node = doc
    for part in parts[:-1]:
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise PatchError(f"path {path!r} does not exist") from exc
    return node


def _index(node: list[Any], part: str, path: str, *, appending: bool) -> int:
    if appending and part == "-":
        return len(node)
    try:
        index = int(part)
    except ValueError as exc:
        raise PatchError(f"path {path!r}: {part!r} is not a list index") from exc
    if not 0 <= index <= len(node) - (0 if appending else 1):
        raise PatchError(f"path {path!r}: index {index} is out of range")
    return index


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    node = _parent(doc, parts, path)
    try:
        if isinstance(node, list):
            return node[_index(node, parts[-1], path, appending=False)]
        return node[parts[-1]]
    except (KeyError, TypeError) as exc:
        raise PatchError(f"path {path!r} does not exist") from exc


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    node = _parent(doc, parts, path)
    if isinstance(node, list):
        return node.pop(_index(node, parts[-1], path, appending=False))
    if not isinstance(node, dict) or parts[-1] not in node:
        raise PatchError(f"path {path!r} does not exist")
    return node.pop(parts[-1])


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return copy.deepcopy(value)
    node = _parent(doc, parts, path)
    if isinstance(node, list):
        node.insert(_index(node, parts[-1], path, appending=True), copy.deepcopy(value))
    elif isinstance(node, dict):
        node[parts[-1]] = copy.deepcopy(value)
    else:
        raise PatchError(f"path {path!r}: the parent is neither a map nor a list")
    return doc


def _apply(doc: Any, op: dict[str, Any]) -> Any:
    kind, path = op.get("op"), op.get("path", "")
    if kind == "test":
        if _get(doc, path) != op.get("value"):
            raise PatchError(f"test operation failed: {path!r} is not {op.get('value')!r}")
        return doc
    if kind == "remove":
        _remove(doc, path)
        return doc
    if kind == "replace":
        _get(doc, path)  # must exist
        if _pointer(path):
            _remove(doc, path)
        return _add(doc, path, op.get("value"))
    if kind in ("move", "copy"):
        source = op.get("from", "")
        value = _remove(doc, source) if kind == "move" else copy.deepcopy(_get(doc, source))
        return _add(doc, path, value)
    if kind == "add":
        return _add(doc, path, op.get("value"))
    raise PatchError(f"unknown JSON patch operation {kind!r}")


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902: apply every operation to a copy of `target`, all or nothing."""
    if not isinstance(ops, list) or not all(isinstance(op, dict) for op in ops):
        raise PatchError("a JSON patch must be a list of operation objects")
    doc = copy.deepcopy(target)
    for op in ops:
        doc = _apply(doc, op)
    return doc
