"""Host-memory snapshots of layer state, sharded over sharding groups (REFT §4.1-4.3).

The sharding group of a layer is the set of workers holding it: its data-parallel replicas,
one per pipeline (`sharding_groups`), in worker-id order; a worker's position is its member
index k of m. A layer's `LayerState` is flattened (every tensor of `LayerState.tensors()` in
order, as raw bytes) and member k stores shard k (`parity.shard_range`) plus, by redundancy
mode (`messages.RedundancyMode`):

    NONE       nothing more; the layer survives no lost member
    COPY       a copy of shard (k+1) mod m (REFT ARC)
    XOR        an XOR parity of ~N/(m(m-1)) bytes (REFT AEC; layout in `parity`)
    RECOMPUTE  a copy of shard (k+1) mod m whose optimizer moments come from a host-side
               replica updated with AdamW's moment math from gradients (REFT AOR, eq. 4;
               `recompute`)

Every member holds the whole layer, so all of this is computed locally: redundancy needs no
communication. Each member's files are also kept by a mirror on another node (`mirroring`,
`planaria.contract.snapshot_placement`); the loader takes either copy of a member. COPY, XOR
and RECOMPUTE survive one lost member per group when m >= 2; with m = 1 the group alone cannot
protect the layer, and the manifest says so (`tolerated_losses` 0).

This module holds the layout (flatten, unflatten, groups) and the loader: `rebuild_layer`
turns the members' snapshots of a layer (read from the survivors' stores, `read_member`) back
into a LayerState bit-identical to the one snapshotted, using a copy or the parities when one
member is missing. The writer is `snapshot_writer`, the files `snapshot_store`.

Errors are `snapshot_store`'s tree: SnapshotMissing when too many members are lost or a
snapshot is absent, SnapshotCorrupt when members disagree or a file is damaged.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from planaria.agent.state import manifests, parity, snapshot_store
from planaria.agent.training import model
from planaria.contract import plan as plans
from planaria.wire import messages

LOG = logging.getLogger(__name__)

ROLES = (
    manifests.Role.PARAMETERS,
    manifests.Role.EXP_AVG,
    manifests.Role.EXP_AVG_SQ,
    manifests.Role.STEPS,
)
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


# --- groups ---------------------------------------------------------------------------------


def sharding_groups(plan: plans.Plan) -> dict[int, tuple[plans.WorkerId, ...]]:
    """Layer -> the workers holding it in `plan`, in worker-id order (member k = k-th).

    Raises SnapshotConfigError for a stage of several workers: a tensor-parallel worker holds
    part of a layer, and snapshots assume every member holds all of it.
    """
    groups: dict[int, list[plans.WorkerId]] = {}
    for pipeline in plan.pipelines:
        for stage in pipeline.stages:
            if len(stage.workers) > 1:
                raise snapshot_store.SnapshotConfigError(
                    f"stage of layers [{stage.layer_start}, {stage.layer_stop}) has workers "
                    f"{stage.workers}; snapshots need one worker per stage"
                )
            for layer in stage.layers:
                groups.setdefault(layer, []).extend(stage.workers)
    return {layer: tuple(sorted(workers)) for layer, workers in sorted(groups.items())}


def tolerated_losses(redundancy: messages.RedundancyMode, group_size: int) -> int:
    """Members of a group that may be lost with the layer still rebuildable (0 or 1)."""
    protected = redundancy is not messages.RedundancyMode.NONE and group_size >= 2
    return 1 if protected else 0


# --- layout ---------------------------------------------------------------------------------


def live_layer_state(
    index: int, layer: nn.Module, optimizer: torch.optim.Optimizer
) -> model.LayerState:
    """Layer `index`'s parameters and AdamW state as references, not copies.

    Valid only while nothing changes them: between one optimizer step and the next, which is
    exactly when a snapshot is taken (see `snapshot_writer`). Before the first step there is
    no optimizer state; zeros and step 0 stand for it, as in `model.extract_layer_state`.
    """
    names, params = zip(*layer.named_parameters(), strict=True)
    moments = [_live_moments(optimizer, p) for p in params]
    return model.LayerState(
        index=index,
        names=tuple(names),
        parameters=tuple(p.detach() for p in params),
        exp_avg=tuple(m[0] for m in moments),
        exp_avg_sq=tuple(m[1] for m in moments),
        steps=tuple(m[2] for m in moments),
    )


def _live_moments(
    optimizer: torch.optim.Optimizer, p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    state = optimizer.state.get(p)
    if not state:
        zeros = torch.zeros_like(p).detach()
        return zeros, zeros.clone(), torch.tensor(0.0, dtype=torch.float32)
    return state["exp_avg"], state["exp_avg_sq"], state["step"]


def tensor_layout(state: model.LayerState) -> tuple[manifests.TensorLayout, ...]:
    """Where each tensor of `state` sits in the flattened bytes (LayerState.tensors() order)."""
    groups = (state.parameters, state.exp_avg, state.exp_avg_sq, state.steps)
    layout, offset = [], 0
    for role, tensors in zip(ROLES, groups, strict=True):
        for name, tensor in zip(state.names, tensors, strict=True):
            nbytes = tensor.numel() * tensor.element_size()
            layout.append(
                manifests.TensorLayout(
                    role=role,
                    name=name,
                    dtype=_dtype_name(tensor.dtype),
                    shape=tuple(tensor.shape),
                    offset=offset,
                    nbytes=nbytes,
                )
            )
            offset += nbytes
    return tuple(layout)


def _dtype_name(dtype: torch.dtype) -> str:
    if dtype not in _DTYPE_NAMES:
        raise snapshot_store.SnapshotConfigError(
            f"tensors of dtype {dtype} cannot be snapshotted; use one of {sorted(DTYPES)}"
        )
    return _DTYPE_NAMES[dtype]


def host_bytes(tensor: torch.Tensor) -> parity.Bytes:
    """A tensor's bytes as a uint8 numpy array: a view for contiguous CPU tensors, otherwise
    one device-to-host (or compacting) copy."""
    if tensor.numel() == 0:  # may carry any strides (from numpy: 0), which view() refuses
        return np.empty(0, dtype=np.uint8)
    flat = tensor.detach().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    array: parity.Bytes = flat.contiguous().view(torch.uint8).numpy()
    return array


def flat_bytes(state: model.LayerState) -> parity.FlatBytes:
    """The flattened state as zero-copy segments (one per tensor)."""
    return parity.FlatBytes([host_bytes(t) for t in state.tensors()])


def unflatten(entry: manifests.LayerEntry, data: parity.Bytes) -> model.LayerState:
    """Rebuild the LayerState whose flattened bytes are `data` (laid out as `entry` says). Its
    tensors are views of `data` where their offsets are aligned for their dtype (the caller
    hands over a buffer of its own, writable, that nothing else changes), copies otherwise:
    restoring a layer copied its bytes three times before (read, join, split), now once."""
    _check_layout(entry, data.size)
    source = torch.from_numpy(data)
    tensors = [_tensor_at(layout, source) for layout in entry.tensors]
    n = len(entry.names)
    return model.LayerState(
        index=entry.layer,
        names=entry.names,
        parameters=tuple(tensors[:n]),
        exp_avg=tuple(tensors[n : 2 * n]),
        exp_avg_sq=tuple(tensors[2 * n : 3 * n]),
        steps=tuple(tensors[3 * n :]),
    )


def _tensor_at(layout: manifests.TensorLayout, source: torch.Tensor) -> torch.Tensor:
    dtype = DTYPES[layout.dtype]
    piece = source[layout.offset : layout.offset + layout.nbytes]
    itemsize = dtype.itemsize
    aligned = piece.data_ptr() % itemsize == 0 and piece.storage_offset() % itemsize == 0
    if layout.nbytes and aligned:  # torch views a dtype only at a multiple of its size
        return piece.view(dtype).reshape(layout.shape)
    out = torch.empty(layout.shape, dtype=dtype)
    out.reshape(-1).view(torch.uint8).copy_(piece)
    return out


def _check_layout(entry: manifests.LayerEntry, size: int) -> None:
    """Tensors tile the flat bytes in role order, each exactly as long as its shape says."""
    roles = [t.role for t in entry.tensors]
    expected_roles = [role for role in ROLES for _ in entry.names]
    offset = 0
    for t in entry.tensors:
        itemsize = torch.empty((), dtype=DTYPES[t.dtype]).element_size()
        if t.offset != offset or t.nbytes != math.prod(t.shape) * itemsize:
            raise snapshot_store.SnapshotCorrupt(
                f"layer {entry.layer}: tensor {t.role}/{t.name} does not fit the layout"
            )
        offset += t.nbytes
    if roles != expected_roles or offset != entry.total_bytes or size != entry.total_bytes:
        raise snapshot_store.SnapshotCorrupt(
            f"layer {entry.layer}: layout covers {offset} bytes, state has {size}, manifest "
            f"says {entry.total_bytes}"
        )


# --- loading --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberSnapshot:
    """One member's verified files of one layer: its shard and its redundancy (a peer's shard
    or its parity; None without redundancy). Plain data, so it can travel between workers."""

    step: int
    redundancy: messages.RedundancyMode
    entry: manifests.LayerEntry
    shard: parity.Bytes
    redundant: parity.Bytes | None


def read_member(store: snapshot_store.SnapshotStore, step: int, layer: int) -> MemberSnapshot:
    """This worker's snapshot of `layer` at `step` from its own store (e.g. after an agent
    restart). SnapshotMissing or SnapshotCorrupt when it cannot be served."""
    with store.open_snapshot(step) as snapshot:
        try:
            entry = snapshot.manifest.layer(layer)
        except KeyError as exc:
            raise snapshot_store.SnapshotMissing(str(exc)) from exc
        shard = entry.file(manifests.FileKind.SHARD)
        if shard is None:
            raise snapshot_store.SnapshotCorrupt(f"layer {layer} of step {step} has no shard")
        extra = [f for f in entry.files if f.kind is not manifests.FileKind.SHARD]
        return MemberSnapshot(
            step=step,
            redundancy=snapshot.manifest.redundancy,
            entry=entry,
            shard=snapshot.read(shard),
            redundant=snapshot.read(extra[0]) if extra else None,
        )


def gather_members(
    stores: Sequence[snapshot_store.SnapshotStore], step: int, layer: int
) -> list[MemberSnapshot]:
    """The readable member snapshots of `layer` at `step` among `stores`; a store that cannot
    serve (missing or corrupt) counts as a lost member and is logged."""
    found = []
    for store in stores:
        try:
            found.append(read_member(store, step, layer))
        except snapshot_store.SnapshotError as exc:
            LOG.warning(
                "layer %d step %d: %s is lost for recovery: %s", layer, step, store.root, exc
            )
    return found


def rebuild_layer(members: Sequence[MemberSnapshot]) -> model.LayerState:
    """The layer's full state from its members' snapshots, rebuilding one lost member's shard
    from a copy or the parities. Raises SnapshotMissing when more members are lost than the
    redundancy tolerates, SnapshotCorrupt when the members disagree on what they hold."""
    if not members:
        raise snapshot_store.SnapshotMissing(
            "no member of the sharding group could be read; load the persistent checkpoint"
        )
    members = _distinct(members)
    first = _check_agree(members)
    by_member = {s.entry.member: s for s in members}
    group_size = len(first.entry.group)
    shards = {k: s.shard for k, s in by_member.items()}
    lost = [k for k in range(group_size) if k not in by_member]
    if len(lost) > first.entry.tolerated_losses:
        raise snapshot_store.SnapshotMissing(_lost_message(first, lost))
    for k in lost:
        shards[k] = _recover(k, first, by_member)
    whole = shards[0] if group_size == 1 else None
    if whole is not None and whole.flags.writeable:  # its own buffer: no copy needed
        return unflatten(first.entry, whole)
    return unflatten(first.entry, np.concatenate([shards[k] for k in range(group_size)]))


def _distinct(members: Sequence[MemberSnapshot]) -> list[MemberSnapshot]:
    """One snapshot per member: a member's holder and its mirror (`mirroring`) store the same
    files, so a second one with the same entry (checksums included) is dropped; one whose entry
    differs is kept, and `_check_agree` rejects the pair (they must be the same bytes)."""
    seen: dict[int, manifests.LayerEntry] = {}
    distinct = []
    for s in members:
        if seen.get(s.entry.member) == s.entry:
            continue
        seen.setdefault(s.entry.member, s.entry)
        distinct.append(s)
    return distinct


def _check_agree(members: Sequence[MemberSnapshot]) -> MemberSnapshot:
    first = members[0]
    key = (first.step, first.redundancy, first.entry.layer, first.entry.group)
    seen = set()
    for s in members:
        entry = s.entry
        if (s.step, s.redundancy, entry.layer, entry.group) != key or (
            entry.total_bytes,
            entry.tensors,
            entry.names,
        ) != (first.entry.total_bytes, first.entry.tensors, first.entry.names):
            raise snapshot_store.SnapshotCorrupt(
                f"member snapshots disagree: {key} vs {(s.step, s.redundancy, entry.layer)}"
            )
        if entry.member in seen:
            raise snapshot_store.SnapshotCorrupt(
                f"layer {entry.layer} of step {s.step}: two copies of member {entry.member} "
                "disagree (their checksums differ)"
            )
        seen.add(entry.member)
    return first


def _lost_message(first: MemberSnapshot, lost: list[int]) -> str:
    workers = [first.entry.group[k] for k in lost]
    return (
        f"layer {first.entry.layer} of step {first.step}: members {lost} (workers {workers}) "
        f"are lost and redundancy {first.redundancy.value!r} in a group of "
        f"{len(first.entry.group)} tolerates {first.entry.tolerated_losses}; load the "
        "persistent checkpoint"
    )


def _recover(
    lost: int, first: MemberSnapshot, by_member: Mapping[int, MemberSnapshot]
) -> parity.Bytes:
    """Lost member `lost`'s shard from its predecessor's copy or from the parities."""
    entry, m = first.entry, len(first.entry.group)
    if first.redundancy is messages.RedundancyMode.XOR:
        parities = {k: s.redundant for k, s in by_member.items() if s.redundant is not None}
        shards = {k: s.shard for k, s in by_member.items()}
        try:
            return parity.rebuild_shard(lost, m, entry.total_bytes, shards, parities)
        except parity.ParityLayoutError as exc:
            raise snapshot_store.SnapshotCorrupt(f"layer {entry.layer}: {exc}") from exc
    holder = by_member[(lost - 1) % m]
    copy = holder.entry.file(manifests.FileKind.COPY)
    span = parity.shard_range(entry.total_bytes, m, lost)
    if copy is None or holder.redundant is None or copy.member != lost:
        raise snapshot_store.SnapshotCorrupt(
            f"layer {entry.layer}: member {holder.entry.member} holds no copy of member {lost}"
        )
    if (copy.start, copy.stop) != (span.start, span.stop):
        raise snapshot_store.SnapshotCorrupt(f"layer {entry.layer}: copy covers the wrong bytes")
    return holder.redundant


def load_layer(
    stores: Sequence[snapshot_store.SnapshotStore], step: int, layer: int
) -> model.LayerState:
    """Read `layer` at `step` from the surviving members' stores and rebuild it."""
    return rebuild_layer(gather_members(stores, step, layer))
