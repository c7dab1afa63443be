"""Translation of the planner's types that travel on the wire: Plan, LayerTransfer, Profile.

`encode_*` builds the planaria.v1 message of a dataclass; `decode_*` checks a message from the
network and builds the dataclass, raising `planaria.wire.errors.WireError`s that name the field.
The dataclasses' own validation (the planner's PlanInputError) is the check: a decoded plan obeys
every invariant of `planaria.contract.plan.Plan`. The RPC-level translation is in
`planaria.wire.codec`, which uses this module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Generic, TypeVar

from planaria.contract import plan as plans
from planaria.contract import precision
from planaria.contract import profile as profiles
from planaria.v1 import agent_pb2 as pb
from planaria.wire import errors

_E = TypeVar("_E", bound=StrEnum)
_V = TypeVar("_V", bound=int)


class EnumCodec(Generic[_E, _V]):
    """Maps a StrEnum to a proto enum by name (member X <-> PREFIX_X); zero is no member."""

    __slots__ = ("_prefix", "_to_wire", "_from_wire")

    def __init__(self, value_of: Callable[[str], _V], prefix: str, domain: type[_E]) -> None:
        # value_of raises at import when a member has no proto value: the contract drifted.
        self._prefix = prefix
        self._to_wire: Mapping[_E, _V] = {m: value_of(prefix + m.name) for m in domain}
        self._from_wire: Mapping[int, _E] = {int(v): m for m, v in self._to_wire.items()}

    def encode(self, member: _E) -> _V:
        return self._to_wire[member]

    def decode(self, value: int, path: str) -> _E:
        choices = ", ".join(self._prefix + m.name for m in self._to_wire)
        if value == 0:
            unset = f"{self._prefix}UNSPECIFIED"
            raise errors.UnknownEnumError(f"{path} is {unset}; set one of {choices}")
        member = self._from_wire.get(value)
        if member is None:
            raise errors.UnknownEnumError(
                f"{path} is {value}, which this version of planaria.v1 does not know; "
                f"set one of {choices} or upgrade this side"
            )
        return member


# The precision a profile is for (and, in `codec`, the job's).
PRECISIONS = EnumCodec(pb.Precision.Value, "PRECISION_", precision.Precision)


def encode_plan(plan: plans.Plan) -> pb.Plan:
    return pb.Plan(
        pipelines=[_encode_pipeline(p) for p in plan.pipelines],
        micro_batch_size=plan.micro_batch_size,
        gpus_per_node=plan.gpus_per_node,
        reroutes=[_encode_reroute(r) for r in plan.reroutes],
    )


def _encode_pipeline(pipeline: plans.Pipeline) -> pb.Pipeline:
    stages = [
        pb.Stage(layer_start=s.layer_start, layer_stop=s.layer_stop, workers=s.workers)
        for s in pipeline.stages
    ]
    return pb.Pipeline(stages=stages, num_micro_batches=pipeline.num_micro_batches)


def _encode_reroute(reroute: plans.Reroute) -> pb.Reroute:
    return pb.Reroute(
        pipeline=reroute.pipeline,
        stage=reroute.stage,
        peer_pipeline=reroute.peer_pipeline,
        micro_batches=reroute.micro_batches,
    )


def decode_plan(msg: pb.Plan, path: str = "Plan") -> plans.Plan:
    pipelines = tuple(
        _decode_pipeline(p, f"{path}.pipelines[{i}]") for i, p in enumerate(msg.pipelines)
    )
    reroutes = tuple(
        _decode_reroute(r, f"{path}.reroutes[{i}]") for i, r in enumerate(msg.reroutes)
    )
    with errors.at(path):
        return plans.Plan(
            pipelines=pipelines,
            micro_batch_size=msg.micro_batch_size,
            gpus_per_node=msg.gpus_per_node,
            reroutes=reroutes,
        )


def _decode_pipeline(msg: pb.Pipeline, path: str) -> plans.Pipeline:
    stages = tuple(_decode_stage(s, f"{path}.stages[{i}]") for i, s in enumerate(msg.stages))
    with errors.at(path):
        return plans.Pipeline(stages=stages, num_micro_batches=msg.num_micro_batches)


def _decode_stage(msg: pb.Stage, path: str) -> plans.Stage:
    with errors.at(path):
        return plans.Stage(
            layer_start=msg.layer_start,
            layer_stop=msg.layer_stop,
            workers=tuple(plans.WorkerId(w) for w in msg.workers),
        )


def _decode_reroute(msg: pb.Reroute, path: str) -> plans.Reroute:
    with errors.at(path):
        return plans.Reroute(
            pipeline=msg.pipeline,
            stage=msg.stage,
            peer_pipeline=msg.peer_pipeline,
            micro_batches=tuple(msg.micro_batches),
        )


def encode_transfer(transfer: plans.LayerTransfer) -> pb.LayerTransfer:
    return pb.LayerTransfer(
        layer=transfer.layer, destination=transfer.destination, sources=transfer.sources
    )


def decode_transfer(msg: pb.LayerTransfer, path: str = "LayerTransfer") -> plans.LayerTransfer:
    with errors.at(path):
        return plans.LayerTransfer(
            layer=msg.layer,
            destination=plans.WorkerId(msg.destination),
            sources=tuple(plans.WorkerId(w) for w in msg.sources),
        )


# ---- the profile (planaria.contract.profile) ----------------------------------------------------


def encode_profile(profile: profiles.Profile) -> pb.Profile:
    return pb.Profile(
        model=profile.model,
        accelerator=profile.accelerator,
        micro_batch_size=profile.micro_batch_size,
        memory_bytes=profile.memory_bytes,
        layers=[_encode_layer_profile(layer) for layer in profile.layers],
        intra_node=_encode_link(profile.intra_node),
        inter_node=_encode_link(profile.inter_node),
        synthetic=profile.synthetic,
        precision=PRECISIONS.encode(profile.precision),
    )


def _encode_layer_profile(layer: profiles.LayerProfile) -> pb.LayerProfile:
    return pb.LayerProfile(
        name=layer.name,
        forward_s=layer.forward_s,
        backward_s=layer.backward_s,
        parameter_bytes=layer.parameter_bytes,
        gradient_bytes=layer.gradient_bytes,
        optimizer_bytes=layer.optimizer_bytes,
        activation_bytes=layer.activation_bytes,
        output_bytes=layer.output_bytes,
        optimizer_s=layer.optimizer_s,
    )


def _encode_link(link: profiles.LinkProfile) -> pb.LinkProfile:
    msg = pb.LinkProfile(bandwidth_bytes_per_s=link.bandwidth_bytes_per_s, latency_s=link.latency_s)
    if link.allreduce_bandwidth_bytes_per_s is not None:
        msg.allreduce_bandwidth_bytes_per_s = link.allreduce_bandwidth_bytes_per_s
    if link.allreduce_latency_s is not None:
        msg.allreduce_latency_s = link.allreduce_latency_s
    return msg


def decode_profile(msg: pb.Profile, path: str = "Profile") -> profiles.Profile:
    for field in ("intra_node", "inter_node"):
        if not msg.HasField(field):
            raise errors.missing(path, field)
    layers = tuple(
        _decode_layer_profile(layer, f"{path}.layers[{i}]") for i, layer in enumerate(msg.layers)
    )
    arithmetic = PRECISIONS.decode(msg.precision, f"{path}.precision")
    with errors.at(path):
        return profiles.Profile(
            model=msg.model,
            accelerator=msg.accelerator,
            micro_batch_size=msg.micro_batch_size,
            memory_bytes=msg.memory_bytes,
            layers=layers,
            intra_node=_decode_link(msg.intra_node, f"{path}.intra_node"),
            inter_node=_decode_link(msg.inter_node, f"{path}.inter_node"),
            synthetic=msg.synthetic,
            precision=arithmetic,
        )


def _decode_layer_profile(msg: pb.LayerProfile, path: str) -> profiles.LayerProfile:
    with errors.at(path):
        return profiles.LayerProfile(
            name=msg.name,
            forward_s=tuple(msg.forward_s),
            backward_s=tuple(msg.backward_s),
            parameter_bytes=msg.parameter_bytes,
            gradient_bytes=msg.gradient_bytes,
            optimizer_bytes=msg.optimizer_bytes,
            activation_bytes=msg.activation_bytes,
            output_bytes=msg.output_bytes,
            optimizer_s=msg.optimizer_s,
        )


def _decode_link(msg: pb.LinkProfile, path: str) -> profiles.LinkProfile:
    with errors.at(path):
        return profiles.LinkProfile(
            bandwidth_bytes_per_s=msg.bandwidth_bytes_per_s,
            latency_s=msg.latency_s,
            allreduce_bandwidth_bytes_per_s=(
                msg.allreduce_bandwidth_bytes_per_s
                if msg.HasField("allreduce_bandwidth_bytes_per_s")
                else None
            ),
            allreduce_latency_s=(
                msg.allreduce_latency_s if msg.HasField("allreduce_latency_s") else None
            ),
        )
