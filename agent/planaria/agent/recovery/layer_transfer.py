"""Peer-to-peer layer copies between the workers of a new epoch (Oobleck §6.2, Odyssey §IV-B).

A `plan.LayerTransfer` names a layer a worker of the new plan lacks and the live workers that
send it. The layer's `model.LayerState` is flattened to bytes exactly as snapshots do
(`snapshots.flat_bytes`: every tensor of `LayerState.tensors()` in order, raw bytes, laid out
by `snapshots.tensor_layout`); the contract's "elements" are these bytes. Source i of k sends
bytes `LayerTransfer.shard(source, n)` = [i*n//k, (i+1)*n//k), so the destination receives
exactly the n bytes of the state, once, spread over every listed source.

The destination does not know the state's layout from the wire: the caller gives it a template
of each layer it receives (`model.initial_state`: the layer as built, with a fresh AdamW),
whose flattened layout is the same as any trained state of that layer; it receives the bytes
into one buffer and copies them over the template's tensors. The round trip is bit-exact
(tests prove it).

All sends and receives of the epoch are posted at once (`isend`/`irecv` on the new epoch's
world group) and then awaited, each wait bounded by the epoch's timeout: a peer that dies
mid-transfer makes the wait fail (TransferError), never hang. Tags are `TAG_BASE + layer`:
between one source and one destination a layer travels at most once, so (source rank,
destination rank, tag) names exactly one (layer, destination, source index) message, and tags
stay far above the schedule's (which count messages per pair from 0).

Errors: TransferError (a peer lost or too slow during the copies).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from planaria.agent.execution import groups
from planaria.agent.state import snapshots
from planaria.agent.training import model
from planaria.contract import plan

TAG_BASE = 1 << 20  # far above the schedule's tags, which count messages per worker pair


class TransferError(Exception):
    """A layer copy failed: a peer died, left the epoch or outlived the epoch's timeout."""

    def __init__(self, message: str, *, peer: plan.WorkerId | None) -> None:
        super().__init__(message)
        self.peer = peer


@dataclass(slots=True, kw_only=True)
class TransferReport:
    """What one worker's copies moved: the layers received, bytes each way, seconds spent."""

    received: dict[int, model.LayerState] = field(default_factory=dict)
    received_bytes: int = 0
    sent_bytes: int = 0
    seconds: float = 0.0


def flatten(state: model.LayerState) -> torch.Tensor:
    """The state's flattened bytes as one uint8 CPU tensor (`snapshots.flat_bytes` order)."""
    flat = snapshots.flat_bytes(state)
    return torch.from_numpy(flat.copy(0, flat.nbytes))


def fill(template: model.LayerState, data: torch.Tensor) -> model.LayerState:
    """`template` with its tensors overwritten by the flattened bytes `data` (in place)."""
    flat = snapshots.flat_bytes(template)
    if data.numel() != flat.nbytes:
        raise TransferError(
            f"layer {template.index}: received {data.numel()} bytes, the layer has {flat.nbytes}",
            peer=None,
        )
    source, position = data.numpy(), 0
    for view in flat.views(0, flat.nbytes):
        np.copyto(view, source[position : position + view.size])
        position += view.size
    return template


def run_transfers(
    *,
    worker: plan.WorkerId,
    transfers: Iterable[plan.LayerTransfer],
    sources: Mapping[int, model.LayerState],
    templates: Mapping[int, model.LayerState],
    epoch: groups.Epoch,
    ranks: Mapping[plan.WorkerId, int],
) -> TransferReport:
    """Post every send (from `sources`, this worker's states of the layers it sends) and
    every receive (into `templates`, by layer) of `worker`'s transfers, then await them all.

    Raises TransferError when a peer fails; the caller latches it and leaves the epoch.
    """
    started = time.perf_counter()
    report = TransferReport()
    pending: list[tuple[dist.Work, plan.WorkerId, torch.Tensor]] = []
    buffers: dict[int, torch.Tensor] = {}
    for transfer in transfers:
        if transfer.destination == worker:
            buffer = torch.empty(templates[transfer.layer].nbytes, dtype=torch.uint8)
            buffers[transfer.layer] = buffer
            report.received_bytes += _post_receives(transfer, buffer, ranks, pending)
        else:
            flat = flatten(sources[transfer.layer])
            report.sent_bytes += _post_send(worker, transfer, flat, ranks, pending)
    for work, peer, _ in pending:
        _wait(work, peer, epoch)
    for layer, buffer in buffers.items():
        report.received[layer] = fill(templates[layer], buffer)
    report.seconds = time.perf_counter() - started
    return report


def _post_receives(
    transfer: plan.LayerTransfer,
    buffer: torch.Tensor,
    ranks: Mapping[plan.WorkerId, int],
    pending: list[tuple[dist.Work, plan.WorkerId, torch.Tensor]],
) -> int:
    n = buffer.numel()
    for source in transfer.sources:
        span = transfer.shard(source, n)
        if not span:
            continue
        piece = buffer[span.start : span.stop]
        work = _post(
            source, functools.partial(dist.irecv, piece, ranks[source], tag=_tag(transfer))
        )
        pending.append((work, source, piece))
    return n


def _post_send(
    worker: plan.WorkerId,
    transfer: plan.LayerTransfer,
    flat: torch.Tensor,
    ranks: Mapping[plan.WorkerId, int],
    pending: list[tuple[dist.Work, plan.WorkerId, torch.Tensor]],
) -> int:
    span = transfer.shard(worker, flat.numel())
    if not span:
        return 0
    piece = flat[span.start : span.stop].contiguous()
    destination = transfer.destination
    work = _post(destination, lambda: dist.isend(piece, ranks[destination], tag=_tag(transfer)))
    pending.append((work, destination, piece))  # the piece must live until sent
    return len(span)


def _tag(transfer: plan.LayerTransfer) -> int:
    return TAG_BASE + transfer.layer


def _post(peer: plan.WorkerId, post: Callable[[], dist.Work | None]) -> dist.Work:
    try:
        work = post()
    except RuntimeError as exc:
        message = f"posting a copy to or from worker {peer} failed: {exc}"
        raise TransferError(message, peer=peer) from exc
    assert work is not None, "every rank of the epoch is in its world group"
    return work


def _wait(work: dist.Work, peer: plan.WorkerId, epoch: groups.Epoch) -> None:
    try:
        work.wait(epoch.timeout)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise TransferError(
            f"layer copy with worker {peer} failed in epoch {epoch.number}: {first}", peer=peer
        ) from exc
