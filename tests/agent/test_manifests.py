"""Snapshot manifests as checked JSON (planaria.agent.state.manifests).

Covers: encode then decode gives the same manifest (hypothesis over layers, tensors and files);
the file is plain JSON with a body checksum; bad JSON (nested past json's recursion too), a
damaged body, an unknown format and each kind of bad field are ManifestError naming the field
path.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planaria.agent.state import manifests
from planaria.wire import messages

_COUNT = st.integers(min_value=0, max_value=2**40)
_TEXT = st.text(max_size=8)


@st.composite
def manifests_(draw: st.DrawFn) -> manifests.Manifest:
    def layer() -> manifests.LayerEntry:
        group = tuple(draw(st.lists(_COUNT, min_size=1, max_size=5)))
        tensors = draw(st.lists(_tensors(), max_size=4))
        files = draw(st.lists(_files(), max_size=3))
        return manifests.LayerEntry(
            layer=draw(_COUNT),
            names=tuple(draw(st.lists(_TEXT, max_size=3))),
            group=group,
            member=draw(st.integers(0, len(group) - 1)),
            total_bytes=draw(_COUNT),
            tensors=tuple(tensors),
            files=tuple(files),
            tolerated_losses=draw(st.integers(0, 1)),
        )

    return manifests.Manifest(
        job=draw(_TEXT),
        worker=draw(_COUNT),
        epoch=draw(_COUNT),
        step=draw(_COUNT),
        redundancy=draw(st.sampled_from(messages.RedundancyMode)),
        layers=tuple(layer() for _ in range(draw(st.integers(0, 3)))),
        note=draw(_TEXT),
    )


def _tensors() -> st.SearchStrategy[manifests.TensorLayout]:
    return st.builds(
        manifests.TensorLayout,
        role=st.sampled_from(manifests.Role),
        name=_TEXT,
        dtype=st.sampled_from(manifests.DTYPES),
        shape=st.lists(_COUNT, max_size=3).map(tuple),
        offset=_COUNT,
        nbytes=_COUNT,
    )


def _files() -> st.SearchStrategy[manifests.StoredFile]:
    return st.tuples(_COUNT, _COUNT).flatmap(
        lambda bounds: st.builds(
            manifests.StoredFile,
            kind=st.sampled_from(manifests.FileKind),
            file=st.from_regex(r"\Alayer-[0-9]{1,3}\.[a-z]{4,6}\Z"),
            member=_COUNT,
            start=st.just(min(bounds)),
            stop=st.just(max(bounds)),
            checksum=_TEXT,
        )
    )


@given(manifest=manifests_())
def test_a_manifest_survives_encoding(manifest: manifests.Manifest) -> None:
    assert manifests.decode(manifests.encode(manifest)) == manifest


def _document(manifest: manifests.Manifest) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(manifests.encode(manifest))
    return document


def _resealed(body: dict[str, Any]) -> bytes:
    """A body with a correct checksum, so only the schema check can object."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return json.dumps({"body": body, "checksum": f"crc32:{zlib.crc32(canonical):08x}"}).encode()


EXAMPLE = manifests.Manifest(
    job="job",
    worker=3,
    epoch=1,
    step=10,
    redundancy=messages.RedundancyMode.XOR,
    layers=(
        manifests.LayerEntry(
            layer=2,
            names=("w",),
            group=(1, 3),
            member=1,
            total_bytes=16,
            tensors=(
                manifests.TensorLayout(
                    role=manifests.Role.PARAMETERS,
                    name="w",
                    dtype="float32",
                    shape=(4,),
                    offset=0,
                    nbytes=16,
                ),
            ),
            files=(
                manifests.StoredFile(
                    kind=manifests.FileKind.SHARD,
                    file="layer-2.shard",
                    member=1,
                    start=8,
                    stop=16,
                    checksum="crc32:00000000",
                ),
            ),
            tolerated_losses=1,
        ),
    ),
)


def test_bad_json_and_a_damaged_body_are_refused() -> None:
    with pytest.raises(manifests.ManifestError, match="not valid JSON"):
        manifests.decode(b"{")
    damaged = manifests.encode(EXAMPLE).replace(b'"step":10', b'"step":11')
    with pytest.raises(manifests.ManifestError, match="checksum: does not match"):
        manifests.decode(damaged)
    with pytest.raises(manifests.ManifestError, match="nested too deeply"):
        manifests.decode(b"[" * 100_000)


def _set(body: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return body


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("version",), 2, "format/version"),
        (("redundancy",), "raid6", "manifest.redundancy: unknown mode"),
        (("step",), -1, "manifest.step: expected a whole number >= 0"),
        (("layers", 0, "member"), 2, r"layers\[0\].member: 2 is outside the group of 2"),
        (("layers", 0, "tensors", 0, "dtype"), "complex64", r"tensors\[0\].dtype"),
        (("layers", 0, "files", 0, "file"), "../escape", "must be a plain file name"),
        (("layers", 0, "files", 0, "stop"), 1, "stop 1 is before start 8"),
        (("layers", 0, "files", 0, "kind"), "mirror", r"files\[0\].kind: 'mirror'"),
        (("layers", 0, "group"), "1,3", r"layers\[0\].group: expected a list"),
    ],
    ids=[
        "a newer version",
        "an unknown redundancy mode",
        "a negative step",
        "a member outside its group",
        "an unsupported dtype",
        "a file name with a path",
        "a byte range that ends before it starts",
        "an unknown file kind",
        "a group that is not a list",
    ],
)
def test_a_bad_field_is_named(path: tuple[Any, ...], value: Any, message: str) -> None:
    body = _set(_document(EXAMPLE)["body"], path, value)
    with pytest.raises(manifests.ManifestError, match=message):
        manifests.decode(_resealed(body))
