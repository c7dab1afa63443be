"""The contract over a real gRPC channel: a tiny servicer defined here, served on 127.0.0.1:0.

Covers: Configure carries a WorkerConfig across and is accepted; Watch streams heartbeats that
decode to the configured worker and epoch with increasing steps, and the client reads three and
cancels; a malformed Configure fails with INVALID_ARGUMENT whose details name the field (the
WireError mapping every servicer follows); RPCs the servicer leaves out answer UNIMPLEMENTED; the
standard grpc.health.v1 service answers SERVING for the server and for AgentService. The server
is always stopped with a grace period.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from planaria.contract import plan as plans
from planaria.v1 import agent_pb2 as pb
from planaria.v1 import agent_pb2_grpc
from planaria.wire import codec, errors, messages

SERVICE = pb.DESCRIPTOR.services_by_name["AgentService"].full_name
TIMEOUT_S = 5.0


class _Agent(agent_pb2_grpc.AgentServiceServicer):
    """Configure stores the decoded config; Watch reports a fake step per heartbeat. The other
    RPCs are left to the generated base class, which answers UNIMPLEMENTED."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.config: messages.WorkerConfig | None = None

    def Configure(
        self, request: pb.ConfigureRequest, context: grpc.ServicerContext
    ) -> pb.ConfigureResponse:
        try:
            config = codec.decode_worker_config(request)
        except errors.WireError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        with self._lock:
            self.config = config
        ack = messages.Acknowledgement(accepted=True)
        return codec.encode_acknowledgement(ack, pb.ConfigureResponse)

    def Watch(
        self, request: pb.WatchRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.WatchResponse]:
        interval_s = codec.decode_watch_request(request)
        with self._lock:
            config = self.config
        assert config is not None, "the test configures before it watches"
        stopped = threading.Event()
        context.add_callback(stopped.set)
        for step in itertools.count(config.resume_step + 1):
            if stopped.is_set():
                return
            yield codec.encode_heartbeat(_heartbeat(config, step))
            stopped.wait(interval_s)


def _heartbeat(config: messages.WorkerConfig, step: int) -> messages.Heartbeat:
    return messages.Heartbeat(
        worker=config.worker,
        epoch=config.epoch,
        state=messages.AgentState.RUNNING,
        last_committed_step=step,
        loss=1.0 / step,
        samples_processed=step * config.settings.global_batch_size,
        timings=messages.Timings(forward_s=0.01, backward_s=0.02, step_s=0.04),
        snapshot=messages.SnapshotState(),
    )


def _config() -> messages.WorkerConfig:
    stage = plans.Stage(layer_start=0, layer_stop=6, workers=(plans.WorkerId(1),))
    plan = plans.Plan(
        pipelines=(plans.Pipeline(stages=(stage,), num_micro_batches=4),), micro_batch_size=2
    )
    return messages.WorkerConfig(
        epoch=2,
        worker=plans.WorkerId(1),
        plan=plan,
        resume_step=40,
        rendezvous=messages.Rendezvous(
            store_host="127.0.0.1",
            store_port=29400,
            key_prefix="epoch-2",
            rank=0,
            world_size=1,
            backend=messages.Backend.GLOO,
            timeout_s=30.0,
        ),
        transfers=(),
        settings=messages.TrainingSettings(
            model="tiny",
            seed=7,
            optimizer=messages.OptimizerSettings(lr=3e-4, weight_decay=0.1),
            global_batch_size=8,
            data=messages.DataSettings(corpus_paths=("corpus.txt",), max_bytes=1 << 20),
            device=messages.Device.CPU,
            snapshot_interval_steps=10,
            redundancy=messages.RedundancyMode.XOR,
        ),
    )


@pytest.fixture(scope="module")
def agent() -> Iterator[tuple[_Agent, grpc.Channel]]:
    """A server with the test servicer and the health service, and a channel to it."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    # The stubs mark every RPC abstract; at run time the generated base answers UNIMPLEMENTED.
    servicer = _Agent()  # type: ignore[abstract]
    agent_pb2_grpc.add_AgentServiceServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield servicer, channel
    finally:
        channel.close()
        assert server.stop(grace=1.0).wait(timeout=TIMEOUT_S)


def test_configure_then_watch_three_heartbeats(agent: tuple[_Agent, grpc.Channel]) -> None:
    servicer, channel = agent
    stub = agent_pb2_grpc.AgentServiceStub(channel)
    config = _config()
    reply = stub.Configure(codec.encode_worker_config(config), timeout=TIMEOUT_S)
    assert codec.decode_acknowledgement(reply) == messages.Acknowledgement(accepted=True)
    assert servicer.config == config
    stream = stub.Watch(codec.encode_watch_request(0.01), timeout=TIMEOUT_S)
    beats = [codec.decode_heartbeat(msg) for msg in itertools.islice(stream, 3)]
    stream.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leave cancel() unannotated
    assert [b.last_committed_step for b in beats] == [41, 42, 43]
    assert {(b.worker, b.epoch, b.state) for b in beats} == {(1, 2, messages.AgentState.RUNNING)}
    assert beats[-1].samples_processed == 43 * 8


def test_a_malformed_configure_is_an_invalid_argument(agent: tuple[_Agent, grpc.Channel]) -> None:
    _, channel = agent
    stub = agent_pb2_grpc.AgentServiceStub(channel)
    request = codec.encode_worker_config(_config())
    request.plan.pipelines[0].stages[0].layer_stop = 0
    with pytest.raises(grpc.RpcError) as caught:
        stub.Configure(request, timeout=TIMEOUT_S)
    call: grpc.Call = caught.value  # type: ignore[assignment]
    assert call.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert call.details().startswith("ConfigureRequest.plan.pipelines[0].stages[0]:")


def test_an_rpc_the_servicer_leaves_out_is_unimplemented(
    agent: tuple[_Agent, grpc.Channel],
) -> None:
    _, channel = agent
    stub = agent_pb2_grpc.AgentServiceStub(channel)
    with pytest.raises(grpc.RpcError) as caught:
        stub.Pause(codec.encode_epoch_command(2, pb.PauseRequest), timeout=TIMEOUT_S)
    call: grpc.Call = caught.value  # type: ignore[assignment]
    assert call.code() is grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.parametrize("service", ["", SERVICE], ids=["the server", "AgentService"])
def test_the_health_service_answers_serving_for(
    agent: tuple[_Agent, grpc.Channel], service: str
) -> None:
    _, channel = agent
    stub = health_pb2_grpc.HealthStub(channel)
    reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT_S)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
