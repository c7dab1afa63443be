"""Stage costs and the 1F1B pipeline time: the one table the GPU-stage mapping and its oracle read.

A *stage* runs layers [w, u) on k GPUs of one node (Oobleck §4.1.2). Its time per micro-batch is

    t(w, u, k, link) = sum_{l=w}^{u-1} (F_l(k) + B_l(k)) + x(link, u)

where F_l(k), B_l(k) are the profile's forward/backward seconds of layer l on k GPUs, and x is the
activation transfer to the next stage: the stage sends its output activation forward and gets
the gradient of the same size back, 2 * link.transfer_s(output_bytes of layer u-1), over the
intra-node link when the next stage is on the same node, the inter-node link when it is not, and
nothing for the last stage. Sums run layer by layer in order (`numpy.cumsum`), and every caller
reads the same table, so equal stages are bit-equal and the slowest stage's tie rule below is
applied to one set of numbers.

The pipeline time of Oobleck eq. 1-4, unrolled. For stage times t_0..t_{S-1} and N_b
micro-batches, with k* the *first* index of the largest t (0-based; ties go to the earliest),

    T1 = sum_k t_k                                  (eq. 1, 4)
    T2 = (N_b - S + k* - 1) * t_{k*}                (eq. 2)
    T3 = sum_{k=k*}^{S-1} t_k                       (eq. 3)
    T  = T1 + T2 + T3

Check: one stage with N_b = 4 gives t + 2t + t, eq. 4; S equal stages give (N_b + S - 1) t, the
textbook 1F1B time. The first-argmax rule matters: moving k* from p to a later tied stage q
changes T by sum_{p<k<q} (c - t_k) >= 0, so the rule picks the smaller of the tied values.
T is linear in N_b with slope t_{k*}, which batch distribution uses.

Memory: a stage at depth r from the end of the pipeline (the last stage has r = 1) stashes the
activations of min(r, N_b) micro-batches in flight under 1F1B; its k GPUs share its state and
activations evenly (tensor parallelism), so it fits when

    state_bytes(w, u) + min(r, N_b) * activation_bytes(w, u) <= k * memory_bytes.

`max_depth` holds the largest r that fits. At the end: the tables the mapping search derives
from these (usable stage times, memory limits under a given N_b, depth-sensitive stages). What is
deliberately not here: the data-parallel gradient all-reduce and the optimizer step (the
estimator's business; eq. 1-4 leave them out).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np
import numpy.typing as npt

from planaria.contract import errors, profile

FloatArray = npt.NDArray[np.float64]

# Depths are compared as floats; a limit this large means "any depth" and stays exact.
UNLIMITED_DEPTH = float(2**40)


class Link(IntEnum):
    """What follows a stage: nothing (last stage), a stage on the same node, one on another."""

    NONE = 0
    INTRA = 1
    INTER = 2


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class StageTable:
    """Stage times and memory limits for every layer range, GPU count and link.

    `times[link, k - 1, w, d - 1]` is t(w, w + d, k, link) in seconds (inf where w + d > L);
    `max_depth[k - 1, w, d - 1]` the largest depth that fits in memory (-1: never,
    UNLIMITED_DEPTH: always). k runs over 1..max_gpus = min(GPUs per node, profile's M).
    Built once per (profile, memory, GPUs per node) and shared across S and templates.
    """

    num_layers: int
    max_gpus: int
    memory_bytes: int
    times: FloatArray
    max_depth: FloatArray
    state_bytes: tuple[int, ...] = field(repr=False)
    activation_bytes: tuple[int, ...] = field(repr=False)
    moved_bytes: tuple[int, ...] = field(repr=False)

    def stage_time_s(self, start: int, stop: int, num_gpus: int, link: Link) -> float:
        """t(start, stop, num_gpus, link); the value every caller of the mapping agrees on."""
        return float(self.times[link, num_gpus - 1, start, stop - start - 1])

    def fits(self, start: int, stop: int, num_gpus: int, in_flight: int) -> bool:
        """Whether the stage fits in memory with `in_flight` micro-batches stashed (exact ints)."""
        state = sum(self.state_bytes[start:stop])
        activations = sum(self.activation_bytes[start:stop])
        return state + in_flight * activations <= num_gpus * self.memory_bytes


def build_table(
    source: profile.Profile, *, gpus_per_node: int, memory_bytes: int | None = None
) -> StageTable:
    """The stage table of `source` for nodes of `gpus_per_node` GPUs.

    `memory_bytes` overrides the profile's per-GPU memory. Raises PlanInputError when
    gpus_per_node or memory_bytes is < 1.
    """
    if gpus_per_node < 1:
        raise errors.PlanInputError(f"gpus_per_node must be >= 1 (got {gpus_per_node})")
    memory = source.memory_bytes if memory_bytes is None else memory_bytes
    if memory < 1:
        raise errors.PlanInputError(f"GPU memory must be >= 1 byte (got {memory})")
    max_gpus = min(gpus_per_node, source.max_gpus_per_stage)
    layers = source.layers
    state = tuple(layer.state_bytes for layer in layers)
    activations = tuple(layer.activation_bytes for layer in layers)
    return StageTable(
        num_layers=len(layers),
        max_gpus=max_gpus,
        memory_bytes=memory,
        times=_times(source, max_gpus),
        max_depth=_max_depth(state, activations, memory, max_gpus),
        state_bytes=state,
        activation_bytes=activations,
        moved_bytes=tuple(layer.parameter_bytes + layer.optimizer_bytes for layer in layers),
    )


def _band_sums(values: FloatArray) -> FloatArray:
    """out[w, d - 1] = values[w] + ... + values[w + d - 1], summed in order; inf past the end."""
    n = len(values)
    shifted = np.zeros((n + 1, n))
    for w in range(n):
        shifted[w, : n - w] = values[w:]
    sums = np.cumsum(shifted, axis=1)
    offsets = np.arange(n)[None, :] + np.arange(n + 1)[:, None]
    sums[offsets >= n] = math.inf
    return sums


def _times(source: profile.Profile, max_gpus: int) -> FloatArray:
    n = source.num_layers
    times = np.empty((len(Link), max_gpus, n + 1, n))
    stop = np.arange(n)[None, :] + np.arange(n + 1)[:, None]  # index of the stage's last layer
    last = np.minimum(stop, n - 1)
    out_bytes = np.array([layer.output_bytes for layer in source.layers], dtype=np.float64)
    for k in range(1, max_gpus + 1):
        per_layer = np.array(
            [layer.forward_s[k - 1] + layer.backward_s[k - 1] for layer in source.layers]
        )
        compute = _band_sums(per_layer)
        times[Link.NONE, k - 1] = compute
        for link, spec in ((Link.INTRA, source.intra_node), (Link.INTER, source.inter_node)):
            # Forward activation out and its gradient back: 2 sends of the same size.
            transfer = 2 * (spec.latency_s + out_bytes / spec.bandwidth_bytes_per_s)
            times[link, k - 1] = compute + transfer[last]
    return times


def _max_depth(
    state: Sequence[int], activations: Sequence[int], memory: int, max_gpus: int
) -> FloatArray:
    """Largest in-flight depth r with state + r * activations <= k * memory, exactly."""
    n = len(state)
    # int64 unless some sum could overflow it; then exact Python ints in object arrays.
    largest = max(sum(state), sum(activations), max_gpus * memory)
    dtype: type = np.int64 if largest < 2**61 else object
    state_sum = _int_band_sums(state, dtype)
    act_sum = _int_band_sums(activations, dtype)
    depth = np.full((max_gpus, n + 1, n), -1.0)
    for k in range(1, max_gpus + 1):
        room = k * memory - state_sum
        limit = room // np.maximum(act_sum, 1)
        unlimited = (act_sum == 0) & (room >= 0)
        limited = np.minimum(limit, int(UNLIMITED_DEPTH)).astype(np.float64)
        depth[k - 1] = np.where(unlimited, UNLIMITED_DEPTH, np.where(room >= 0, limited, -1.0))
    depth[:, ~_valid_ranges(n)] = -1.0
    return depth


def _int_band_sums(values: Sequence[int], dtype: type) -> npt.NDArray[np.int64]:
    """Exact integer sums over [w, w + d) (garbage past the last layer, masked by the caller)."""
    n = len(values)
    prefix = [0]
    for value in values:
        prefix.append(prefix[-1] + value)
    starts: npt.NDArray[np.int64] = np.array(prefix, dtype=dtype)
    padded: npt.NDArray[np.int64] = np.array(prefix + [prefix[-1]] * n, dtype=dtype)
    offsets = np.arange(n)[None, :] + np.arange(n + 1)[:, None] + 1
    result: npt.NDArray[np.int64] = padded[offsets] - starts[:, None]
    return result


def _valid_ranges(num_layers: int) -> npt.NDArray[np.bool_]:
    offsets = np.arange(num_layers)[None, :] + np.arange(num_layers + 1)[:, None]
    valid: npt.NDArray[np.bool_] = offsets < num_layers
    return valid


def pipeline_time_s(stage_times: Sequence[float], num_micro_batches: int) -> float:
    """T = T1 + T2 + T3 of Oobleck eq. 1-4 (closed form in the module docstring)."""
    slowest = slowest_stage(stage_times)
    num_stages = len(stage_times)
    t1 = sum(stage_times)
    t2 = (num_micro_batches - num_stages + slowest - 1) * stage_times[slowest]
    t3 = sum(stage_times[slowest:])
    return t1 + t2 + t3


def slowest_stage(stage_times: Sequence[float]) -> int:
    """k*: the first index of the largest stage time."""
    if not stage_times:
        raise errors.PlanInputError("a pipeline needs at least one stage time")
    return max(range(len(stage_times)), key=lambda k: (stage_times[k], -k))


# -- tables derived for the mapping search (planaria.planner.stage_mapping) ------------------


def effective_depth(max_depth: FloatArray, num_micro_batches: int | None) -> FloatArray:
    """With a given N_b, in-flight micro-batches never exceed it: limits >= N_b are unlimited."""
    if num_micro_batches is None:
        return max_depth
    return np.where(max_depth >= num_micro_batches, UNLIMITED_DEPTH, max_depth)


def usable_times(table: StageTable, depth_limit: FloatArray, m: int, max_nodes: int) -> FloatArray:
    """Stage times that a pipeline can use (inf elsewhere): the last stage ends at the last
    layer and sends nothing; others send over the intra-node link (only if a node has room for a
    second stage) or the inter-node link (only with two nodes or more); memory fits at depth 1."""
    num_layers, link = table.num_layers, Link
    offsets = np.arange(num_layers)[None, :] + np.arange(num_layers + 1)[:, None] + 1
    times = np.full_like(table.times, math.inf)
    inner = offsets < num_layers
    times[link.NONE] = np.where(offsets == num_layers, table.times[link.NONE], math.inf)
    if m > 1:
        times[link.INTRA, : m - 1] = np.where(inner, table.times[link.INTRA, : m - 1], math.inf)
    if max_nodes > 1:
        times[link.INTER] = np.where(inner, table.times[link.INTER], math.inf)
    relevant: FloatArray = np.where(depth_limit[None] >= 1, times, math.inf)
    return relevant


def depth_sensitivity(
    relevant: FloatArray, depth_limit: FloatArray, max_stages: int
) -> tuple[FloatArray, FloatArray]:
    """Stages whose memory limit falls among the possible depths: their fastest times, sorted,
    and their limits in the same order."""
    fastest = relevant.min(axis=0)
    sensitive = np.isfinite(fastest) & (depth_limit >= 1) & (depth_limit < max_stages)
    times, limits = fastest[sensitive], depth_limit[sensitive]
    order = np.argsort(times, kind="stable")
    return times[order], limits[order]
