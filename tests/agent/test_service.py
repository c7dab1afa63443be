"""The agent's gRPC servicer over a fake runtime, served in-process on loopback.

Covers: every command reaches the runtime decoded and its Acknowledgement comes back (a refusal
keeps its reason); malformed requests (missing sub-messages, epoch 0, negative grace, a zero
interval, a load of step 0) fail with INVALID_ARGUMENT naming the field and never reach the
runtime; a busy agent's Profile is FAILED_PRECONDITION; Watch sends heartbeats at the interval
and ends once the agent stops; Stop sets the stopping event the process waits on; `serve`
writes its ready file, answers health SERVING, and on Stop turns NOT_SERVING while the runtime
stops, then stops the server and returns 0.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from planaria.agent.server import service
from planaria.contract import plan, profile
from planaria.v1 import agent_pb2 as pb
from planaria.v1 import agent_pb2_grpc
from planaria.wire import codec, messages


class _FakeRuntime:
    """Records the commands; refuses Pause with a reason; Profile is always busy."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def _ack(self, name: str, argument: object) -> messages.Acknowledgement:
        self.calls.append((name, argument))
        return messages.Acknowledgement(accepted=True)

    def configure(self, config: messages.WorkerConfig) -> messages.Acknowledgement:
        return self._ack("configure", config)

    def heartbeat(self) -> messages.Heartbeat:
        return messages.Heartbeat(
            worker=plan.WorkerId(2),
            epoch=1,
            state=messages.AgentState.RUNNING,
            last_committed_step=len(self.calls),
            loss=None if not self.calls else 1.5,
            samples_processed=0,
            timings=messages.Timings(),
            snapshot=messages.SnapshotState(),
        )

    def pause(self, epoch: int) -> messages.Acknowledgement:
        self.calls.append(("pause", epoch))
        return messages.Acknowledgement(accepted=False, reason="stale epoch 1")

    def resume(self, epoch: int) -> messages.Acknowledgement:
        return self._ack("resume", epoch)

    def stop(self, grace_s: float) -> messages.Acknowledgement:
        return self._ack("stop", grace_s)

    def take_snapshot(self, epoch: int) -> messages.Acknowledgement:
        return self._ack("take_snapshot", epoch)

    def snapshot_state(self) -> messages.SnapshotState:
        return messages.SnapshotState(latest_step=4, held_bytes=10)

    def load_snapshot(self, load: messages.SnapshotLoad) -> messages.Acknowledgement:
        return self._ack("load_snapshot", load)

    def profile(self, order: messages.ProfileOrder) -> profile.Profile:
        raise ValueError("training: profile when idle")

    crashed = False  # RuntimeLike: this fake never stops by itself

    def wait_stopped(self, timeout_s: float | None = None) -> bool:
        return True

    def close(self) -> None:
        pass


class _Stub(agent_pb2_grpc.AgentServiceStub):
    """The generated stub, keeping its channel for raw calls."""

    def __init__(self, channel: grpc.Channel) -> None:
        super().__init__(channel)  # type: ignore[call-arg]  # the generated .pyi omits it
        self.channel = channel


@pytest.fixture
def served() -> Iterator[tuple[_FakeRuntime, _Stub, threading.Event]]:
    runtime, stopping = _FakeRuntime(), threading.Event()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    service.add_to_server(service.AgentServicer(runtime, stopping), server)
    checker = health.HealthServicer()
    checker.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield runtime, _Stub(channel), stopping
    finally:
        channel.close()
        server.stop(1).wait()


Served = tuple[_FakeRuntime, "_Stub", threading.Event]


def test_commands_reach_the_runtime_and_answers_come_back(served: Served) -> None:
    runtime, stub, stopping = served
    assert stub.Resume(pb.ResumeRequest(epoch=3), timeout=5).accepted
    refused = stub.Pause(pb.PauseRequest(epoch=3), timeout=5)
    assert not refused.accepted and refused.reason == "stale epoch 1"
    assert stub.TakeSnapshot(pb.TakeSnapshotRequest(epoch=3), timeout=5).accepted
    status = stub.GetSnapshotStatus(pb.GetSnapshotStatusRequest(), timeout=5)
    assert codec.decode_snapshot_status(status).latest_step == 4
    assert stub.LoadSnapshot(pb.LoadSnapshotRequest(epoch=3, step=2), timeout=5).accepted
    assert not stopping.is_set()
    assert stub.Stop(pb.StopRequest(grace_s=2.0), timeout=5).accepted
    assert stopping.is_set()
    assert runtime.calls == [
        ("resume", 3),
        ("pause", 3),
        ("take_snapshot", 3),
        ("load_snapshot", messages.SnapshotLoad(epoch=3, step=2)),
        ("stop", 2.0),
    ]


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda s: s.Configure(pb.ConfigureRequest(epoch=1), timeout=5), "ConfigureRequest.plan"),
        (lambda s: s.Pause(pb.PauseRequest(epoch=0), timeout=5), "PauseRequest.epoch"),
        (lambda s: s.Stop(pb.StopRequest(grace_s=-1.0), timeout=5), "StopRequest.grace_s"),
        (lambda s: s.Watch(pb.WatchRequest(interval_s=0.0), timeout=5).next(), "interval_s"),
        (
            lambda s: s.LoadSnapshot(pb.LoadSnapshotRequest(epoch=1, step=0), timeout=5),
            "step",
        ),
    ],
)
def test_malformed_requests_are_invalid_argument_and_never_reach_the_runtime(
    served: Served, call: object, field: str
) -> None:
    runtime, stub, _ = served
    with pytest.raises(grpc.RpcError) as raised:
        call(stub)  # type: ignore[operator]
    error: grpc.Call = raised.value  # type: ignore[assignment]
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert field in (error.details() or "")
    assert runtime.calls == []


@pytest.mark.parametrize("method", ["Configure", "Pause", "Watch"])
def test_truncated_requests_are_invalid_argument(served: Served, method: str) -> None:
    runtime, stub, _ = served
    whole = {
        "Configure": pb.ConfigureRequest(epoch=300, plan=pb.Plan(micro_batch_size=2)),
        "Pause": pb.PauseRequest(epoch=300),
        "Watch": pb.WatchRequest(interval_s=0.5),
    }[method].SerializeToString()
    channel = stub.channel
    path = f"/{service.SERVICE}/{method}"
    make = channel.unary_stream if method == "Watch" else channel.unary_unary
    call = make(path, request_serializer=None, response_deserializer=None)
    with pytest.raises(grpc.RpcError) as raised:
        answer = call(whole[:-1], timeout=5)
        if method == "Watch":
            next(iter(answer))
    error: grpc.Call = raised.value  # type: ignore[assignment]
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert "do not parse" in (error.details() or "")
    assert runtime.calls == []


def test_a_busy_agent_refuses_to_profile(served: Served) -> None:
    _, stub, _ = served
    order = codec.encode_profile_request(
        messages.ProfileOrder(model="tiny", micro_batch_size=1, repeats=1)
    )
    with pytest.raises(grpc.RpcError) as raised:
        stub.Profile(order, timeout=5)
    error: grpc.Call = raised.value  # type: ignore[assignment]
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION


def test_watch_streams_until_the_agent_stops(served: Served) -> None:
    _, stub, stopping = served
    started = time.monotonic()  # before the call: the server may send its first beat at once
    stream = iter(stub.Watch(pb.WatchRequest(interval_s=0.05), timeout=10))
    beats = [codec.decode_heartbeat(next(stream)) for _ in range(4)]
    # the first at once, then one per interval: three waits of 0.05 s at least (a lower bound
    # on sleeps, which no load can break; the call's timeout bounds it from above)
    assert time.monotonic() - started >= 3 * 0.05 - 1e-9
    assert {b.worker for b in beats} == {2}
    stopping.set()
    assert len(list(stream)) <= 1  # at most the heartbeat already on its way, then the end


class _SlowStop(_FakeRuntime):
    """wait_stopped blocks until released, so the test can look at the agent while it stops."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def wait_stopped(self, timeout_s: float | None = None) -> bool:
        return self.release.wait(timeout_s)


def _health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service.SERVICE), timeout=5
        )
    return int(answer.status)


def test_stop_turns_health_not_serving_stops_the_runtime_then_the_server(tmp_path: Path) -> None:
    runtime, ready = _SlowStop(), tmp_path / "ready"
    options = service.Options(worker=plan.WorkerId(2), job="j", ready_file=ready, grace_s=0.5)
    exit_codes: list[int] = []
    thread = threading.Thread(target=lambda: exit_codes.append(service.serve(options, runtime)))
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not ready.exists():
            assert time.monotonic() < deadline, "no ready file"
            time.sleep(0.02)
        address = ready.read_text().strip()
        assert _health(address) == health_pb2.HealthCheckResponse.SERVING
        with grpc.insecure_channel(address) as channel:
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            assert stub.Stop(pb.StopRequest(grace_s=0.5), timeout=5).accepted
        while _health(address) != health_pb2.HealthCheckResponse.NOT_SERVING:
            assert time.monotonic() < deadline, "health never turned NOT_SERVING"
            time.sleep(0.02)
        assert thread.is_alive()  # the server waits for the runtime to stop
    finally:
        runtime.release.set()
        thread.join(10)
    assert exit_codes == [0]
    assert [name for name, _ in runtime.calls] == ["stop", "stop"]


class _Crashed(_FakeRuntime):
    """A runtime whose training thread failed (a bug): stopped, with no Stop."""

    crashed = True


def test_an_agent_whose_training_thread_failed_exits_for_its_supervisor(tmp_path: Path) -> None:
    # It could never train again (it refuses every Configure): serving on, it would be a live
    # worker the controller gives up on forever; exiting lets the kubelet or the local
    # backend restart it.
    options = service.Options(worker=plan.WorkerId(2), job="j", grace_s=0.5)
    assert service.serve(options, _Crashed()) == service.EXIT_CRASHED
