"""Snapshot manifests: what a complete snapshot holds, as checked JSON (no pickle).

A manifest names, for one worker and one step, every layer the worker snapshotted: the layer's
sharding group (worker ids in member order) and this worker's member index, the layout of the
flattened state (each tensor's role, dtype, shape and byte range), and the files written for it
(this member's shard, a peer's shard copy or a parity) with the byte range each covers and its
checksum. Host-memory snapshots and persistent checkpoints share this format.

On disk the manifest is `{"body": {...}, "checksum": "crc32:..."}` on one line, the body in
canonical JSON (sorted keys, no spaces) and the checksum taken over it, so a flipped bit
anywhere is caught.

`decode` trusts nothing: every field is type- and range-checked and a failure raises
ManifestError naming the field path. Nothing here does I/O.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from planaria.wire import messages

FORMAT = "planaria-snapshot"
VERSION = 1
# The dtypes a flattened state may hold; a manifest naming another one is rejected.
DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int8", "uint8", "bool")


class ManifestError(Exception):
    """A manifest that is not valid JSON or breaks the schema; the message names the field."""


class FileKind(StrEnum):
    """What a snapshot file holds."""

    SHARD = "shard"  # this member's own shard
    COPY = "copy"  # a peer's shard (COPY; RECOMPUTE with recomputed optimizer moments)
    PARITY = "parity"  # this member's XOR parity (XOR)


class Role(StrEnum):
    """Which group of a LayerState a tensor belongs to (LayerState.tensors() order)."""

    PARAMETERS = "parameters"
    EXP_AVG = "exp_avg"
    EXP_AVG_SQ = "exp_avg_sq"
    STEPS = "steps"


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorLayout:
    """Tensor `name` of `role` occupies bytes [offset, offset + nbytes) of the flat state."""

    role: Role
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredFile:
    """File `file` of kind `kind`: bytes [start, stop) of member `member`'s shard of the flat
    state (SHARD, COPY), or member `member`'s parity, then [0, parity length)."""

    kind: FileKind
    file: str
    member: int
    start: int
    stop: int
    checksum: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerEntry:
    """One layer in one worker's snapshot. `tolerated_losses` is how many members of the
    group may be lost with the layer still rebuildable (0 without redundancy or peers)."""

    layer: int
    names: tuple[str, ...]
    group: tuple[int, ...]
    member: int
    total_bytes: int
    tensors: tuple[TensorLayout, ...]
    files: tuple[StoredFile, ...]
    tolerated_losses: int

    def file(self, kind: FileKind) -> StoredFile | None:
        return next((f for f in self.files if f.kind is kind), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Manifest:
    """A complete snapshot of worker `worker` after `step` committed optimizer steps."""

    job: str
    worker: int
    epoch: int
    step: int
    redundancy: messages.RedundancyMode
    layers: tuple[LayerEntry, ...]
    note: str = ""

    def layer(self, layer: int) -> LayerEntry:
        for entry in self.layers:
            if entry.layer == layer:
                return entry
        raise KeyError(f"worker {self.worker}'s snapshot of step {self.step} has no layer {layer}")

    def file_names(self) -> tuple[str, ...]:
        return tuple(f.file for entry in self.layers for f in entry.files)

    @property
    def held_bytes(self) -> int:
        return sum(f.stop - f.start for entry in self.layers for f in entry.files)


# --- encoding -------------------------------------------------------------------------------


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _body_checksum(body: dict[str, Any]) -> str:
    return f"crc32:{zlib.crc32(_canonical(body)):08x}"


def encode(manifest: Manifest) -> bytes:
    """The manifest as JSON bytes with the checksum of its body."""
    body = {
        "format": FORMAT,
        "version": VERSION,
        "job": manifest.job,
        "worker": manifest.worker,
        "epoch": manifest.epoch,
        "step": manifest.step,
        "redundancy": manifest.redundancy.value,
        "note": manifest.note,
        "layers": [_encode_layer(entry) for entry in manifest.layers],
    }
    # The body is written in its canonical form, so its checksum is computed once; compact
    # JSON also keeps json's C encoder (indentation would fall back to the slow Python one).
    canonical = _canonical(body)
    checksum = f"crc32:{zlib.crc32(canonical):08x}"
    return b'{"body":' + canonical + b',"checksum":"' + checksum.encode() + b'"}\n'


def _encode_layer(entry: LayerEntry) -> dict[str, Any]:
    return {
        "layer": entry.layer,
        "names": list(entry.names),
        "group": list(entry.group),
        "member": entry.member,
        "total_bytes": entry.total_bytes,
        "tolerated_losses": entry.tolerated_losses,
        "tensors": [
            {
                "role": t.role.value,
                "name": t.name,
                "dtype": t.dtype,
                "shape": list(t.shape),
                "offset": t.offset,
                "nbytes": t.nbytes,
            }
            for t in entry.tensors
        ],
        "files": [
            {
                "kind": f.kind.value,
                "file": f.file,
                "member": f.member,
                "start": f.start,
                "stop": f.stop,
                "checksum": f.checksum,
            }
            for f in entry.files
        ],
    }


# --- decoding -------------------------------------------------------------------------------


def decode(raw: bytes) -> Manifest:
    """Parse and check a manifest; ManifestError names the first bad field."""
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"not valid JSON ({exc})") from exc
    except RecursionError as exc:
        # json parses nested arrays recursively; a manifest is never deeper than four levels,
        # and readers (the heartbeat's store state among them) must see a bad slot, not a crash.
        raise ManifestError("not a manifest: JSON nested too deeply") from exc
    if not isinstance(document, dict) or not isinstance(document.get("body"), dict):
        raise ManifestError("body: missing; expected {'body': {...}, 'checksum': ...}")
    body = document["body"]
    if document.get("checksum") != _body_checksum(body):
        raise ManifestError("checksum: does not match the body (the manifest was damaged)")
    if body.get("format") != FORMAT or body.get("version") != VERSION:
        raise ManifestError(f"format/version: expected {FORMAT!r} version {VERSION}")
    return _decode_body(body)


def _decode_body(body: dict[str, Any]) -> Manifest:
    redundancy = _text(body, "redundancy", "manifest")
    if redundancy not in {m.value for m in messages.RedundancyMode}:
        raise ManifestError(f"manifest.redundancy: unknown mode {redundancy!r}")
    layers = _list(body, "layers", "manifest")
    return Manifest(
        job=_text(body, "job", "manifest"),
        worker=_count(body, "worker", "manifest"),
        epoch=_count(body, "epoch", "manifest"),
        step=_count(body, "step", "manifest"),
        redundancy=messages.RedundancyMode(redundancy),
        note=_text(body, "note", "manifest"),
        layers=tuple(_decode_layer(item, f"layers[{i}]") for i, item in enumerate(layers)),
    )


def _decode_layer(item: Any, path: str) -> LayerEntry:
    obj = _object(item, path)
    group = tuple(_count_item(v, f"{path}.group") for v in _list(obj, "group", path))
    member = _count(obj, "member", path)
    if not 0 <= member < len(group):
        raise ManifestError(f"{path}.member: {member} is outside the group of {len(group)}")
    tensors = _list(obj, "tensors", path)
    files = _list(obj, "files", path)
    return LayerEntry(
        layer=_count(obj, "layer", path),
        names=tuple(_text_item(v, f"{path}.names") for v in _list(obj, "names", path)),
        group=group,
        member=member,
        total_bytes=_count(obj, "total_bytes", path),
        tolerated_losses=_count(obj, "tolerated_losses", path),
        tensors=tuple(_decode_tensor(t, f"{path}.tensors[{i}]") for i, t in enumerate(tensors)),
        files=tuple(_decode_file(f, f"{path}.files[{i}]") for i, f in enumerate(files)),
    )


def _decode_tensor(item: Any, path: str) -> TensorLayout:
    obj = _object(item, path)
    dtype = _text(obj, "dtype", path)
    if dtype not in DTYPES:
        raise ManifestError(f"{path}.dtype: {dtype!r} is not one of {DTYPES}")
    return TensorLayout(
        role=Role(_choice(obj, "role", path, [r.value for r in Role])),
        name=_text(obj, "name", path),
        dtype=dtype,
        shape=tuple(_count_item(v, f"{path}.shape") for v in _list(obj, "shape", path)),
        offset=_count(obj, "offset", path),
        nbytes=_count(obj, "nbytes", path),
    )


def _decode_file(item: Any, path: str) -> StoredFile:
    obj = _object(item, path)
    name = _text(obj, "file", path)
    if "/" in name or name.startswith("."):
        raise ManifestError(f"{path}.file: {name!r} must be a plain file name")
    start, stop = _count(obj, "start", path), _count(obj, "stop", path)
    if stop < start:
        raise ManifestError(f"{path}: stop {stop} is before start {start}")
    return StoredFile(
        kind=FileKind(_choice(obj, "kind", path, [k.value for k in FileKind])),
        file=name,
        member=_count(obj, "member", path),
        start=start,
        stop=stop,
        checksum=_text(obj, "checksum", path),
    )


def _object(item: Any, path: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise ManifestError(f"{path}: expected an object")
    return item


def _list(obj: dict[str, Any], key: str, path: str) -> list[Any]:
    value = obj.get(key)
    if not isinstance(value, list):
        raise ManifestError(f"{path}.{key}: expected a list")
    return value


def _count(obj: dict[str, Any], key: str, path: str) -> int:
    return _count_item(obj.get(key), f"{path}.{key}")


def _count_item(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ManifestError(f"{path}: expected a whole number >= 0, got {value!r}")
    return value


def _text(obj: dict[str, Any], key: str, path: str) -> str:
    return _text_item(obj.get(key), f"{path}.{key}")


def _text_item(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise ManifestError(f"{path}: expected a string, got {value!r}")
    return value


def _choice(obj: dict[str, Any], key: str, path: str, allowed: list[str]) -> str:
    value = _text(obj, key, path)
    if value not in allowed:
        raise ManifestError(f"{path}.{key}: {value!r} is not one of {allowed}")
    return value
