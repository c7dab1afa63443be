"""Properties of the emulator's pure parts, against oracles.

Covers: label selectors parsed from text agree with a direct evaluation of their terms (every
operator, combined with commas); merge patches are idempotent and `{}` changes nothing; JSON
patch add-then-remove restores a document (keys needing `~0`/`~1` escapes included), `test`
passes on the current value and fails on any other; strategic merge patches merge containers
by name, keeping the order of the existing ones and appending new ones.
"""

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import strategies
from tests.kube.support import patches, selectors

Requirement = tuple[str, str, tuple[str, ...]]


def _render(requirement: Requirement) -> str:
    op, key, values = requirement
    if op == "exists":
        return key
    if op == "!":
        return f"!{key}"
    if op in ("in", "notin"):
        return f"{key} {op} ({','.join(values)})"
    return f"{key}{op}{values[0]}"


def _holds(requirement: Requirement, labels: dict[str, str]) -> bool:
    op, key, values = requirement
    return {
        "=": lambda: labels.get(key) == values[0],
        "==": lambda: labels.get(key) == values[0],
        "!=": lambda: labels.get(key) != values[0],
        "exists": lambda: key in labels,
        "!": lambda: key not in labels,
        "in": lambda: labels.get(key) in values,
        "notin": lambda: labels.get(key) not in values,
    }[op]()


@given(strategies.label_maps(), st.lists(strategies.label_requirements(), min_size=1, max_size=3))
def test_label_selectors_agree_with_their_terms(
    labels: dict[str, str], requirements: list[Requirement]
) -> None:
    text = ",".join(_render(requirement) for requirement in requirements)
    matches = selectors.label_selector(text)
    assert matches({"metadata": {"labels": labels}}) == all(
        _holds(requirement, labels) for requirement in requirements
    )


@settings(max_examples=40)  # JSON documents are slow to draw; 40 cover the shapes
@given(strategies.json_documents(), strategies.json_documents())
def test_merge_patches_are_idempotent(target: dict[str, Any], patch: dict[str, Any]) -> None:
    once = patches.merge_patch(target, patch)
    assert patches.merge_patch(once, patch) == once
    assert patches.merge_patch(target, {}) == target


def _pointer(key: str) -> str:
    return "/" + key.replace("~", "~0").replace("/", "~1")


@settings(max_examples=40)  # JSON documents are slow to draw; 40 cover the shapes
@given(strategies.json_documents(), st.text(alphabet="ab~/", min_size=1, max_size=4))
def test_json_patch_add_then_remove_restores(document: dict[str, Any], key: str) -> None:
    ops = [
        {"op": "add", "path": _pointer(key), "value": [1]},
        {"op": "remove", "path": _pointer(key)},
    ]
    restored = patches.json_patch(document, ops)
    assert restored == {k: v for k, v in document.items() if k != key}


@settings(max_examples=40)  # JSON documents are slow to draw; 40 cover the shapes
@given(strategies.json_documents().filter(bool), st.data())
def test_json_patch_test_compares_the_current_value(
    document: dict[str, Any], data: st.DataObject
) -> None:
    key = data.draw(st.sampled_from(sorted(document)))
    assert (
        patches.json_patch(
            document, [{"op": "test", "path": _pointer(key), "value": document[key]}]
        )
        == document
    )
    with pytest.raises(patches.PatchError, match="test operation failed"):
        patches.json_patch(document, [{"op": "test", "path": _pointer(key), "value": ["other"]}])


_NAMES = st.lists(st.sampled_from("abcd"), unique=True, max_size=4)


@given(_NAMES, _NAMES)
def test_strategic_merge_joins_containers_by_name(existing: list[str], added: list[str]) -> None:
    target = {"spec": {"containers": [{"name": n, "image": "old", "tag": n} for n in existing]}}
    patch = {"spec": {"containers": [{"name": n, "image": "new"} for n in added]}}
    merged = patches.strategic_merge_patch(target, patch)["spec"]["containers"]
    assert [c["name"] for c in merged] == existing + [n for n in added if n not in existing]
    for container in merged:
        assert container["image"] == ("new" if container["name"] in added else "old")
        assert container.get("tag") == (
            container["name"] if container["name"] in existing else None
        )
