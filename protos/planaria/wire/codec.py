"""The one translation between planaria.v1 messages and our dataclasses, RPC by RPC.

`encode_*` turns a dataclass of `planaria.wire.messages` into its message; `decode_*` turns a
message that came off the network back into the dataclass and checks it completely, so nothing
past this module sees a malformed message. Requests whose only content is one value (an epoch, a
grace period, an interval) encode from and decode to that value. The planner's types (Plan,
LayerTransfer, Profile) are translated by `planaria.wire.planner_codec`, which this module uses.
The servicer and the controller's gRPC client are the only users; the controller core sees the
dataclasses alone.

Errors (defined in `planaria.wire.errors`; the servicer maps all of them to INVALID_ARGUMENT):

    WireError (ValueError)      a message breaks the contract; the text starts with the field
    ├── MissingFieldError       a required sub-message is absent
    ├── UnknownEnumError        an enum is *_UNSPECIFIED, or a value this version does not know
    └── InvalidValueError       a value breaks the domain's rules (a range, a plan invariant)

Encoding checks one-value requests the same way (a heartbeat interval or a grace period is at
most `MAX_WAIT_S`, a year). Dataclasses were checked when built, so encoding them only fails
when a value does not fit its field (a negative worker id), with protobuf's ValueError.
"""

from __future__ import annotations

import math
from typing import TypeVar

from planaria.contract import plan as plans
from planaria.contract import profile as profiles
from planaria.v1 import agent_pb2 as pb
from planaria.wire import errors, messages, planner_codec

# The longest heartbeat interval or grace period a request may ask for: a year. The agent waits
# that long on a threading.Event, and a wait past threading.TIMEOUT_MAX (~292 years) raises
# OverflowError in the servicer (a WatchRequest of 1e12 s ended its stream with UNKNOWN).
MAX_WAIT_S = 365 * 86400.0

_EnumCodec = planner_codec.EnumCodec


# Public so that a servicer can translate a lone enum value, and tests can check completeness.
STATES = _EnumCodec(pb.AgentState.Value, "AGENT_STATE_", messages.AgentState)
ERROR_KINDS = _EnumCodec(pb.ErrorKind.Value, "ERROR_KIND_", messages.ErrorKind)
TIERS = _EnumCodec(pb.RecoveryTier.Value, "RECOVERY_TIER_", messages.RecoveryTier)
REDUNDANCY_MODES = _EnumCodec(pb.RedundancyMode.Value, "REDUNDANCY_MODE_", messages.RedundancyMode)
REDUCTIONS = _EnumCodec(pb.Reduction.Value, "REDUCTION_", messages.Reduction)
PRECISIONS = planner_codec.PRECISIONS
BACKENDS = _EnumCodec(pb.Backend.Value, "BACKEND_", messages.Backend)
DEVICES = _EnumCodec(pb.Device.Value, "DEVICE_", messages.Device)
DATA_FORMATS = _EnumCodec(pb.DataFormat.Value, "DATA_FORMAT_", messages.DataFormat)


def _check(path: str, ok: bool, what: str) -> None:
    if not ok:
        raise errors.InvalidValueError(f"{path} {what}")


# ---- Configure: WorkerConfig <-> ConfigureRequest ---------------------------------------------


def encode_worker_config(config: messages.WorkerConfig) -> pb.ConfigureRequest:
    return pb.ConfigureRequest(
        epoch=config.epoch,
        worker=config.worker,
        plan=planner_codec.encode_plan(config.plan),
        resume_step=config.resume_step,
        rendezvous=encode_rendezvous(config.rendezvous),
        transfers=[planner_codec.encode_transfer(t) for t in config.transfers],
        settings=encode_settings(config.settings),
        stop_step=config.stop_step,
    )


def decode_worker_config(msg: pb.ConfigureRequest) -> messages.WorkerConfig:
    path = "ConfigureRequest"
    for field in ("plan", "rendezvous", "settings"):
        if not msg.HasField(field):
            raise errors.missing(path, field)
    transfers = tuple(
        planner_codec.decode_transfer(t, f"{path}.transfers[{i}]")
        for i, t in enumerate(msg.transfers)
    )
    plan = planner_codec.decode_plan(msg.plan, f"{path}.plan")
    rendezvous = decode_rendezvous(msg.rendezvous, f"{path}.rendezvous")
    settings = decode_settings(msg.settings, f"{path}.settings")
    with errors.at(path):
        return messages.WorkerConfig(
            epoch=msg.epoch,
            worker=plans.WorkerId(msg.worker),
            plan=plan,
            resume_step=msg.resume_step,
            rendezvous=rendezvous,
            transfers=transfers,
            settings=settings,
            stop_step=msg.stop_step if msg.HasField("stop_step") else None,
        )


def encode_rendezvous(rendezvous: messages.Rendezvous) -> pb.Rendezvous:
    return pb.Rendezvous(
        store_host=rendezvous.store_host,
        store_port=rendezvous.store_port,
        key_prefix=rendezvous.key_prefix,
        rank=rendezvous.rank,
        world_size=rendezvous.world_size,
        backend=BACKENDS.encode(rendezvous.backend),
        timeout_s=rendezvous.timeout_s,
    )


def decode_rendezvous(msg: pb.Rendezvous, path: str = "Rendezvous") -> messages.Rendezvous:
    backend = BACKENDS.decode(msg.backend, f"{path}.backend")
    with errors.at(path):
        return messages.Rendezvous(
            store_host=msg.store_host,
            store_port=msg.store_port,
            key_prefix=msg.key_prefix,
            rank=msg.rank,
            world_size=msg.world_size,
            backend=backend,
            timeout_s=msg.timeout_s,
        )


def encode_settings(settings: messages.TrainingSettings) -> pb.TrainingSettings:
    optimizer = settings.optimizer
    return pb.TrainingSettings(
        model=settings.model,
        seed=settings.seed,
        optimizer=pb.OptimizerSettings(
            lr=optimizer.lr,
            beta1=optimizer.beta1,
            beta2=optimizer.beta2,
            eps=optimizer.eps,
            weight_decay=optimizer.weight_decay,
        ),
        global_batch_size=settings.global_batch_size,
        data=encode_data(settings.data),
        device=DEVICES.encode(settings.device),
        snapshot_interval_steps=settings.snapshot_interval_steps,
        redundancy=REDUNDANCY_MODES.encode(settings.redundancy),
        checkpoint_dir=settings.checkpoint_dir,
        checkpoint_interval_steps=settings.checkpoint_interval_steps,
        reduction=REDUCTIONS.encode(settings.reduction),
        precision=PRECISIONS.encode(settings.precision),
    )


def encode_data(data: messages.DataSettings) -> pb.DataSettings:
    return pb.DataSettings(
        corpus_paths=data.corpus_paths,
        max_bytes=data.max_bytes,
        format=DATA_FORMATS.encode(data.format),
        text_field=data.text_field,
        tokenizer_path=data.tokenizer_path,
        separator=data.separator,
        cache_dir=data.cache_dir,
    )


def decode_data(msg: pb.DataSettings, path: str) -> messages.DataSettings:
    fmt = DATA_FORMATS.decode(msg.format, f"{path}.format")
    with errors.at(path):
        return messages.DataSettings(
            corpus_paths=tuple(msg.corpus_paths),
            max_bytes=msg.max_bytes if msg.HasField("max_bytes") else None,
            format=fmt,
            text_field=msg.text_field,
            tokenizer_path=msg.tokenizer_path,
            separator=msg.separator,
            cache_dir=msg.cache_dir,
        )


def decode_settings(
    msg: pb.TrainingSettings, path: str = "TrainingSettings"
) -> messages.TrainingSettings:
    for field in ("optimizer", "data"):
        if not msg.HasField(field):
            raise errors.missing(path, field)
    optimizer, data = msg.optimizer, msg.data
    with errors.at(f"{path}.optimizer"):
        adamw = messages.OptimizerSettings(
            lr=optimizer.lr,
            beta1=optimizer.beta1,
            beta2=optimizer.beta2,
            eps=optimizer.eps,
            weight_decay=optimizer.weight_decay,
        )
    corpus = decode_data(data, f"{path}.data")
    device = DEVICES.decode(msg.device, f"{path}.device")
    redundancy = REDUNDANCY_MODES.decode(msg.redundancy, f"{path}.redundancy")
    reduction = REDUCTIONS.decode(msg.reduction, f"{path}.reduction")
    precision = PRECISIONS.decode(msg.precision, f"{path}.precision")
    with errors.at(path):
        return messages.TrainingSettings(
            model=msg.model,
            seed=msg.seed,
            optimizer=adamw,
            global_batch_size=msg.global_batch_size,
            data=corpus,
            device=device,
            snapshot_interval_steps=msg.snapshot_interval_steps,
            redundancy=redundancy,
            checkpoint_dir=msg.checkpoint_dir,
            checkpoint_interval_steps=msg.checkpoint_interval_steps,
            reduction=reduction,
            precision=precision,
        )


# ---- Watch: Heartbeat <-> WatchResponse --------------------------------------------------------


def encode_watch_request(interval_s: float) -> pb.WatchRequest:
    _check_interval("WatchRequest.interval_s", interval_s)
    return pb.WatchRequest(interval_s=interval_s)


def decode_watch_request(msg: pb.WatchRequest) -> float:
    """The heartbeat interval in seconds (> 0)."""
    _check_interval("WatchRequest.interval_s", msg.interval_s)
    return msg.interval_s


def _check_interval(path: str, interval_s: float) -> None:
    ok = math.isfinite(interval_s) and 0 < interval_s <= MAX_WAIT_S
    _check(path, ok, f"is {interval_s}; give seconds > 0 and <= {MAX_WAIT_S:g}")


def encode_heartbeat(heartbeat: messages.Heartbeat) -> pb.WatchResponse:
    return pb.WatchResponse(
        worker=heartbeat.worker,
        epoch=heartbeat.epoch,
        state=STATES.encode(heartbeat.state),
        last_committed_step=heartbeat.last_committed_step,
        loss=heartbeat.loss,
        samples_processed=heartbeat.samples_processed,
        timings=encode_timings(heartbeat.timings),
        snapshot=encode_snapshot_state(heartbeat.snapshot),
        errors=[encode_latched_error(e) for e in heartbeat.errors],
        setup=None if heartbeat.setup is None else encode_epoch_setup(heartbeat.setup),
        checkpoint_step=heartbeat.checkpoint_step,
    )


def decode_heartbeat(msg: pb.WatchResponse) -> messages.Heartbeat:
    path = "WatchResponse"
    for field in ("timings", "snapshot"):
        if not msg.HasField(field):
            raise errors.missing(path, field)
    state = STATES.decode(msg.state, f"{path}.state")
    timings = decode_timings(msg.timings, f"{path}.timings")
    snapshot = decode_snapshot_state(msg.snapshot, f"{path}.snapshot")
    latched = tuple(
        decode_latched_error(e, f"{path}.errors[{i}]") for i, e in enumerate(msg.errors)
    )
    setup = decode_epoch_setup(msg.setup, f"{path}.setup") if msg.HasField("setup") else None
    with errors.at(path):
        return messages.Heartbeat(
            worker=plans.WorkerId(msg.worker),
            epoch=msg.epoch,
            state=state,
            last_committed_step=msg.last_committed_step,
            loss=msg.loss if msg.HasField("loss") else None,
            samples_processed=msg.samples_processed,
            timings=timings,
            snapshot=snapshot,
            errors=latched,
            setup=setup,
            checkpoint_step=msg.checkpoint_step if msg.HasField("checkpoint_step") else None,
        )


def encode_epoch_setup(setup: messages.EpochSetup) -> pb.EpochSetup:
    return pb.EpochSetup(
        epoch=setup.epoch,
        tier=TIERS.encode(setup.tier),
        regroup_s=setup.regroup_s,
        transfer_s=setup.transfer_s,
        load_s=setup.load_s,
        received_bytes=setup.received_bytes,
        sent_bytes=setup.sent_bytes,
    )


def decode_epoch_setup(msg: pb.EpochSetup, path: str = "EpochSetup") -> messages.EpochSetup:
    tier = TIERS.decode(msg.tier, f"{path}.tier")
    with errors.at(path):
        return messages.EpochSetup(
            epoch=msg.epoch,
            tier=tier,
            regroup_s=msg.regroup_s,
            transfer_s=msg.transfer_s,
            load_s=msg.load_s,
            received_bytes=msg.received_bytes,
            sent_bytes=msg.sent_bytes,
        )


def encode_timings(timings: messages.Timings) -> pb.StepTimings:
    return pb.StepTimings(
        forward_s=timings.forward_s,
        backward_s=timings.backward_s,
        communication_s=timings.communication_s,
        allreduce_s=timings.allreduce_s,
        optimizer_s=timings.optimizer_s,
        snapshot_s=timings.snapshot_s,
        step_s=timings.step_s,
    )


def decode_timings(msg: pb.StepTimings, path: str = "StepTimings") -> messages.Timings:
    with errors.at(path):
        return messages.Timings(
            forward_s=msg.forward_s,
            backward_s=msg.backward_s,
            communication_s=msg.communication_s,
            allreduce_s=msg.allreduce_s,
            optimizer_s=msg.optimizer_s,
            snapshot_s=msg.snapshot_s,
            step_s=msg.step_s,
        )


def encode_snapshot_state(state: messages.SnapshotState) -> pb.SnapshotState:
    return pb.SnapshotState(
        latest_step=state.latest_step,
        held_bytes=state.held_bytes,
        in_progress=state.in_progress,
        achieved_interval_steps=state.achieved_interval_steps,
        held=[
            pb.HeldSnapshot(
                step=h.step,
                digest=h.digest,
                members=[
                    pb.MemberDigest(layer=m.layer, member=m.member, digest=m.digest)
                    for m in h.members
                ],
            )
            for h in state.held
        ],
    )


def decode_snapshot_state(
    msg: pb.SnapshotState, path: str = "SnapshotState"
) -> messages.SnapshotState:
    with errors.at(path):
        return messages.SnapshotState(
            latest_step=msg.latest_step if msg.HasField("latest_step") else None,
            held_bytes=msg.held_bytes,
            in_progress=msg.in_progress,
            achieved_interval_steps=msg.achieved_interval_steps,
            held=tuple(_decode_held(h, f"{path}.held[{i}]") for i, h in enumerate(msg.held)),
        )


def _decode_held(msg: pb.HeldSnapshot, path: str) -> messages.HeldSnapshot:
    with errors.at(path):
        members = tuple(
            messages.MemberDigest(layer=m.layer, member=m.member, digest=m.digest)
            for m in msg.members
        )
        return messages.HeldSnapshot(step=msg.step, digest=msg.digest, members=members)


def encode_latched_error(error: messages.LatchedError) -> pb.LatchedError:
    return pb.LatchedError(
        kind=ERROR_KINDS.encode(error.kind),
        message=error.message,
        step=error.step,
        peer_worker=error.peer_worker,
    )


def decode_latched_error(msg: pb.LatchedError, path: str = "LatchedError") -> messages.LatchedError:
    kind = ERROR_KINDS.decode(msg.kind, f"{path}.kind")
    with errors.at(path):
        return messages.LatchedError(
            kind=kind,
            message=msg.message,
            step=msg.step,
            peer_worker=plans.WorkerId(msg.peer_worker) if msg.HasField("peer_worker") else None,
        )


# ---- commands: Pause, Resume, Stop, TakeSnapshot, LoadSnapshot, and their answers -------------

# The responses that are an Acknowledgement, and the requests that carry only an epoch.
_Ack = TypeVar(
    "_Ack",
    pb.ConfigureResponse,
    pb.PauseResponse,
    pb.ResumeResponse,
    pb.StopResponse,
    pb.TakeSnapshotResponse,
    pb.LoadSnapshotResponse,
)
_EpochRequest = TypeVar("_EpochRequest", pb.PauseRequest, pb.ResumeRequest, pb.TakeSnapshotRequest)


def encode_acknowledgement(ack: messages.Acknowledgement, response_type: type[_Ack]) -> _Ack:
    return response_type(accepted=ack.accepted, reason=ack.reason)


def decode_acknowledgement(msg: _Ack) -> messages.Acknowledgement:
    with errors.at(type(msg).__name__):
        return messages.Acknowledgement(accepted=msg.accepted, reason=msg.reason)


def encode_epoch_command(epoch: int, request_type: type[_EpochRequest]) -> _EpochRequest:
    """A Pause, Resume or TakeSnapshot request for `epoch` (>= 1)."""
    _check(f"{request_type.__name__}.epoch", epoch >= 1, f"is {epoch}; give the epoch (>= 1)")
    return request_type(epoch=epoch)


def decode_epoch_command(msg: _EpochRequest) -> int:
    """The epoch a Pause, Resume or TakeSnapshot request is meant for."""
    name = type(msg).__name__
    _check(f"{name}.epoch", msg.epoch >= 1, f"is {msg.epoch}; give the epoch (>= 1)")
    return msg.epoch


def encode_stop_request(grace_s: float) -> pb.StopRequest:
    _check_grace(grace_s)
    return pb.StopRequest(grace_s=grace_s)


def decode_stop_request(msg: pb.StopRequest) -> float:
    """The grace period in seconds (>= 0)."""
    _check_grace(msg.grace_s)
    return msg.grace_s


def _check_grace(grace_s: float) -> None:
    ok = math.isfinite(grace_s) and 0 <= grace_s <= MAX_WAIT_S
    _check("StopRequest.grace_s", ok, f"is {grace_s}; give seconds >= 0 and <= {MAX_WAIT_S:g}")


def encode_load_snapshot(load: messages.SnapshotLoad) -> pb.LoadSnapshotRequest:
    return pb.LoadSnapshotRequest(epoch=load.epoch, step=load.step)


def decode_load_snapshot(msg: pb.LoadSnapshotRequest) -> messages.SnapshotLoad:
    with errors.at("LoadSnapshotRequest"):
        return messages.SnapshotLoad(epoch=msg.epoch, step=msg.step)


def encode_snapshot_status(state: messages.SnapshotState) -> pb.GetSnapshotStatusResponse:
    return pb.GetSnapshotStatusResponse(snapshot=encode_snapshot_state(state))


def decode_snapshot_status(msg: pb.GetSnapshotStatusResponse) -> messages.SnapshotState:
    if not msg.HasField("snapshot"):
        raise errors.missing("GetSnapshotStatusResponse", "snapshot")
    return decode_snapshot_state(msg.snapshot, "GetSnapshotStatusResponse.snapshot")


# ---- Profile -----------------------------------------------------------------------------------


def encode_profile_request(order: messages.ProfileOrder) -> pb.ProfileRequest:
    return pb.ProfileRequest(
        model=order.model,
        micro_batch_size=order.micro_batch_size,
        repeats=order.repeats,
        precision=PRECISIONS.encode(order.precision),
    )


def decode_profile_request(msg: pb.ProfileRequest) -> messages.ProfileOrder:
    arithmetic = PRECISIONS.decode(msg.precision, "ProfileRequest.precision")
    with errors.at("ProfileRequest"):
        return messages.ProfileOrder(
            model=msg.model,
            micro_batch_size=msg.micro_batch_size,
            repeats=msg.repeats,
            precision=arithmetic,
        )


def encode_profile_response(profile: profiles.Profile) -> pb.ProfileResponse:
    return pb.ProfileResponse(profile=planner_codec.encode_profile(profile))


def decode_profile_response(msg: pb.ProfileResponse) -> profiles.Profile:
    if not msg.HasField("profile"):
        raise errors.missing("ProfileResponse", "profile")
    return planner_codec.decode_profile(msg.profile, "ProfileResponse.profile")
