"""The instruction set of a schedule: what one worker does, in order, in one training step.

A literal interpreter (the agent's executor) runs a worker's instructions one after the other:

    Forward(g, [a, b))        run layers a..b-1 forward on micro-batch g and keep what backward
                              needs; a == 0: load micro-batch g's tokens (samples [g*B, (g+1)*B)
                              of the step's global batch, B = micro-batch size); b == num_layers:
                              compute the loss, scaled by 1 / (global batch x sequence length)
                              so that losses and gradients of micro-batches simply add up
    Backward(g, [a, b))       backward through the same layers; b == num_layers: start from the
                              loss, else from the gradient received for g; accumulate parameter
                              gradients (summed over micro-batches)
    SendActivation(to, g, tag)    post a non-blocking send of g's activation (output of layer b-1)
    RecvActivation(from, g, tag)  blocking receive of g's input activation
    SendGrad(to, g, tag)          post a non-blocking send of the gradient w.r.t. g's input
    RecvGrad(from, g, tag)        blocking receive of the gradient w.r.t. g's output
    AllReduce(layers, group, round)  blocking sum of these layers' gradients over `group`
    OptimizerStep(layers)     step these layers with their summed (all-reduced) gradients
    Snapshot(layers)          marker: here (after the update) the agent may snapshot these layers

Sends complete in the background; every posted send must be awaited before the step ends. `tag`
numbers the messages of one (source, destination) pair 0, 1, 2, ... in the order both sides post
them, so matching by tag (gloo) and matching by order (NCCL) agree. All members of a group issue
their collectives on shared groups in the same order. `micro_batch` is always the *global* index.

Not here: how a plan becomes instructions (`planaria.contract.schedule`), what they cost
(`planaria.planner.estimator`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from planaria.contract import errors, plan


class Op(StrEnum):
    """The kinds of instruction (a closed set: the executor handles every one)."""

    FORWARD = "forward"
    BACKWARD = "backward"
    SEND_ACTIVATION = "send_activation"
    RECV_ACTIVATION = "recv_activation"
    SEND_GRAD = "send_grad"
    RECV_GRAD = "recv_grad"
    ALL_REDUCE = "all_reduce"
    OPTIMIZER_STEP = "optimizer_step"
    SNAPSHOT = "snapshot"


def _check_layers(layer_start: int, layer_stop: int) -> None:
    if not 0 <= layer_start < layer_stop:
        raise errors.PlanInputError(
            f"instruction layers [{layer_start}, {layer_stop}) must be a non-empty range"
        )


def _check_indices(what: str, *values: int) -> None:
    if min(values) < 0:
        raise errors.PlanInputError(f"{what}: micro-batch, tag and round must be >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class Forward:
    """Layers [layer_start, layer_stop) forward on global micro-batch `micro_batch`."""

    op: ClassVar[Op] = Op.FORWARD
    micro_batch: int
    layer_start: int
    layer_stop: int

    def __post_init__(self) -> None:
        _check_indices("Forward", self.micro_batch)
        _check_layers(self.layer_start, self.layer_stop)


@dataclass(frozen=True, slots=True, kw_only=True)
class Backward:
    """Layers [layer_start, layer_stop) backward on global micro-batch `micro_batch`."""

    op: ClassVar[Op] = Op.BACKWARD
    micro_batch: int
    layer_start: int
    layer_stop: int

    def __post_init__(self) -> None:
        _check_indices("Backward", self.micro_batch)
        _check_layers(self.layer_start, self.layer_stop)


@dataclass(frozen=True, slots=True, kw_only=True)
class SendActivation:
    """Post a non-blocking send of `micro_batch`'s output activation to `destination`."""

    op: ClassVar[Op] = Op.SEND_ACTIVATION
    destination: plan.WorkerId
    micro_batch: int
    tag: int

    def __post_init__(self) -> None:
        _check_indices("SendActivation", self.micro_batch, self.tag)


@dataclass(frozen=True, slots=True, kw_only=True)
class RecvActivation:
    """Block until `micro_batch`'s input activation from `source` has arrived."""

    op: ClassVar[Op] = Op.RECV_ACTIVATION
    source: plan.WorkerId
    micro_batch: int
    tag: int

    def __post_init__(self) -> None:
        _check_indices("RecvActivation", self.micro_batch, self.tag)


@dataclass(frozen=True, slots=True, kw_only=True)
class SendGrad:
    """Post a non-blocking send of the gradient w.r.t. `micro_batch`'s input to `destination`."""

    op: ClassVar[Op] = Op.SEND_GRAD
    destination: plan.WorkerId
    micro_batch: int
    tag: int

    def __post_init__(self) -> None:
        _check_indices("SendGrad", self.micro_batch, self.tag)


@dataclass(frozen=True, slots=True, kw_only=True)
class RecvGrad:
    """Block until the gradient w.r.t. `micro_batch`'s output from `source` has arrived."""

    op: ClassVar[Op] = Op.RECV_GRAD
    source: plan.WorkerId
    micro_batch: int
    tag: int

    def __post_init__(self) -> None:
        _check_indices("RecvGrad", self.micro_batch, self.tag)


@dataclass(frozen=True, slots=True, kw_only=True)
class AllReduce:
    """Sum the gradients of `layers` over `group` (sorted worker ids, this worker among them).

    Every worker holding these layers is in the group (Oobleck §6.1), including holders that
    computed no micro-batch (they add zeros and receive the sum). Collectives of one `round` have
    disjoint groups and may run concurrently (Odyssey §IV-B).
    """

    op: ClassVar[Op] = Op.ALL_REDUCE
    layers: tuple[int, ...]
    group: tuple[plan.WorkerId, ...]
    round: int

    def __post_init__(self) -> None:
        _check_indices("AllReduce", self.round)
        if not self.layers or list(self.layers) != sorted(set(self.layers)):
            raise errors.PlanInputError(f"AllReduce layers {self.layers} must be sorted, unique")
        if len(self.group) < 2 or list(self.group) != sorted(set(self.group)):
            raise errors.PlanInputError(
                f"AllReduce group {self.group} must be >= 2 sorted, distinct workers"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerStep:
    """Apply the optimizer to `layers` with their summed, all-reduced gradients (the loss
    scaling already makes that sum the global batch's mean gradient)."""

    op: ClassVar[Op] = Op.OPTIMIZER_STEP
    layers: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """Marker after the update: the agent snapshots `layers` here when its interval says so."""

    op: ClassVar[Op] = Op.SNAPSHOT
    layers: tuple[int, ...]


Instruction = (
    Forward
    | Backward
    | SendActivation
    | RecvActivation
    | SendGrad
    | RecvGrad
    | AllReduce
    | OptimizerStep
    | Snapshot
)
Compute = Forward | Backward
Send = SendActivation | SendGrad
Recv = RecvActivation | RecvGrad
