"""`AgentClient`: the controller's `ports.Agent` over gRPC (planaria.v1, grpc.aio).

    agent = await AgentClient.connect(plan.WorkerId(3), "10.0.0.7:50051", timeout_s=30, tls=creds)
    ack = await agent.configure(config)
    async for heartbeat in agent.watch(0.1): ...

Every unary call has a deadline (`call_timeout_s`, 10 s; Configure `configure_timeout_s`, 30 s,
since the agent checks the plan before it answers). Any transport failure, deadline or error
status becomes `ports.AgentUnreachable` naming the worker and the gRPC status, except a
Profile the agent refuses (FAILED_PRECONDITION), which is a `ProfileRefused` (ValueError). A
Watch stream yields decoded heartbeats; it ends when the agent ends it (the agent stopped) and
raises AgentUnreachable the moment the connection breaks, which is how the controller learns of
a death within a heartbeat or two. Messages that do not decode (a WireError) also raise
AgentUnreachable: an agent that speaks garbage is as good as gone.

With `tls` (a `planaria.rpc.tls.ControllerTls`) the channel is mutual TLS: the client presents
the job's controller certificate and accepts only an agent certificate of the job's CA that
names `tls.agent_server_name(job)` (agents are addressed by IP, so that name is checked through
`grpc.ssl_target_name_override`). `tls=None` is a plaintext channel, for agents started with
`planaria agent --insecure`; a handshake that fails surfaces as AgentUnreachable (UNAVAILABLE)
once `timeout_s` has passed, like an agent that does not answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
import grpc.aio

from planaria.contract import plan, profile
from planaria.control import ports
from planaria.rpc import tls as tls_material
from planaria.v1 import agent_pb2 as pb
from planaria.v1 import agent_pb2_grpc
from planaria.wire import codec, errors, messages

CALL_TIMEOUT_S = 10.0
CONFIGURE_TIMEOUT_S = 30.0
PROFILE_TIMEOUT_S = 600.0  # profiling a model measures every layer several times
_R = TypeVar("_R")


class ProfileRefused(ValueError):
    """The agent cannot profile now (it is training); the message is the agent's reason."""


class AgentClient:
    """One agent's gRPC connection, implementing `planaria.control.ports.Agent`."""

    def __init__(
        self,
        worker: plan.WorkerId,
        channel: grpc.aio.Channel,
        *,
        call_timeout_s: float = CALL_TIMEOUT_S,
        configure_timeout_s: float = CONFIGURE_TIMEOUT_S,
    ) -> None:
        self._worker = worker
        self._channel = channel
        self._stub = agent_pb2_grpc.AgentServiceStub(channel)
        self._call_timeout_s = call_timeout_s
        self._configure_timeout_s = configure_timeout_s

    @classmethod
    async def connect(
        cls,
        worker: plan.WorkerId,
        address: str,
        *,
        timeout_s: float,
        tls: tls_material.ControllerTls | None,
    ) -> AgentClient:
        """A client whose channel is ready, or AgentUnreachable after `timeout_s`; mutual TLS
        with the job's controller credentials `tls`, plaintext when it is None."""
        channel = _channel(address, tls)
        try:
            await _bounded(worker, channel.channel_ready(), timeout_s, f"connect to {address}")
        except ports.AgentUnreachable:
            await channel.close(None)
            raise
        return cls(worker, channel)

    @property
    def worker(self) -> plan.WorkerId:
        return self._worker

    async def configure(self, config: messages.WorkerConfig) -> messages.Acknowledgement:
        request = codec.encode_worker_config(config)
        answer = await self._call(self._stub.Configure(request, timeout=self._configure_timeout_s))
        return self._decoded(codec.decode_acknowledgement, answer)

    async def watch(self, interval_s: float) -> AsyncIterator[messages.Heartbeat]:
        call = self._stub.Watch(codec.encode_watch_request(interval_s))
        try:
            async for response in call:
                yield self._decoded(codec.decode_heartbeat, response)
        except grpc.aio.AioRpcError as exc:
            raise _unreachable(self._worker, exc) from exc
        finally:
            call.cancel()

    async def pause(self, epoch: int) -> messages.Acknowledgement:
        request = codec.encode_epoch_command(epoch, pb.PauseRequest)
        answer = await self._call(self._stub.Pause(request, timeout=self._call_timeout_s))
        return self._decoded(codec.decode_acknowledgement, answer)

    async def resume(self, epoch: int) -> messages.Acknowledgement:
        request = codec.encode_epoch_command(epoch, pb.ResumeRequest)
        answer = await self._call(self._stub.Resume(request, timeout=self._call_timeout_s))
        return self._decoded(codec.decode_acknowledgement, answer)

    async def stop(self, grace_s: float) -> messages.Acknowledgement:
        request = codec.encode_stop_request(grace_s)
        answer = await self._call(self._stub.Stop(request, timeout=self._call_timeout_s))
        return self._decoded(codec.decode_acknowledgement, answer)

    async def profile(self, order: messages.ProfileOrder) -> profile.Profile:
        request = codec.encode_profile_request(order)
        try:
            answer = await self._stub.Profile(request, timeout=PROFILE_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.FAILED_PRECONDITION:
                raise ProfileRefused(exc.details() or "the agent is busy") from exc
            raise _unreachable(self._worker, exc) from exc
        return self._decoded(codec.decode_profile_response, answer)

    async def load_snapshot(self, load: messages.SnapshotLoad) -> messages.Acknowledgement:
        request = codec.encode_load_snapshot(load)
        answer = await self._call(self._stub.LoadSnapshot(request, timeout=self._call_timeout_s))
        return self._decoded(codec.decode_acknowledgement, answer)

    async def close(self) -> None:
        await self._channel.close(None)

    async def _call(self, call: Awaitable[_R]) -> _R:
        try:
            return await call
        except grpc.aio.AioRpcError as exc:
            raise _unreachable(self._worker, exc) from exc

    def _decoded(self, decode: Callable[[Any], _R], msg: Any) -> _R:
        try:
            return decode(msg)
        except errors.WireError as exc:
            raise ports.AgentUnreachable(self._worker, f"sent a malformed answer: {exc}") from exc


def _channel(address: str, tls: tls_material.ControllerTls | None) -> grpc.aio.Channel:
    if tls is None:
        return grpc.aio.insecure_channel(address)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=tls.ca_cert_pem, private_key=tls.key_pem, certificate_chain=tls.cert_pem
    )
    options = (("grpc.ssl_target_name_override", tls.server_name),)
    return grpc.aio.secure_channel(address, credentials, options=options)


def _unreachable(worker: plan.WorkerId, exc: grpc.aio.AioRpcError) -> ports.AgentUnreachable:
    return ports.AgentUnreachable(worker, f"{exc.code().name}: {exc.details()}")


async def _bounded(
    worker: plan.WorkerId, wait: Awaitable[None], timeout_s: float, what: str
) -> None:
    try:
        await asyncio.wait_for(wait, timeout_s)
    except TimeoutError as exc:
        raise ports.AgentUnreachable(worker, f"could not {what} within {timeout_s:g} s") from exc
