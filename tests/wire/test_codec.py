"""The codec translates every contract message and its dataclass both ways, and rejects bad input.

Covers: round trips (dataclass -> message -> bytes -> message -> dataclass equals the original) for
plans, layer transfers, worker configs (Configure, with either gradient reduction and every
precision), heartbeats (Watch), profiles, snapshot state, profile orders, snapshot loads,
acknowledgements and the one-value requests; every proto enum value has a dataclass member and back;
decoding malformed messages (missing sub-messages, empty or non-contiguous stages, inconsistent
plans, transfers to non-holders, unspecified and unknown enum values, out-of-range scalars) raises
the WireError subclass that names the field.
"""

from __future__ import annotations

import dataclasses
import math
from enum import StrEnum
from typing import TypeVar

import pytest
from google.protobuf.message import Message
from hypothesis import given
from hypothesis import strategies as st

from planaria.contract import plan as plans
from planaria.contract import profile as profiles
from planaria.v1 import agent_pb2 as pb
from planaria.wire import codec, errors, messages, planner_codec
from tests import strategies

M = TypeVar("M", bound=Message)


def _over_the_wire(msg: M) -> M:
    """Serialize and parse again, as the network would."""
    data = msg.SerializeToString()
    again = type(msg)()
    again.ParseFromString(data)
    assert again == msg
    return again


# ---- round trips -----------------------------------------------------------------------------


@given(strategies.plans())
def test_plans_survive_the_wire(plan: plans.Plan) -> None:
    msg = _over_the_wire(planner_codec.encode_plan(plan))
    assert planner_codec.decode_plan(msg) == plan


@given(strategies.worker_configs())
def test_worker_configs_survive_the_wire(config: messages.WorkerConfig) -> None:
    msg = _over_the_wire(codec.encode_worker_config(config))
    assert codec.decode_worker_config(msg) == config


@given(strategies.worker_configs())
def test_layer_transfers_survive_the_wire(config: messages.WorkerConfig) -> None:
    for transfer in config.transfers:
        msg = _over_the_wire(planner_codec.encode_transfer(transfer))
        assert planner_codec.decode_transfer(msg) == transfer


@given(strategies.heartbeats())
def test_heartbeats_survive_the_wire(heartbeat: messages.Heartbeat) -> None:
    msg = _over_the_wire(codec.encode_heartbeat(heartbeat))
    assert codec.decode_heartbeat(msg) == heartbeat


@given(strategies.profiles())
def test_profiles_survive_the_wire(profile: profiles.Profile) -> None:
    msg = _over_the_wire(codec.encode_profile_response(profile))
    assert codec.decode_profile_response(msg) == profile


@given(strategies.snapshot_states())
def test_snapshot_states_survive_the_wire(state: messages.SnapshotState) -> None:
    msg = _over_the_wire(codec.encode_snapshot_status(state))
    assert codec.decode_snapshot_status(msg) == state


@given(
    st.builds(
        messages.ProfileOrder,
        model=st.text(min_size=1),
        micro_batch_size=st.integers(min_value=1, max_value=2**32 - 1),
        repeats=st.integers(min_value=1, max_value=2**32 - 1),
    )
)
def test_profile_orders_survive_the_wire(order: messages.ProfileOrder) -> None:
    msg = _over_the_wire(codec.encode_profile_request(order))
    assert codec.decode_profile_request(msg) == order


@given(st.integers(min_value=1, max_value=2**64 - 1), st.integers(min_value=1, max_value=2**64 - 1))
def test_snapshot_loads_survive_the_wire(epoch: int, step: int) -> None:
    load = messages.SnapshotLoad(epoch=epoch, step=step)
    assert codec.decode_load_snapshot(_over_the_wire(codec.encode_load_snapshot(load))) == load


ACK_TYPES = (
    pb.ConfigureResponse,
    pb.PauseResponse,
    pb.ResumeResponse,
    pb.StopResponse,
    pb.TakeSnapshotResponse,
    pb.LoadSnapshotResponse,
)


@given(
    st.sampled_from(ACK_TYPES),
    st.just(messages.Acknowledgement(accepted=True))
    | st.builds(messages.Acknowledgement, accepted=st.just(False), reason=st.text(min_size=1)),
)
def test_acknowledgements_survive_the_wire(
    response_type: type[pb.ConfigureResponse], ack: messages.Acknowledgement
) -> None:
    msg = _over_the_wire(codec.encode_acknowledgement(ack, response_type))
    assert type(msg) is response_type
    assert codec.decode_acknowledgement(msg) == ack


@given(
    st.sampled_from((pb.PauseRequest, pb.ResumeRequest, pb.TakeSnapshotRequest)),
    st.integers(min_value=1, max_value=2**64 - 1),
)
def test_epoch_commands_survive_the_wire(request_type: type[pb.PauseRequest], epoch: int) -> None:
    msg = _over_the_wire(codec.encode_epoch_command(epoch, request_type))
    assert codec.decode_epoch_command(msg) == epoch


@given(st.floats(min_value=0.0, max_value=1e6))
def test_stop_and_watch_requests_survive_the_wire(seconds: float) -> None:
    stop = _over_the_wire(codec.encode_stop_request(seconds))
    assert codec.decode_stop_request(stop) == seconds
    interval = seconds + 1e-3
    watch = _over_the_wire(codec.encode_watch_request(interval))
    assert codec.decode_watch_request(watch) == interval


ENUMS = [
    (pb.AgentState, codec.STATES, messages.AgentState),
    (pb.ErrorKind, codec.ERROR_KINDS, messages.ErrorKind),
    (pb.RedundancyMode, codec.REDUNDANCY_MODES, messages.RedundancyMode),
    (pb.Reduction, codec.REDUCTIONS, messages.Reduction),
    (pb.Backend, codec.BACKENDS, messages.Backend),
    (pb.Device, codec.DEVICES, messages.Device),
]


@pytest.mark.parametrize(
    ("proto", "enum_codec", "domain"), ENUMS, ids=[d.__name__ for _, _, d in ENUMS]
)
def test_every_proto_enum_value_has_a_member_and_back(
    proto: type[pb.AgentState], enum_codec: codec._EnumCodec[StrEnum, int], domain: type[StrEnum]
) -> None:
    numbers = [number for number in proto.values() if number != 0]
    members = {enum_codec.decode(number, "field") for number in numbers}
    assert members == set(domain)
    assert sorted(enum_codec.encode(m) for m in domain) == sorted(numbers)


# ---- malformed messages ------------------------------------------------------------------------


def _config() -> messages.WorkerConfig:
    """Two pipelines of two stages over four layers on two GPUs per node; worker 1 receives
    layer 0 from worker 2 of the other pipeline."""
    w = plans.WorkerId

    def pipeline(first: int) -> plans.Pipeline:
        return plans.Pipeline(
            stages=(
                plans.Stage(layer_start=0, layer_stop=2, workers=(w(first),)),
                plans.Stage(layer_start=2, layer_stop=4, workers=(w(first + 1),)),
            ),
            num_micro_batches=2,
        )

    plan = plans.Plan(pipelines=(pipeline(0), pipeline(2)), micro_batch_size=4, gpus_per_node=1)
    return messages.WorkerConfig(
        epoch=3,
        worker=w(0),
        plan=plan,
        resume_step=10,
        rendezvous=messages.Rendezvous(
            store_host="127.0.0.1",
            store_port=29500,
            key_prefix="epoch-3",
            rank=0,
            world_size=4,
            backend=messages.Backend.GLOO,
            timeout_s=30.0,
        ),
        transfers=(plans.LayerTransfer(layer=0, destination=w(0), sources=(w(2),)),),
        settings=messages.TrainingSettings(
            model="tiny",
            seed=1,
            optimizer=messages.OptimizerSettings(lr=1e-3),
            global_batch_size=16,
            data=messages.DataSettings(corpus_paths=("corpus.txt",)),
            device=messages.Device.CPU,
            snapshot_interval_steps=5,
            redundancy=messages.RedundancyMode.COPY,
        ),
    )


def _configure_request() -> pb.ConfigureRequest:
    return codec.encode_worker_config(_config())


def test_the_fixed_config_is_valid_and_round_trips() -> None:
    assert codec.decode_worker_config(_over_the_wire(_configure_request())) == _config()


@pytest.mark.parametrize("reduction", list(messages.Reduction), ids=lambda r: f"{r} reduction")
def test_the_reduction_survives_the_wire(reduction: messages.Reduction) -> None:
    settings = dataclasses.replace(_config().settings, reduction=reduction)
    msg = _over_the_wire(codec.encode_settings(settings))
    assert codec.decode_settings(msg).reduction is reduction


@pytest.mark.parametrize("precision", list(messages.Precision), ids=lambda p: f"{p} precision")
def test_the_precision_survives_the_wire(precision: messages.Precision) -> None:
    settings = dataclasses.replace(_config().settings, precision=precision)
    msg = _over_the_wire(codec.encode_settings(settings))
    assert codec.decode_settings(msg).precision is precision


@pytest.mark.parametrize("field", ["plan", "rendezvous", "settings"])
def test_a_configure_request_without_its_sub_message_is_refused(field: str) -> None:
    msg = _configure_request()
    msg.ClearField(field)  # type: ignore[arg-type]
    with pytest.raises(errors.MissingFieldError, match=rf"^ConfigureRequest\.{field} is missing"):
        codec.decode_worker_config(msg)


@pytest.mark.parametrize("field", ["optimizer", "data"])
def test_settings_without_their_sub_message_are_refused(field: str) -> None:
    msg = _configure_request()
    msg.settings.ClearField(field)  # type: ignore[arg-type]
    with pytest.raises(errors.MissingFieldError, match=rf"ConfigureRequest\.settings\.{field}"):
        codec.decode_worker_config(msg)


def _refused(msg: pb.ConfigureRequest, error: type[errors.WireError], field: str) -> str:
    """Decode `msg`, expect `error` whose text starts with the field path; return the text."""
    with pytest.raises(error) as caught:
        codec.decode_worker_config(msg)
    assert str(caught.value).startswith(field), str(caught.value)
    assert isinstance(caught.value, ValueError)
    return str(caught.value)


def test_an_empty_layer_range_names_its_stage() -> None:
    msg = _configure_request()
    msg.plan.pipelines[1].stages[1].layer_start = 4
    text = _refused(msg, errors.InvalidValueError, "ConfigureRequest.plan.pipelines[1].stages[1]:")
    assert "[4, 4)" in text


def test_a_gap_between_stages_names_its_pipeline() -> None:
    msg = _configure_request()
    msg.plan.pipelines[0].stages[1].layer_start = 3
    text = _refused(msg, errors.InvalidValueError, "ConfigureRequest.plan.pipelines[0]:")
    assert "contiguous" in text


def test_pipelines_of_different_depths_are_refused() -> None:
    msg = _configure_request()
    msg.plan.pipelines[1].stages[1].layer_stop = 5
    _refused(msg, errors.InvalidValueError, "ConfigureRequest.plan:")


def test_a_plan_without_pipelines_is_refused() -> None:
    msg = _configure_request()
    msg.plan.ClearField("pipelines")
    _refused(msg, errors.InvalidValueError, "ConfigureRequest.plan:")


def test_a_worker_in_two_stages_is_refused() -> None:
    msg = _configure_request()
    msg.plan.pipelines[1].stages[0].workers[0] = 0
    _refused(msg, errors.InvalidValueError, "ConfigureRequest.plan:")


def test_an_unset_micro_batch_size_is_refused() -> None:
    msg = _configure_request()
    msg.plan.micro_batch_size = 0
    _refused(msg, errors.InvalidValueError, "ConfigureRequest.plan:")


def test_a_reroute_to_a_missing_pipeline_names_the_reroute() -> None:
    msg = _configure_request()
    msg.plan.reroutes.add(pipeline=0, stage=0, peer_pipeline=7, micro_batches=[0])
    _refused(msg, errors.InvalidValueError, "ConfigureRequest.plan:")


def test_a_transfer_from_its_own_destination_names_the_transfer() -> None:
    msg = _configure_request()
    msg.transfers[0].sources.append(0)
    _refused(msg, errors.InvalidValueError, "ConfigureRequest.transfers[0]:")


def test_a_transfer_without_sources_names_the_transfer() -> None:
    msg = _configure_request()
    msg.transfers[0].ClearField("sources")
    _refused(msg, errors.InvalidValueError, "ConfigureRequest.transfers[0]:")


def test_a_transfer_to_a_worker_that_does_not_hold_the_layer_is_refused() -> None:
    msg = _configure_request()
    msg.transfers[0].layer = 3
    text = _refused(msg, errors.InvalidValueError, "ConfigureRequest:")
    assert "does not hold that layer" in text


def test_a_transfer_of_a_layer_beyond_the_plan_is_refused() -> None:
    msg = _configure_request()
    msg.transfers[0].layer = 40
    text = _refused(msg, errors.InvalidValueError, "ConfigureRequest:")
    assert "the plan has 4 layers" in text


def test_a_global_batch_the_plan_does_not_make_is_refused() -> None:
    msg = _configure_request()
    msg.settings.global_batch_size = 17
    text = _refused(msg, errors.InvalidValueError, "ConfigureRequest:")
    assert "global batch" in text


def test_epoch_zero_is_refused() -> None:
    msg = _configure_request()
    msg.epoch = 0
    _refused(msg, errors.InvalidValueError, "ConfigureRequest:")


def test_a_rank_outside_the_world_is_refused() -> None:
    msg = _configure_request()
    msg.rendezvous.rank = 4
    _refused(msg, errors.InvalidValueError, "ConfigureRequest.rendezvous:")


def test_a_nan_timeout_is_refused() -> None:
    msg = _configure_request()
    msg.rendezvous.timeout_s = math.nan
    _refused(msg, errors.InvalidValueError, "ConfigureRequest.rendezvous:")


@pytest.mark.parametrize(
    ("message", "field", "path"),
    [
        ("rendezvous", "backend", "ConfigureRequest.rendezvous.backend"),
        ("settings", "device", "ConfigureRequest.settings.device"),
        ("settings", "redundancy", "ConfigureRequest.settings.redundancy"),
        ("settings", "reduction", "ConfigureRequest.settings.reduction"),
        ("settings", "precision", "ConfigureRequest.settings.precision"),
    ],
    ids=["backend", "device", "redundancy", "reduction", "precision"],
)
@pytest.mark.parametrize("value", [0, 99], ids=["unspecified", "unknown to this version"])
def test_an_enum_that_is(message: str, field: str, path: str, value: int) -> None:
    msg = _configure_request()
    setattr(getattr(msg, message), field, value)
    text = _refused(msg, errors.UnknownEnumError, path)
    assert ("UNSPECIFIED" in text) == (value == 0)


@given(strategies.worker_configs(), st.data())
def test_any_emptied_stage_range_is_refused_with_its_path(
    config: messages.WorkerConfig, data: st.DataObject
) -> None:
    msg = codec.encode_worker_config(config)
    p = data.draw(st.integers(min_value=0, max_value=len(msg.plan.pipelines) - 1))
    s = data.draw(st.integers(min_value=0, max_value=len(msg.plan.pipelines[p].stages) - 1))
    stage = msg.plan.pipelines[p].stages[s]
    stage.layer_stop = stage.layer_start
    path = f"ConfigureRequest.plan.pipelines[{p}].stages[{s}]:"
    _refused(msg, errors.InvalidValueError, path)


def _heartbeat() -> pb.WatchResponse:
    return codec.encode_heartbeat(
        messages.Heartbeat(
            worker=plans.WorkerId(2),
            epoch=1,
            state=messages.AgentState.RUNNING,
            last_committed_step=7,
            loss=2.5,
            samples_processed=112,
            timings=messages.Timings(forward_s=0.1, step_s=0.3),
            snapshot=messages.SnapshotState(latest_step=5, held_bytes=1024),
        )
    )


@pytest.mark.parametrize("field", ["timings", "snapshot"])
def test_a_heartbeat_without_its_sub_message_is_refused(field: str) -> None:
    msg = _heartbeat()
    msg.ClearField(field)  # type: ignore[arg-type]
    with pytest.raises(errors.MissingFieldError, match=rf"^WatchResponse\.{field} is missing"):
        codec.decode_heartbeat(msg)


def test_a_heartbeat_in_an_unspecified_state_is_refused() -> None:
    msg = _heartbeat()
    msg.state = pb.AGENT_STATE_UNSPECIFIED
    with pytest.raises(errors.UnknownEnumError, match=r"^WatchResponse\.state is AGENT_STATE_UNSP"):
        codec.decode_heartbeat(msg)


def test_a_latched_error_of_unspecified_kind_names_its_index() -> None:
    msg = _heartbeat()
    msg.errors.add(message="boom", step=7)
    with pytest.raises(errors.UnknownEnumError, match=r"^WatchResponse\.errors\[0\]\.kind"):
        codec.decode_heartbeat(msg)


def test_negative_timings_are_refused() -> None:
    msg = _heartbeat()
    msg.timings.backward_s = -1.0
    with pytest.raises(errors.InvalidValueError, match=r"^WatchResponse\.timings: .*backward_s"):
        codec.decode_heartbeat(msg)


def test_a_profile_response_without_a_profile_is_refused() -> None:
    with pytest.raises(errors.MissingFieldError, match=r"^ProfileResponse\.profile is missing"):
        codec.decode_profile_response(pb.ProfileResponse())


@given(strategies.profiles())
def test_a_profile_without_links_or_with_ragged_layers_is_refused(
    profile: profiles.Profile,
) -> None:
    msg = codec.encode_profile_response(profile)
    msg.profile.ClearField("inter_node")
    with pytest.raises(errors.MissingFieldError, match=r"ProfileResponse\.profile\.inter_node"):
        codec.decode_profile_response(msg)
    msg = codec.encode_profile_response(profile)
    msg.profile.layers[-1].backward_s.append(1.0)
    last = len(profile.layers) - 1
    with pytest.raises(errors.InvalidValueError, match=rf"profile\.layers\[{last}\]: "):
        codec.decode_profile_response(msg)


@pytest.mark.parametrize(
    ("decode", "msg", "path"),
    [
        (codec.decode_watch_request, pb.WatchRequest(), "WatchRequest.interval_s"),
        (codec.decode_watch_request, pb.WatchRequest(interval_s=math.inf), "WatchRequest"),
        (codec.decode_watch_request, pb.WatchRequest(interval_s=1e12), "WatchRequest"),
        (codec.decode_stop_request, pb.StopRequest(grace_s=1e12), "StopRequest.grace_s"),
        (codec.decode_stop_request, pb.StopRequest(grace_s=-1.0), "StopRequest.grace_s"),
        (codec.decode_epoch_command, pb.PauseRequest(), "PauseRequest.epoch"),
        (codec.decode_load_snapshot, pb.LoadSnapshotRequest(epoch=1), "LoadSnapshotRequest"),
        (codec.decode_profile_request, pb.ProfileRequest(model="tiny"), "ProfileRequest"),
        (codec.decode_acknowledgement, pb.StopResponse(), "StopResponse"),
        (codec.decode_snapshot_status, pb.GetSnapshotStatusResponse(), "GetSnapshotStatusRes"),
    ],
    ids=[
        "a zero heartbeat interval",
        "an infinite heartbeat interval",
        "a heartbeat interval past any wait",
        "a grace period past any wait",
        "a negative grace period",
        "a pause for epoch zero",
        "a snapshot load of step zero",
        "a profile order of zero samples",
        "a refusal without a reason",
        "a snapshot status without the state",
    ],
)
def test_requests_and_responses_refuse(decode: object, msg: Message, path: str) -> None:
    assert callable(decode)
    with pytest.raises(errors.WireError, match=rf"^{path}"):
        decode(msg)


@pytest.mark.parametrize(
    "encode",
    [
        lambda: codec.encode_watch_request(0.0),
        lambda: codec.encode_stop_request(math.nan),
        lambda: codec.encode_epoch_command(0, pb.ResumeRequest),
    ],
    ids=["a zero heartbeat interval", "a NaN grace period", "a resume for epoch zero"],
)
def test_encoding_refuses_one_value_requests_that_would_be_malformed(encode: object) -> None:
    assert callable(encode)
    with pytest.raises(errors.InvalidValueError):
        encode()
