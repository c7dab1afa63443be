"""Campaign 3: malformed requests to the agent's gRPC service, as raw bytes on loopback.

`AgentUnderTest` serves `planaria.agent.server.service`'s AgentService exactly as `serve` registers
it (requests parsed from bytes by the service itself) plus the standard health service, over a
real `planaria.agent.runtime.runtime.Runtime` whose training thread is not started: commands go
through the runtime's real acceptance rules, and a Configure it accepts stays pending, so no
rendezvous is ever attempted and a Profile is refused as busy (the runtime is configured once
on start for exactly that reason).

`judge` sends one request's bytes to one method through a raw channel (no serializer) and
checks the status against `ALLOWED`: OK, INVALID_ARGUMENT with a one-line message that names
the request message (and so its field path), or FAILED_PRECONDITION where the state machine
refuses a well-formed request. UNKNOWN and INTERNAL (an exception in the servicer) are crashes,
as is a Watch stream that fails after it started. `valid_requests` gives one well-formed
encoding per method, the seeds of the prefix and mutation campaigns.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from types import TracebackType

import grpc
from google.protobuf import message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from planaria.agent.runtime import runtime
from planaria.agent.server import service
from planaria.contract import plan
from planaria.v1 import agent_pb2 as pb
from planaria.wire import codec, messages
from tests import strategies
from tests.fuzz import verdicts

Code = grpc.StatusCode
METHODS = {m.name: m for m in pb.DESCRIPTOR.services_by_name["AgentService"].methods}
_CLEAN = frozenset({Code.OK, Code.INVALID_ARGUMENT})
# Status codes each method may answer malformed or unwelcome input with.
ALLOWED: dict[str, frozenset[grpc.StatusCode]] = {name: _CLEAN for name in METHODS} | {
    "Profile": _CLEAN | {Code.FAILED_PRECONDITION},  # a busy agent refuses to profile
    "Watch": _CLEAN | {Code.DEADLINE_EXCEEDED},  # our deadline, on a slow heartbeat interval
}
WORKER = plan.WorkerId(0)
WATCH_DEADLINE_S = 0.3


def worker_config(epoch: int = 1) -> messages.WorkerConfig:
    """A well-formed configuration of worker 0 in a 2x2 grid, with one layer transfer."""
    grid = strategies.grid_plan(2, (2,), 4, 2)
    return messages.WorkerConfig(
        epoch=epoch,
        worker=WORKER,
        plan=grid,
        resume_step=3,
        stop_step=90,
        rendezvous=messages.Rendezvous(
            store_host="127.0.0.1",
            store_port=29400,
            key_prefix=f"epoch-{epoch}",
            rank=0,
            world_size=4,
            backend=messages.Backend.GLOO,
            timeout_s=30.0,
        ),
        transfers=(plan.LayerTransfer(layer=1, destination=WORKER, sources=(plan.WorkerId(2),)),),
        settings=messages.TrainingSettings(
            model="tiny",
            seed=7,
            optimizer=messages.OptimizerSettings(lr=3e-4, weight_decay=0.1),
            global_batch_size=grid.global_batch_size,
            data=messages.DataSettings(corpus_paths=("corpus.txt",), max_bytes=1 << 20),
            device=messages.Device.CPU,
            snapshot_interval_steps=2,
            redundancy=messages.RedundancyMode.XOR,
            checkpoint_dir="/ckpt",
            checkpoint_interval_steps=4,
        ),
    )


def valid_requests() -> dict[str, message.Message]:
    """One well-formed request per AgentService method."""
    load = messages.SnapshotLoad(epoch=2, step=3)
    order = messages.ProfileOrder(model="tiny", micro_batch_size=2, repeats=3)
    return {
        "Configure": codec.encode_worker_config(worker_config(epoch=2)),
        "Watch": codec.encode_watch_request(0.05),
        "Pause": codec.encode_epoch_command(1, pb.PauseRequest),
        "Resume": codec.encode_epoch_command(1, pb.ResumeRequest),
        "Stop": codec.encode_stop_request(1.0),
        "Profile": codec.encode_profile_request(order),
        "TakeSnapshot": codec.encode_epoch_command(1, pb.TakeSnapshotRequest),
        "GetSnapshotStatus": pb.GetSnapshotStatusRequest(),
        "LoadSnapshot": codec.encode_load_snapshot(load),
    }


class AgentUnderTest:
    """The agent's gRPC server in this process on 127.0.0.1:0 and a raw channel to it."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="planaria-fuzz-")
        self.runtime = runtime.Runtime(
            worker=WORKER, job="fuzz", snapshot_base=Path(self._dir.name)
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        service.add_to_server(service.AgentServicer(self.runtime, threading.Event()), self.server)
        checker = health.HealthServicer()
        checker.set("", health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(checker, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        accepted = self.runtime.configure(worker_config(epoch=1))
        assert accepted.accepted, accepted.reason

    def __enter__(self) -> AgentUnderTest:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.channel.close()
        self.server.stop(1).wait()
        self.runtime.close()
        self._dir.cleanup()

    def healthy(self) -> bool:
        """Whether the server still answers the standard health check with SERVING."""
        stub = health_pb2_grpc.HealthStub(self.channel)
        answer = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)

    def call(self, method: str, raw: bytes) -> tuple[grpc.StatusCode, str]:
        """Send `raw` to `method`; the status code and its details."""
        path = f"/{service.SERVICE}/{method}"
        try:
            if METHODS[method].server_streaming:
                return self._watch(path, raw)
            call = self.channel.unary_unary(
                path, request_serializer=None, response_deserializer=None
            )
            call(raw, timeout=10)
        except grpc.RpcError as exc:
            error: grpc.Call = exc  # type: ignore[assignment]  # grpc's errors are its calls
            return error.code(), error.details() or ""
        return Code.OK, ""

    def _watch(self, path: str, raw: bytes) -> tuple[grpc.StatusCode, str]:
        """Read two heartbeats (a stream failing after its first one shows up here)."""
        call = self.channel.unary_stream(path, request_serializer=None, response_deserializer=None)
        stream = call(raw, timeout=WATCH_DEADLINE_S)
        try:
            heartbeats = iter(stream)
            next(heartbeats, None)
            next(heartbeats, None)
        finally:
            stream.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leave it unannotated
        return Code.OK, ""


def judge(agent: AgentUnderTest, method: str, raw: bytes) -> verdicts.Verdict:
    """One request's bytes to one method: an allowed status with a clear message, or a crash."""
    code, details = agent.call(method, raw)
    if code not in ALLOWED[method]:
        return verdicts.crashed(f"{method} answered {code.name}: {details[:300]}")
    if code is Code.INVALID_ARGUMENT:
        name = METHODS[method].input_type.name
        if not details.startswith(name) or "\n" in details:
            return verdicts.crashed(f"{method}: unclear INVALID_ARGUMENT {details[:300]!r}")
        return verdicts.rejected(details)
    if code is not Code.OK:
        return verdicts.rejected(f"{code.name}: {details}")
    return verdicts.ACCEPTED


def prefixes(raw: bytes) -> Iterator[bytes]:
    """Every proper prefix of `raw`, the empty one included."""
    return (raw[:n] for n in range(len(raw)))


def bit_flips(raw: bytes) -> Iterator[bytes]:
    """`raw` with each one of its bits flipped in turn."""
    for bit in range(len(raw) * 8):
        flipped = bytearray(raw)
        flipped[bit // 8] ^= 1 << (bit % 8)
        yield bytes(flipped)
