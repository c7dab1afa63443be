"""Asynchronous Optimizer Recomputing (REFT AOR, §4.2 eq. 3-4), generalised to AdamW.

REFT's AOR protects optimizer state that ZeRO-1 shards, so no peer holds a copy: each member
keeps, on the host, a replica of a peer's optimizer shard and updates it from the gradient with
the optimizer's own math (eq. 4 is written for SGD, W_opt <- W_opt - eta * grad). Here the
optimizer is AdamW and the replicated state is its two moments, so the replica replays exactly
the moment updates of torch's AdamW (decoupled weight decay never touches the moments):

    exp_avg    <- lerp(exp_avg, grad, 1 - beta1)
    exp_avg_sq <- exp_avg_sq * beta2 + (1 - beta2) * grad * grad

with the same torch kernels and Python-float scalars as `torch.optim.AdamW`, so the replica is
bit-identical to the live moments (a test checks this against the live optimizer every step).
Parameters and step counts are small or stable and are copied from the live state instead.

An `OptimizerReplica` covers the bytes `span` of a layer's flattened state (the peer's shard,
`parity.shard_range`): for every exp_avg / exp_avg_sq tensor overlapping it, the elements that
overlap (rounded out to whole elements). `overlay` presents the flattened state with those
bytes taken from the replica, which the writer stores as the peer's COPY.

Our optimizer state is replicated (vanilla data parallelism), so this protects nothing COPY
does not; it exists so that the same mechanism serves when optimizer state is sharded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from planaria.agent.state import manifests, parity, snapshot_store
from planaria.agent.training import model
from planaria.contract import plan as plans

_MOMENTS = (manifests.Role.EXP_AVG, manifests.Role.EXP_AVG_SQ)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Patch:
    """Elements [first, first + values.numel()) of moment `role` of parameter `index`, whose
    bytes start at `byte_offset` of the flattened state."""

    role: manifests.Role
    index: int
    first: int
    byte_offset: int
    values: torch.Tensor


class OptimizerReplica:
    """The host replica of one layer's moments inside a byte range of its flattened state.

    `step` is the last committed step whose update the replica has applied.
    """

    def __init__(
        self,
        *,
        state: model.LayerState,
        layout: Sequence[manifests.TensorLayout],
        span: range,
        group: tuple[plans.WorkerId, ...],
        step: int,
        config: model.OptimizerConfig,
    ) -> None:
        self.group = group
        self.step = step
        self._beta1 = config.beta1
        self._beta2 = config.beta2
        index_of = {name: i for i, name in enumerate(state.names)}
        self._patches = [
            _patch(t, index_of[t.name], span, state)
            for t in layout
            if t.role in _MOMENTS and t.nbytes and _overlaps(t, span)
        ]

    def update(self, step: int, gradients: Sequence[torch.Tensor | None]) -> None:
        """Apply step `step`'s AdamW moment update; parameters without a gradient are skipped,
        as AdamW skips them. Steps must come one after another."""
        if step != self.step + 1:
            raise snapshot_store.SnapshotConfigError(
                f"recompute replica is at step {self.step}; it cannot apply step {step} (call "
                "recompute_step for every step, in order)"
            )
        for patch in self._patches:
            grad = gradients[patch.index]
            if grad is None:
                continue
            g = grad.detach().reshape(-1)[patch.first : patch.first + patch.values.numel()]
            g = g.to(device=patch.values.device)
            if patch.role is manifests.Role.EXP_AVG:
                patch.values.lerp_(g, 1 - self._beta1)
            else:
                patch.values.mul_(self._beta2).addcmul_(g, g, value=1 - self._beta2)
        self.step = step

    def overlay(self, data: parity.FlatBytes) -> parity.FlatBytes:
        """`data` with the replica's bytes in place of the live moments it covers."""
        segments: list[parity.Bytes] = []
        position = 0
        for patch in sorted(self._patches, key=lambda p: p.byte_offset):
            replica = patch.values.reshape(-1).view(torch.uint8).numpy()
            segments.extend(data.views(position, patch.byte_offset))
            segments.append(replica)
            position = patch.byte_offset + replica.size
        segments.extend(data.views(position, data.nbytes))
        return parity.FlatBytes(segments)


def _overlaps(t: manifests.TensorLayout, span: range) -> bool:
    return t.offset < span.stop and span.start < t.offset + t.nbytes


def _patch(t: manifests.TensorLayout, index: int, span: range, state: model.LayerState) -> _Patch:
    """The replica of the elements of tensor `t` that overlap bytes `span`."""
    itemsize = t.nbytes // max(1, math.prod(t.shape))
    low = max(span.start, t.offset) - t.offset
    high = min(span.stop, t.offset + t.nbytes) - t.offset
    first, stop = low // itemsize, -(-high // itemsize)
    source = state.exp_avg if t.role is manifests.Role.EXP_AVG else state.exp_avg_sq
    values = source[index].detach().reshape(-1)[first:stop].to("cpu", copy=True)
    return _Patch(
        role=t.role,
        index=index,
        first=first,
        byte_offset=t.offset + first * itemsize,
        values=values,
    )
