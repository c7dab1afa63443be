"""The controller's gRPC client against real `planaria agent` processes.

Covers: two agents started as `python -m planaria agent` processes are configured over gRPC by
`AgentClient` and train a 2-stage pipeline to stop_step, their heartbeats going RUNNING ->
FINISHED with the fault-free reference's loss and layer states, bitwise (exact reduction); a
malformed Configure never reaches the runtime (AgentUnreachable is not raised for a refusal: a
stale epoch comes back as accepted = false with the reason); a SIGKILLed agent breaks its Watch
stream with AgentUnreachable within about a second; connecting to nothing fails with
AgentUnreachable after the timeout; Stop makes the process exit 0.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from torch._C import _distributed_c10d as c10d

from planaria.agent.runtime import runtime_states
from planaria.agent.training import comparison
from planaria.contract import plan
from planaria.control import ports
from planaria.rpc import client
from planaria.wire import messages

W = plan.WorkerId
LOOPBACK = "127.0.0.1"
STEPS = 3


def _settings(corpus: Path) -> messages.TrainingSettings:
    return messages.TrainingSettings(
        model="tiny",
        seed=3,
        optimizer=messages.OptimizerSettings(lr=3e-3, eps=1e-6),
        global_batch_size=2,
        data=messages.DataSettings(corpus_paths=(str(corpus),)),
        device=messages.Device.CPU,
        snapshot_interval_steps=1,
        redundancy=messages.RedundancyMode.NONE,
        reduction=messages.Reduction.EXACT,
    )


def _plan() -> plan.Plan:
    stages = (
        plan.Stage(layer_start=0, layer_stop=3, workers=(W(0),)),
        plan.Stage(layer_start=3, layer_stop=6, workers=(W(1),)),
    )
    return plan.Plan(
        pipelines=(plan.Pipeline(stages=stages, num_micro_batches=2),), micro_batch_size=1
    )


class _Agents:
    """Agent processes on loopback, with a TCPStore here as the controller hosts it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.store = c10d.TCPStore(LOOPBACK, 0, None, True, datetime.timedelta(seconds=30))
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, worker: int) -> str:
        ready = self.tmp / f"ready-{worker}"
        command = [sys.executable, "-m", "planaria", "agent", "--worker", str(worker)]
        command += ["--job", "rpc-test", "--snapshot-base", str(self.tmp / "shm")]
        command += ["--ready-file", str(ready), "--insecure"]
        with (self.tmp / f"agent-{worker}.log").open("wb") as log:
            self.processes[worker] = subprocess.Popen(command, stderr=log, stdout=log)
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert self.processes[worker].poll() is None, (
                self.tmp / f"agent-{worker}.log"
            ).read_text()
            assert time.monotonic() < deadline, "the agent never became ready"
            time.sleep(0.05)
        return ready.read_text().strip()

    def config(self, worker: int, epoch: int, corpus: Path) -> messages.WorkerConfig:
        p = _plan()
        rendezvous = messages.Rendezvous(
            store_host=LOOPBACK,
            store_port=self.store.port,
            key_prefix=f"epoch-{epoch}",
            rank=sorted(p.workers).index(W(worker)),
            world_size=len(p.workers),
            backend=messages.Backend.GLOO,
            timeout_s=10.0,
        )
        return messages.WorkerConfig(
            epoch=epoch,
            worker=W(worker),
            plan=p,
            resume_step=0,
            rendezvous=rendezvous,
            transfers=(),
            settings=_settings(corpus),
            stop_step=STEPS,
        )

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
            process.wait(10)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    return path


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[_Agents]:
    cluster = _Agents(tmp_path)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest_asyncio.fixture
async def clients(agents: _Agents) -> AsyncIterator[dict[int, client.AgentClient]]:
    addresses = {w: agents.start(w) for w in (0, 1)}
    connected = {
        w: await client.AgentClient.connect(W(w), a, timeout_s=10, tls=None)
        for w, a in addresses.items()
    }
    try:
        yield connected
    finally:
        for c in connected.values():
            await c.close()


async def _until(
    agent: client.AgentClient, done: set[messages.AgentState], timeout_s: float = 60
) -> messages.Heartbeat:
    async def watch() -> messages.Heartbeat:
        async for heartbeat in agent.watch(0.05):
            if heartbeat.state in done:
                return heartbeat
        raise AssertionError("the Watch stream ended")

    return await asyncio.wait_for(watch(), timeout_s)


@pytest.mark.asyncio
async def test_two_agents_train_over_grpc_to_the_stop_step(
    agents: _Agents, clients: dict[int, client.AgentClient], corpus: Path
) -> None:
    for w, c in clients.items():
        ack = await c.configure(agents.config(w, 1, corpus))
        assert ack.accepted, ack.reason
    finished = [
        await _until(c, {messages.AgentState.FINISHED, messages.AgentState.FAILED})
        for c in clients.values()
    ]
    assert [h.state for h in finished] == [messages.AgentState.FINISHED] * 2
    assert [h.last_committed_step for h in finished] == [STEPS, STEPS]
    assert finished[0].setup is not None and finished[0].setup.tier is messages.RecoveryTier.INITIAL
    reference, losses = runtime_states.reference_states(_settings(corpus), 1, STEPS)
    assert finished[0].loss == losses[-1]  # exact mode: the same float32 losses, summed alike
    final = runtime_states.read_final_states("rpc-test", agents.tmp / "shm", _plan(), STEPS)
    found = comparison.compare(final, reference)
    assert found.equal, found.describe()
    stale = await clients[0].configure(agents.config(0, 1, corpus))
    assert not stale.accepted and "epoch" in stale.reason
    for c in clients.values():
        assert (await c.stop(1.0)).accepted
    assert [p.wait(30) for p in agents.processes.values()] == [0, 0]


@pytest.mark.asyncio
async def test_a_killed_agent_breaks_its_watch_stream_at_once(
    agents: _Agents, clients: dict[int, client.AgentClient]
) -> None:
    stream = clients[1].watch(0.05)
    first = await anext(stream)
    assert first.state is messages.AgentState.IDLE
    os.kill(agents.processes[1].pid, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(ports.AgentUnreachable, match="worker 1"):
        async for _ in stream:
            pass
    assert time.monotonic() - started < 2.0


@pytest.mark.asyncio
async def test_connecting_to_nothing_is_unreachable_after_the_timeout() -> None:
    with pytest.raises(ports.AgentUnreachable, match="within 0.3 s"):
        await client.AgentClient.connect(W(4), "127.0.0.1:1", timeout_s=0.3, tls=None)
