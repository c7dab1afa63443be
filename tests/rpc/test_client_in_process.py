"""The controller's gRPC client against an in-process agent server over a fake runtime.

Covers: a heartbeat with every optional part (errors, setup, checkpoint step) arrives decoded
equal to what the runtime reported; Configure and Stop answers decode (a refusal keeps its
reason); a call slower than the client's deadline is AgentUnreachable (DEADLINE_EXCEEDED) soon
after the deadline; a busy agent's Profile is ProfileRefused, not AgentUnreachable; Watch ends
cleanly when the agent stops and raises AgentUnreachable within a second when the server goes
away mid-stream.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent import futures

import grpc
import pytest

from planaria.agent.server import service
from planaria.contract import plan, profile
from planaria.control import ports
from planaria.rpc import client
from planaria.v1 import agent_pb2_grpc
from planaria.wire import messages

W = plan.WorkerId
HEARTBEAT = messages.Heartbeat(
    worker=W(5),
    epoch=3,
    state=messages.AgentState.FAILED,
    last_committed_step=7,
    loss=2.25,
    samples_processed=112,
    timings=messages.Timings(forward_s=0.5, step_s=1.25),
    snapshot=messages.SnapshotState(latest_step=6, held_bytes=4096),
    errors=(
        messages.LatchedError(
            kind=messages.ErrorKind.PEER_LOST, message="peer 4 closed", step=8, peer_worker=W(4)
        ),
    ),
    setup=messages.EpochSetup(
        epoch=3, tier=messages.RecoveryTier.PEER_SNAPSHOT, load_s=0.75, received_bytes=10
    ),
    checkpoint_step=5,
)


class _FakeRuntime:
    """Reports HEARTBEAT; Pause sleeps `pause_s`; Configure refuses epochs below 3."""

    def __init__(self) -> None:
        self.pause_s = 0.0

    def configure(self, config: messages.WorkerConfig) -> messages.Acknowledgement:
        if config.epoch < 3:
            return messages.Acknowledgement(accepted=False, reason="stale epoch; current is 3")
        return messages.Acknowledgement(accepted=True)

    def heartbeat(self) -> messages.Heartbeat:
        return HEARTBEAT

    def pause(self, epoch: int) -> messages.Acknowledgement:
        time.sleep(self.pause_s)
        return messages.Acknowledgement(accepted=True)

    def resume(self, epoch: int) -> messages.Acknowledgement:
        return messages.Acknowledgement(accepted=True)

    def stop(self, grace_s: float) -> messages.Acknowledgement:
        return messages.Acknowledgement(accepted=True)

    def take_snapshot(self, epoch: int) -> messages.Acknowledgement:
        return messages.Acknowledgement(accepted=True)

    def snapshot_state(self) -> messages.SnapshotState:
        return HEARTBEAT.snapshot

    def load_snapshot(self, load: messages.SnapshotLoad) -> messages.Acknowledgement:
        return messages.Acknowledgement(accepted=False, reason=f"no snapshot of step {load.step}")

    def profile(self, order: messages.ProfileOrder) -> profile.Profile:
        raise ValueError("the agent is training; profile before the first Configure")

    crashed = False  # RuntimeLike: this fake never stops by itself

    def wait_stopped(self, timeout_s: float | None = None) -> bool:
        return True

    def close(self) -> None:
        pass


class _Server:
    def __init__(self) -> None:
        self.runtime, self.stopping = _FakeRuntime(), threading.Event()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        servicer = service.AgentServicer(self.runtime, self.stopping)
        agent_pb2_grpc.add_AgentServiceServicer_to_server(servicer, self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()


@pytest.fixture
def server() -> Iterator[_Server]:
    served = _Server()
    try:
        yield served
    finally:
        served.server.stop(0).wait()


def _config(epoch: int) -> messages.WorkerConfig:
    stage = plan.Stage(layer_start=0, layer_stop=6, workers=(W(5),))
    the_plan = plan.Plan(
        pipelines=(plan.Pipeline(stages=(stage,), num_micro_batches=1),), micro_batch_size=1
    )
    return messages.WorkerConfig(
        epoch=epoch,
        worker=W(5),
        plan=the_plan,
        resume_step=0,
        rendezvous=messages.Rendezvous(
            store_host="127.0.0.1",
            store_port=1234,
            key_prefix=f"epoch-{epoch}",
            rank=0,
            world_size=1,
            backend=messages.Backend.GLOO,
            timeout_s=5.0,
        ),
        transfers=(),
        settings=messages.TrainingSettings(
            model="tiny",
            seed=1,
            optimizer=messages.OptimizerSettings(lr=1e-3),
            global_batch_size=1,
            data=messages.DataSettings(corpus_paths=("corpus.txt",)),
            device=messages.Device.CPU,
            snapshot_interval_steps=0,
            redundancy=messages.RedundancyMode.NONE,
        ),
    )


@pytest.mark.asyncio
async def test_answers_and_heartbeats_decode(server: _Server) -> None:
    agent = await client.AgentClient.connect(W(5), server.address, timeout_s=5, tls=None)
    try:
        assert (await agent.configure(_config(4))).accepted
        stale = await agent.configure(_config(2))
        assert not stale.accepted and stale.reason == "stale epoch; current is 3"
        refused = await agent.load_snapshot(messages.SnapshotLoad(epoch=3, step=6))
        assert refused.reason == "no snapshot of step 6"
        assert await anext(agent.watch(0.05)) == HEARTBEAT
        assert (await agent.stop(1.0)).accepted
    finally:
        await agent.close()


@pytest.mark.asyncio
async def test_a_call_past_its_deadline_is_unreachable(server: _Server) -> None:
    server.runtime.pause_s = 1.0
    channel = grpc.aio.insecure_channel(server.address)
    agent = client.AgentClient(W(5), channel, call_timeout_s=0.2)
    started = time.monotonic()
    try:
        with pytest.raises(ports.AgentUnreachable, match="DEADLINE_EXCEEDED"):
            await agent.pause(3)
        assert time.monotonic() - started < 0.9
    finally:
        await agent.close()


@pytest.mark.asyncio
async def test_a_busy_agent_refuses_to_profile(server: _Server) -> None:
    agent = await client.AgentClient.connect(W(5), server.address, timeout_s=5, tls=None)
    order = messages.ProfileOrder(model="tiny", micro_batch_size=1, repeats=1)
    try:
        with pytest.raises(client.ProfileRefused, match="the agent is training"):
            await agent.profile(order)
    finally:
        await agent.close()


@pytest.mark.asyncio
async def test_watch_ends_when_the_agent_stops(server: _Server) -> None:
    agent = await client.AgentClient.connect(W(5), server.address, timeout_s=5, tls=None)
    try:
        stream = agent.watch(0.02)
        await anext(stream)
        server.stopping.set()
        rest = [beat async for beat in stream]
        assert len(rest) <= 1
    finally:
        await agent.close()


@pytest.mark.asyncio
async def test_a_server_gone_mid_watch_breaks_the_stream_within_a_second(server: _Server) -> None:
    agent = await client.AgentClient.connect(W(5), server.address, timeout_s=5, tls=None)
    try:
        stream = agent.watch(0.05)
        await anext(stream)
        started = time.monotonic()
        server.server.stop(0)
        with pytest.raises(ports.AgentUnreachable, match="worker 5"):
            await asyncio.wait_for(_drain(stream), 5)
        assert time.monotonic() - started < 1.0
    finally:
        await agent.close()


async def _drain(stream: AsyncIterator[messages.Heartbeat]) -> None:
    async for _ in stream:
        pass
