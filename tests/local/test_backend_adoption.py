"""A local backend adopting the agents another backend of the same run directory started
(planaria.local.backend `adopt`, planaria.local.adoption), with real `planaria agent` processes.

Covers: each agent's pid file holds its pid and start time, the run's store.port the store's
port; a backend built with adopt=True reuses the run directory's credentials (the adopted
agents answer it over mutual TLS), hosts its store on another port, and `adopt()` takes over
every running agent with its address; a SIGKILL of an adopted worker (not our child) is a DIED
event through its pidfd, saying its status is not ours; restart brings it back as our own
child (JOINED); shutdown stops the adopted agents too (Stop RPC) and the stores are removed; a
pid file naming a reused pid (another start time) or an exited process is not adopted; adopt()
on a backend that did not ask for the old credentials is refused.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pytest

from planaria.contract import plan
from planaria.control import ports
from planaria.local import adoption, restarts
from planaria.local import backend as local_backend
from planaria.wire import messages

W = plan.WorkerId
SHM = Path("/dev/shm/planaria")


def _exists(pid: int) -> bool:
    """Whether `pid` is a live (not zombie) process."""
    found = adoption.stat(pid)
    return found is not None and found.state != "Z"


async def _beat(backend: local_backend.LocalBackend, worker: plan.WorkerId) -> None:
    agent = await backend.connect(worker, timeout_s=10.0)
    try:
        beat = await asyncio.wait_for(agent.watch(0.05).__anext__(), 10.0)
        assert beat.state is messages.AgentState.IDLE
    finally:
        await agent.close()


@pytest.mark.asyncio
async def test_a_second_backend_adopts_kills_restarts_and_stops_the_first_ones_agents(
    tmp_path: Path,
) -> None:
    job, run = f"l2-adopt-{uuid.uuid4().hex[:8]}", tmp_path / "run"
    # The first backend stands for a controller killed with SIGKILL: it restarts nothing.
    first = local_backend.LocalBackend(job=job, run_dir=run, restart=restarts.NEVER)
    second: local_backend.LocalBackend | None = None
    try:
        await first.start([W(0), W(1)])
        pids = dict(first.pids)
        for worker, pid in pids.items():
            recorded = adoption.read(run / "workers" / f"worker-{worker}.pid")
            assert recorded is not None and recorded[0] == pid and adoption.alive(*recorded)
        second = local_backend.LocalBackend(job=job, run_dir=run, adopt=True)
        assert second.store.port != first.store.port  # a store of its own, on another port
        assert (run / local_backend.STORE_PORT_FILE).read_text() == f"{second.store.port}\n"
        assert second.adopt() == (W(0), W(1))
        assert second.pids == pids and second.alive() == (W(0), W(1))
        await _beat(second, W(0))  # the old credentials: the agent accepts this controller
        events = second.events()
        second.kill(W(1))
        died = await asyncio.wait_for(events.__anext__(), 20.0)
        assert (died.kind, died.worker) == (ports.EventKind.DIED, W(1))
        assert f"adopted process {pids[W(1)]} exited" in died.detail
        await second.restart(W(1))
        joined = await asyncio.wait_for(events.__anext__(), 20.0)
        assert (joined.kind, joined.worker) == (ports.EventKind.JOINED, W(1))
        assert second.pids[W(1)] != pids[W(1)]
        await _beat(second, W(1))
        new = second.pids[W(1)]
        await second.shutdown()
        assert not any(_exists(p) for p in [*pids.values(), new])
        assert not (SHM / job).exists()
        # The first backend, their parent, saw how they ended: worker 0 left after the Stop RPC
        # (exit code 0, not SIGTERM), worker 1 by the SIGKILL.
        await first.wait_exited(W(0), 5.0)
        seen = first.events()
        ended = {e.worker: e.detail for e in [await seen.__anext__(), await seen.__anext__()]}
        assert "exit code 0" in ended[W(0)] and "SIGKILL" in ended[W(1)]
    finally:
        if second is not None:
            await second.shutdown()
        await first.shutdown()


@pytest.mark.asyncio
async def test_stale_pid_files_are_not_adopted(tmp_path: Path) -> None:
    folder = tmp_path / "run" / "workers"
    folder.mkdir(parents=True)
    adoption.write(folder / "worker-0.pid", os.getpid())
    recorded = adoption.read(folder / "worker-0.pid")
    assert recorded is not None and adoption.running(folder) == {W(0): recorded}
    (folder / "worker-0.pid").write_text(f"{os.getpid()} {recorded[1] + 1}\n")  # a reused pid
    exited = await asyncio.create_subprocess_exec("true")
    adoption.write(folder / "worker-1.pid", exited.pid)
    await exited.wait()
    (folder / "worker-2.pid").write_text("not a pid file\n")
    assert adoption.running(folder) == {}
    assert adoption.AdoptedProcess.open(exited.pid, recorded[1]) is None


def test_adopting_needs_the_old_credentials(tmp_path: Path) -> None:
    fresh = local_backend.LocalBackend(job="fresh", run_dir=tmp_path)
    with pytest.raises(local_backend.LocalBackendError, match="adopt=True"):
        fresh.adopt()
    with pytest.raises(ValueError, match="tls"):
        local_backend.LocalBackend(job="none", run_dir=tmp_path / "empty", adopt=True)
