"""Host staging of live layer state for the snapshot writer: one bulk copy per layer.

The writer runs on a background thread of the training process, so every Python operation it
performs holds the GIL against the training thread; per-tensor work (a view, a checksum call, a
write call for each of hundreds of small tensors) measurably slows training. Staging replaces
it with one `torch.cat` per layer (a single call that releases the GIL for the whole copy) of
the small tensors' parts of the byte ranges this member writes (its shard, and the copy or the
parity's pieces) into a preallocated host buffer, so checksums and writes see a few large
buffers: consecutive small pieces become one run of the buffer, and pieces of large tensors
are read in place (copying them would only add a memory pass).

The views that feed the copy are built once and reused while the layer's tensors stay put:
parameters and AdamW state are updated in place, so their storage does not move between
steps (a cached view also keeps its tensor alive, so no other tensor can take its address).
A layer is prepared afresh when a tensor's address, dtype or shape, or the wanted ranges,
change. Tensors that are not contiguous CPU tensors (e.g. on a GPU) are copied to the host on
every snapshot instead and nothing is cached for them.

Not thread-safe: the one writer thread uses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from planaria.agent.state import manifests, parity, snapshots
from planaria.agent.training import model

# Pieces of tensors smaller than this are gathered into the staging buffer; larger ones are
# written straight from the tensor (one write and one checksum call each is cheap for them).
STAGE_BELOW_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class _Prepared:
    """A layer's layout, the views its wanted ranges are gathered from, the staging buffer,
    and the flattened bytes to read from (staged in the wanted ranges, live elsewhere)."""

    key: object
    ranges: tuple[range, ...]
    layout: tuple[manifests.TensorLayout, ...]
    gather: tuple[torch.Tensor, ...]
    buffer: torch.Tensor
    staged: parity.FlatBytes

    def refresh(self) -> None:
        if self.gather:
            torch.cat(self.gather, out=self.buffer)


class Staging:
    """Per-layer staging buffers of one writer."""

    def __init__(self) -> None:
        self._layers: dict[int, _Prepared] = {}

    def stage(
        self, state: model.LayerState, ranges: Sequence[range]
    ) -> tuple[tuple[manifests.TensorLayout, ...], parity.FlatBytes]:
        """Copy bytes `ranges` of `state`'s flattened bytes to the host buffer; returns the
        layout and flattened bytes in which those ranges read from the copy."""
        key, wanted = _identity(state), merge(ranges)
        if key is None:  # fresh host copies already; nothing to cache
            return snapshots.tensor_layout(state), snapshots.flat_bytes(state)
        prepared = self._layers.get(state.index)
        if prepared is None or prepared.key != key or prepared.ranges != wanted:
            prepared = self._layers[state.index] = _prepare(state, key, wanted)
        prepared.refresh()
        return prepared.layout, prepared.staged

    def keep_only(self, layers: set[int]) -> None:
        """Forget layers no longer snapshotted, so their tensors and buffers can be freed."""
        for index in set(self._layers) - layers:
            del self._layers[index]


def merge(ranges: Sequence[range]) -> tuple[range, ...]:
    """Sorted, non-empty, non-overlapping ranges covering the same bytes."""
    merged: list[range] = []
    for r in sorted((r for r in ranges if len(r)), key=lambda r: r.start):
        if merged and r.start <= merged[-1].stop:
            merged[-1] = range(merged[-1].start, max(merged[-1].stop, r.stop))
        else:
            merged.append(r)
    return tuple(merged)


def _identity(state: model.LayerState) -> object | None:
    """What must not change for cached views to stay valid; None when caching is unsafe."""
    tensors = state.tensors()
    if not all(t.device.type == "cpu" and t.is_contiguous() for t in tensors):
        return None
    return (state.names, tuple((t.data_ptr(), t.dtype, t.shape) for t in tensors))


def _prepare(state: model.LayerState, key: object, wanted: tuple[range, ...]) -> _Prepared:
    """Plan the copy: runs of small pieces of the wanted ranges go to consecutive places in the
    buffer (one segment each), large pieces are read in place (copying them would only add
    a memory pass); everything outside the wanted ranges reads the live bytes."""
    live = snapshots.flat_bytes(state)  # zero-copy views of the contiguous CPU tensors
    small: list[parity.Bytes] = []
    plan: list[parity.Bytes | int] = []  # a live view, or the byte count of a staged run
    cursor = 0
    for r in wanted:
        plan.extend(live.views(cursor, r.start))
        for view in live.views(r.start, r.stop):
            if view.size >= STAGE_BELOW_BYTES:
                plan.append(view)
            elif plan and isinstance(plan[-1], int):
                plan[-1] += view.size
                small.append(view)
            else:
                plan.append(view.size)
                small.append(view)
        cursor = r.stop
    plan.extend(live.views(cursor, live.nbytes))
    buffer = torch.empty(sum(v.size for v in small), dtype=torch.uint8)
    return _Prepared(
        key=key,
        ranges=wanted,
        layout=snapshots.tensor_layout(state),
        gather=tuple(torch.from_numpy(v) for v in small),
        buffer=buffer,
        staged=parity.FlatBytes(_segments(plan, buffer.numpy())),
    )


def _segments(plan: list[parity.Bytes | int], staged: parity.Bytes) -> list[parity.Bytes]:
    segments, position = [], 0
    for item in plan:
        if isinstance(item, int):
            segments.append(staged[position : position + item])
            position += item
        else:
            segments.append(item)
    return segments
