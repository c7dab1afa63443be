"""The agent's gRPC service: planaria.v1 AgentService over a `runtime.Runtime`, and the process.

    serve(Options(worker=3, job="demo", listen="127.0.0.1:0", ready_file=path))

`AgentServicer` is a thin translation: it decodes every request with the codec (a `WireError`
becomes INVALID_ARGUMENT with the field path, and `add_to_server` parses the request bytes itself
so that a truncated message is INVALID_ARGUMENT too, not grpc's INTERNAL; neither reaches the
runtime), calls the runtime and encodes its answer. Well-formed commands the runtime cannot
carry out come back as `accepted = false` with its reason; a Profile asked of a busy agent is
FAILED_PRECONDITION.

The server is grpc's synchronous server on a thread pool: the runtime is thread-based (its
training thread owns the torch state and every command only sets a request under a lock), so
each RPC is a plain blocking call and a Watch stream is one thread sleeping between heartbeats.

Watch sends `runtime.heartbeat()` every interval until the client cancels or the agent stops.
The standard health service (grpc.health.v1) reports SERVING for "" and AgentService while the
agent serves and NOT_SERVING once it stops.

Shutdown: a Stop RPC or SIGTERM/SIGINT marks health NOT_SERVING, stops the runtime within the
grace period (the step in flight may finish), ends the Watch streams, then stops the server with
the same grace; `serve` returns 0. The address actually bound (port 0 picks a free one) is
written to `ready_file` atomically (temp file + rename) once the server is up.

Mutual TLS (issue #10): with `Options.tls_dir` (ca.crt, tls.crt, tls.key, as
`planaria.rpc.tls.agent_files` writes them) the port is TLS only and requires a client
certificate of the job's CA, and only the job's controller may call AgentService
(`planaria.agent.server.mtls`); the health service shares the port. `tls_dir=None` serves plaintext;
`planaria agent` asks for --insecure to do that.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, TypeVar

import grpc
from google.protobuf import message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from planaria.agent.server import mtls
from planaria.contract import plan, profile
from planaria.v1 import agent_pb2 as pb
from planaria.v1 import agent_pb2_grpc
from planaria.wire import codec, errors, messages

LOG = logging.getLogger(__name__)
SERVICE = pb.DESCRIPTOR.services_by_name["AgentService"].full_name
RPC_THREADS = 16  # concurrent RPCs: a few Watch streams plus commands
DEFAULT_GRACE_S = 5.0  # SIGTERM's grace period for the step in flight
_M = TypeVar("_M")
_T = TypeVar("_T")


class RuntimeLike(Protocol):
    """What the servicer needs of `planaria.agent.runtime.runtime.Runtime`."""

    def configure(self, config: messages.WorkerConfig) -> messages.Acknowledgement: ...
    def heartbeat(self) -> messages.Heartbeat: ...
    def pause(self, epoch: int) -> messages.Acknowledgement: ...
    def resume(self, epoch: int) -> messages.Acknowledgement: ...
    def stop(self, grace_s: float) -> messages.Acknowledgement: ...
    def take_snapshot(self, epoch: int) -> messages.Acknowledgement: ...
    def snapshot_state(self) -> messages.SnapshotState: ...
    def load_snapshot(self, load: messages.SnapshotLoad) -> messages.Acknowledgement: ...
    def profile(self, order: messages.ProfileOrder) -> profile.Profile: ...
    def wait_stopped(self, timeout_s: float | None = None) -> bool: ...
    def close(self) -> None: ...
    @property
    def crashed(self) -> bool:
        """Whether the runtime stopped by itself: its training thread failed (a bug)."""


class AgentServicer(agent_pb2_grpc.AgentServiceServicer):
    """AgentService over a runtime. `stopping` is set when the agent stops (Stop or a signal):
    Watch streams end and `serve` shuts the server down."""

    def __init__(self, runtime: RuntimeLike, stopping: threading.Event) -> None:
        self._runtime = runtime
        self._stopping = stopping

    def Configure(
        self, request: pb.ConfigureRequest, context: grpc.ServicerContext
    ) -> pb.ConfigureResponse:
        config = _decoded(context, codec.decode_worker_config, request)
        return codec.encode_acknowledgement(self._runtime.configure(config), pb.ConfigureResponse)

    def Watch(
        self, request: pb.WatchRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.WatchResponse]:
        interval_s = _decoded(context, codec.decode_watch_request, request)
        ended = threading.Event()
        context.add_callback(ended.set)
        while not ended.is_set():
            yield codec.encode_heartbeat(self._runtime.heartbeat())
            if self._stopping.is_set():
                return
            ended.wait(interval_s)

    def Pause(self, request: pb.PauseRequest, context: grpc.ServicerContext) -> pb.PauseResponse:
        epoch = _decoded(context, codec.decode_epoch_command, request)
        return codec.encode_acknowledgement(self._runtime.pause(epoch), pb.PauseResponse)

    def Resume(self, request: pb.ResumeRequest, context: grpc.ServicerContext) -> pb.ResumeResponse:
        epoch = _decoded(context, codec.decode_epoch_command, request)
        return codec.encode_acknowledgement(self._runtime.resume(epoch), pb.ResumeResponse)

    def Stop(self, request: pb.StopRequest, context: grpc.ServicerContext) -> pb.StopResponse:
        grace_s = _decoded(context, codec.decode_stop_request, request)
        ack = self._runtime.stop(grace_s)
        if ack.accepted:
            self._stopping.set()
        return codec.encode_acknowledgement(ack, pb.StopResponse)

    def Profile(
        self, request: pb.ProfileRequest, context: grpc.ServicerContext
    ) -> pb.ProfileResponse:
        order = _decoded(context, codec.decode_profile_request, request)
        try:
            measured = self._runtime.profile(order)
        except ValueError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return codec.encode_profile_response(measured)

    def TakeSnapshot(
        self, request: pb.TakeSnapshotRequest, context: grpc.ServicerContext
    ) -> pb.TakeSnapshotResponse:
        epoch = _decoded(context, codec.decode_epoch_command, request)
        ack = self._runtime.take_snapshot(epoch)
        return codec.encode_acknowledgement(ack, pb.TakeSnapshotResponse)

    def GetSnapshotStatus(
        self, request: pb.GetSnapshotStatusRequest, context: grpc.ServicerContext
    ) -> pb.GetSnapshotStatusResponse:
        return codec.encode_snapshot_status(self._runtime.snapshot_state())

    def LoadSnapshot(
        self, request: pb.LoadSnapshotRequest, context: grpc.ServicerContext
    ) -> pb.LoadSnapshotResponse:
        load = _decoded(context, codec.decode_load_snapshot, request)
        ack = self._runtime.load_snapshot(load)
        return codec.encode_acknowledgement(ack, pb.LoadSnapshotResponse)


def add_to_server(servicer: AgentServicer, server: grpc.Server) -> None:
    """Register `servicer` like the generated `add_AgentServiceServicer_to_server`, except that
    requests arrive as bytes and are parsed here: grpc answers bytes that do not parse (a
    truncated message) with INTERNAL, the contract says INVALID_ARGUMENT."""
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name["AgentService"].methods:
        behaviour = _parsing(getattr(servicer, method.name), getattr(pb, method.input_type.name))
        make = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[method.name] = make(behaviour, response_serializer=_serialized)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


def _parsing(
    call: Callable[[Any, grpc.ServicerContext], _T], request_type: Any
) -> Callable[[bytes, grpc.ServicerContext], _T]:
    def behaviour(raw: bytes, context: grpc.ServicerContext) -> _T:
        try:
            request = request_type.FromString(raw)
        except message.DecodeError as exc:
            name = request_type.DESCRIPTOR.name
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{name}: {len(raw)} bytes do not parse ({exc}); send a whole {name}",
            )
        return call(request, context)

    return behaviour


def _serialized(answer: Any) -> bytes:
    return bytes(answer.SerializeToString())


def _decoded(context: grpc.ServicerContext, decode: Callable[[_M], _T], request: _M) -> _T:
    """`decode(request)`, or abort the RPC with INVALID_ARGUMENT naming the bad field."""
    try:
        return decode(request)
    except errors.WireError as exc:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    """How to run one agent process (the `planaria agent` flags)."""

    worker: plan.WorkerId
    job: str
    listen: str = "127.0.0.1:0"
    snapshot_base: Path = Path("/dev/shm/planaria")
    ready_file: Path | None = None
    device: str = "cpu"
    grace_s: float = DEFAULT_GRACE_S
    tls_dir: Path | None = None


class ServeError(ValueError):
    """The agent cannot start as asked (e.g. the address cannot be bound)."""


EXIT_CRASHED = 3  # the exit status of an agent whose training thread failed


def serve(options: Options, runtime: RuntimeLike | None = None) -> int:
    """Run the agent until Stop or SIGTERM/SIGINT; returns the exit status: 0, or
    EXIT_CRASHED when the runtime stopped by itself (its training thread failed). Such an
    agent can never train again and refuses every Configure, so it exits for its supervisor
    (the kubelet, or `planaria run`'s backend) to restart it, instead of serving on, alive,
    as a worker the controller must give up on."""
    if runtime is None:
        # torch loads only in the agent process
        from planaria.agent.runtime import runtime as runtimes

        real = runtimes.Runtime(
            worker=options.worker,
            job=options.job,
            snapshot_base=options.snapshot_base,
            device=options.device,
        )
        real.start()
        runtime = real
    stopping = threading.Event()
    try:
        server, health_servicer, address = _start_server(options, runtime, stopping)
    except (ServeError, mtls.TlsFilesError):
        runtime.close()
        raise
    _install_signal_handlers(stopping)
    crashed = threading.Event()

    def watch() -> None:
        runtime.wait_stopped()
        if runtime.crashed:
            crashed.set()
            stopping.set()

    threading.Thread(target=watch, name="runtime-watch", daemon=True).start()
    if options.ready_file is not None:
        _write_atomically(options.ready_file, f"{address}\n")
    LOG.info("planaria agent: worker %d serving on %s", options.worker, address)
    print(
        f"planaria agent: worker {options.worker} serving on {address}",
        file=sys.stderr,
        flush=True,
    )
    stopping.wait()
    _shut_down(server, health_servicer, runtime, options.grace_s)
    if crashed.is_set():
        LOG.error("planaria agent: worker %d: the training thread failed; exiting", options.worker)
        return EXIT_CRASHED
    return 0


def _start_server(
    options: Options, runtime: RuntimeLike, stopping: threading.Event
) -> tuple[grpc.Server, health.HealthServicer, str]:
    credentials = None if options.tls_dir is None else mtls.server_credentials(options.tls_dir)
    interceptors: list[mtls.Interceptor] = []
    if credentials is not None:
        interceptors.append(mtls.ControllerOnly(mtls.controller_name(options.job)))
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=RPC_THREADS), interceptors=interceptors
    )
    add_to_server(AgentServicer(runtime, stopping), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    host = options.listen.rsplit(":", 1)[0]
    try:
        if credentials is None:
            port = server.add_insecure_port(options.listen)
        else:
            port = server.add_secure_port(options.listen, credentials)
    except RuntimeError as exc:
        raise ServeError(
            f"cannot listen on {options.listen!r}: {exc}; give a free HOST:PORT"
        ) from exc
    if port == 0:
        raise ServeError(f"cannot listen on {options.listen!r}; give a free HOST:PORT")
    server.start()
    for name in ("", SERVICE):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, health_servicer, f"{host}:{port}"


def _shut_down(
    server: grpc.Server,
    health_servicer: health.HealthServicer,
    runtime: RuntimeLike,
    grace_s: float,
) -> None:
    for name in ("", SERVICE):
        health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    runtime.stop(grace_s)
    runtime.wait_stopped(grace_s + 5.0)
    server.stop(grace_s).wait()
    runtime.close()  # joins the training thread (a no-op wait once it stopped)


def _install_signal_handlers(stopping: threading.Event) -> None:
    """SIGTERM (Kubernetes, the local backend) and SIGINT stop the agent gracefully."""
    if threading.current_thread() is not threading.main_thread():
        return  # signals can only be handled on the main thread (e.g. an in-process test)

    def handle(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
