"""Host staging of live layer state: the copy that frees the live tensors (REFT §4.1).

A snapshot reads the parameters and AdamW state that the next optimizer step overwrites, so
the training thread must not run that step while anything still reads them. Staging reduces
"anything" to one bulk copy per layer into a host buffer allocated once and reused: once the
copy is done the live tensors are free, and the checksums and store writes (slow: they run at
memory and tmpfs speed) read the staging buffer while training goes on.

Only the bytes this member writes are staged (its shard, and the copy or the parity's pieces:
the wanted ranges); the rest of the flattened state is never read by the writer and reads as
zeros here. The source views are built once and reused while the layer's tensors stay put:
parameters and AdamW state are updated in place, so their storage does not move between steps
(a cached view also keeps its tensor alive, so no other tensor can take its address). A layer
is prepared afresh when a tensor's address, dtype, shape or contiguity, or the wanted ranges,
change; a non-contiguous tensor is prepared afresh every time (its flat view is a copy).

Buffers outlive their staging: a staging gives its buffers back to its copier when it forgets
a layer (`keep_only`) or ends (`close`, when its writer closes at the end of an epoch), and the
copier hands a buffer of the same size to the next request (`buffer`), so a worker that keeps
one copier across epochs (the training thread does) allocates its staging once, not once per
epoch: on a GPU host pinned memory costs about a second per few GB to allocate, and the first
snapshot of every epoch paid it on the training thread. `trim` frees the buffers nobody took
(called once a snapshot's layers are prepared, so a re-plan that changed the layer sizes does
not keep the old ones).

The device abstraction (`Copier`, one per device kind; `copier_for`):

    CpuCopier   a plain `torch.cat` per layer into the staging buffer (one call that releases
                the GIL for the whole copy), run by the writer thread; the training thread's
                `release` waits until it is done.
    CudaCopier  pinned host buffers (allocated once, reused); the copies are enqueued by the
                training thread on a side stream that first waits on an event recorded on the
                compute stream right after the optimizer step, and end with a second event;
                `release` makes the compute stream wait on that event (the host does not
                block), and the writer thread synchronizes on it before reading the buffer.

Not thread-safe: the training thread prepares and launches, the writer thread completes, and
the writer never launches a snapshot while the previous one is being written.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from planaria.agent.state import manifests, parity, snapshots
from planaria.agent.training import model


class Ticket(Protocol):
    """One launched copy of several layers into their staging buffers."""

    # Whether `release` must wait on the host until `complete` ran (CPU: the copy runs there).
    host_waits: bool

    def complete(self) -> None:
        """Writer thread: return once every staged byte is in its host buffer."""

    def release(self) -> None:
        """Training thread, before the next optimizer step: order it after the copy."""


class Copier(Protocol):
    """Allocates staging buffers and copies live tensors into them, for one device kind."""

    def buffer(self, nbytes: int) -> torch.Tensor:
        """A host uint8 buffer of `nbytes`, kept for as long as the layer's layout holds (one
        given back earlier when it has that size)."""

    def recycle(self, buffer: torch.Tensor) -> None:
        """Take back a buffer nothing reads any more, for a later `buffer` of its size."""

    def trim(self) -> None:
        """Free the buffers given back and not taken again."""

    def launch(self, copies: Sequence[tuple[Sequence[torch.Tensor], torch.Tensor]]) -> Ticket:
        """Training thread, right after the optimizer step: copy each group of uint8 sources,
        back to back, into its buffer."""


class _CpuTicket:
    host_waits = True

    def __init__(self, copies: Sequence[tuple[Sequence[torch.Tensor], torch.Tensor]]) -> None:
        self._copies = copies

    def complete(self) -> None:
        for sources, buffer in self._copies:
            if sources:
                torch.cat(tuple(sources), out=buffer)

    def release(self) -> None:
        """Nothing to order on a CPU: the writer signals the end of the copy itself."""


class _Pooled:
    """The staging buffers both copiers allocate and take back, by size (thread-safe: the
    training thread takes them, the writer thread and the training thread give them back)."""

    pinned = False  # page-locked host memory (what a device's copy engine reads at full speed)

    def __init__(self) -> None:
        self._free: dict[int, list[torch.Tensor]] = {}
        self._lock = threading.Lock()

    def buffer(self, nbytes: int) -> torch.Tensor:
        with self._lock:
            free = self._free.get(nbytes)
            if free:
                return free.pop()
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pinned)

    def recycle(self, buffer: torch.Tensor) -> None:
        with self._lock:
            self._free.setdefault(buffer.numel(), []).append(buffer)

    def trim(self) -> None:
        with self._lock:
            self._free.clear()


class CpuCopier(_Pooled):
    """Preallocated pageable buffers, copied into by the writer thread."""

    def launch(self, copies: Sequence[tuple[Sequence[torch.Tensor], torch.Tensor]]) -> Ticket:
        return _CpuTicket(copies)


class _CudaTicket:
    host_waits = False

    def __init__(self, done: torch.cuda.Event) -> None:
        self._done = done

    def complete(self) -> None:
        self._done.synchronize()

    def release(self) -> None:
        torch.cuda.current_stream().wait_event(self._done)


class CudaCopier(_Pooled):
    """Pinned buffers and a side stream ordered by events (module docstring)."""

    pinned = True

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self._stream = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]

    def launch(self, copies: Sequence[tuple[Sequence[torch.Tensor], torch.Tensor]]) -> Ticket:
        stepped = torch.cuda.Event()  # type: ignore[no-untyped-call]
        stepped.record(torch.cuda.current_stream(self.device))  # after the optimizer step
        done = torch.cuda.Event()  # type: ignore[no-untyped-call]
        with torch.cuda.stream(self._stream):
            self._stream.wait_event(stepped)
            for sources, buffer in copies:
                position = 0
                for source in sources:
                    end = position + source.numel()
                    buffer[position:end].copy_(source, non_blocking=True)
                    position = end
            done.record(self._stream)
        return _CudaTicket(done)


def copier_for(device: torch.device) -> Copier:
    """The copier for tensors on `device` (CUDA: pinned buffers and a side stream)."""
    if device.type == "cuda":
        return CudaCopier(device)
    return CpuCopier()


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """A layer's layout, the uint8 views its wanted ranges are copied from, the staging buffer
    and the flattened bytes the writer reads (the buffer in the wanted ranges)."""

    key: object
    names: tuple[str, ...]
    ranges: tuple[range, ...]
    layout: tuple[manifests.TensorLayout, ...]
    sources: tuple[torch.Tensor, ...]
    buffer: torch.Tensor
    staged: parity.FlatBytes

    @property
    def copy(self) -> tuple[Sequence[torch.Tensor], torch.Tensor]:
        return self.sources, self.buffer


class Staging:
    """Per-layer staging buffers of one writer, on one device's copier."""

    def __init__(self, copier: Copier | None = None) -> None:
        self.copier: Copier = copier if copier is not None else CpuCopier()
        self._layers: dict[int, Prepared] = {}

    def prepare(self, state: model.LayerState, ranges: Sequence[range]) -> Prepared:
        """The (cached) copy plan of bytes `ranges` of `state`'s flattened bytes."""
        key, wanted = _identity(state), merge(ranges)
        prepared = self._layers.get(state.index)
        if key is None or prepared is None or prepared.key != key or prepared.ranges != wanted:
            old = None if prepared is None else prepared.buffer
            prepared = self._layers[state.index] = _prepare(state, key, wanted, self, old)
            if old is not None and prepared.buffer is not old:
                self.copier.recycle(old)
        return prepared

    def stage(
        self, state: model.LayerState, ranges: Sequence[range]
    ) -> tuple[tuple[manifests.TensorLayout, ...], parity.FlatBytes]:
        """Prepare, copy and wait, in one call: the layout and the flattened bytes in which
        `ranges` read from the staged copy."""
        prepared = self.prepare(state, ranges)
        self.copier.launch([prepared.copy]).complete()
        return prepared.layout, prepared.staged

    def keep_only(self, layers: set[int]) -> None:
        """Forget layers no longer snapshotted, so their tensors can be freed and their buffers
        serve another layer (given back to the copier)."""
        for index in set(self._layers) - layers:
            self.copier.recycle(self._layers.pop(index).buffer)

    def close(self) -> None:
        """Forget every layer and give every buffer back to the copier (nothing reads them any
        more: the writer has finished)."""
        self.keep_only(set())


def staged_bytes(ranges: Sequence[range]) -> int:
    """The size of the staging buffer of `ranges`: the bytes they cover."""
    return sum(len(r) for r in merge(ranges))


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
    if not all(t.is_contiguous() for t in tensors):
        return None
    return (state.names, tuple((t.device, t.data_ptr(), t.dtype, t.shape) for t in tensors))


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes as a flat uint8 tensor on its device (a view when contiguous)."""
    if tensor.numel() == 0:
        return torch.empty(0, dtype=torch.uint8, device=tensor.device)
    return tensor.detach().reshape(-1).view(torch.uint8)


def _prepare(
    state: model.LayerState,
    key: object,
    wanted: tuple[range, ...],
    owner: Staging,
    old: torch.Tensor | None,
) -> Prepared:
    """Plan the copy of the wanted ranges, back to back, into the buffer (reusing `old` when
    it has the size); outside them the flattened bytes read as zeros (never read)."""
    flats = [_flat(t) for t in state.tensors()]
    starts = np.cumsum([0] + [f.numel() for f in flats])
    sources: list[torch.Tensor] = []
    for r in wanted:
        first = int(np.searchsorted(starts, r.start, side="right")) - 1
        for index in range(first, len(flats)):
            base = int(starts[index])
            if base >= r.stop:
                break
            low, high = max(r.start - base, 0), min(r.stop - base, flats[index].numel())
            if high > low:
                sources.append(flats[index][low:high])
    size = staged_bytes(wanted)
    buffer = old if old is not None and old.numel() == size else owner.copier.buffer(size)
    return Prepared(
        key=key,
        names=state.names,
        ranges=wanted,
        layout=snapshots.tensor_layout(state),
        sources=tuple(sources),
        buffer=buffer,
        staged=parity.FlatBytes(_segments(wanted, int(starts[-1]), buffer.numpy())),
    )


def _segments(wanted: tuple[range, ...], total: int, staged: parity.Bytes) -> list[parity.Bytes]:
    """The flattened bytes: the staged runs in the wanted ranges, zeros (no memory) between."""
    segments: list[parity.Bytes] = []
    cursor = position = 0
    for r in wanted:
        segments.append(zeros(r.start - cursor))
        segments.append(staged[position : position + len(r)])
        position += len(r)
        cursor = r.stop
    segments.append(zeros(total - cursor))
    return segments


def zeros(n: int) -> parity.Bytes:
    """`n` zero bytes that take no memory (read-only): the bytes a writer never reads."""
    zeros: parity.Bytes = np.broadcast_to(np.zeros(1, dtype=np.uint8), (n,))
    return zeros
