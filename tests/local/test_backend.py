"""The local backend (planaria.local.backend) with real `planaria agent` processes: start serves
every worker and hosts the store here; connect reaches an agent (its heartbeats arrive); a
SIGKILL is reported DIED with the signal; restart brings the same worker id back (JOINED, a new
pid); shutdown stops everything, is idempotent, ends the event stream and leaves no process and
no /dev/shm/planaria/<job> directory behind (unless asked to keep the stores), also when its
first caller is cancelled, and kill_all SIGKILLs every agent at once (a forced stop); bad restarts
and kills are refused; agents serve mutual TLS only (the job's credentials in <run_dir>/tls,
0700 folders and 0600 files; a plaintext client cannot connect)."""

from __future__ import annotations

import asyncio
import os
import stat
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from planaria.contract import plan
from planaria.control import ports
from planaria.local import backend as local_backend
from planaria.rpc import client, tls
from planaria.wire import messages

W = plan.WorkerId
SHM = Path("/dev/shm/planaria")


def _exists(pid: int) -> bool:
    """Whether `pid` is a live (not zombie) process."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in status


@pytest_asyncio.fixture
async def backend(tmp_path: Path) -> AsyncIterator[local_backend.LocalBackend]:
    job = f"l2-backend-{uuid.uuid4().hex[:8]}"
    pool = local_backend.LocalBackend(job=job, run_dir=tmp_path / "run")
    try:
        yield pool
    finally:
        await pool.shutdown()


async def _assert_tls_only(backend: local_backend.LocalBackend, worker: plan.WorkerId) -> None:
    """`worker` refuses a plaintext client; the credentials are 0700 folders of 0600 files."""
    address = (backend.run_dir / "workers" / f"worker-{worker}.ready").read_text().strip()
    with pytest.raises(ports.AgentUnreachable):
        await client.AgentClient.connect(worker, address, timeout_s=0.5, tls=None)
    folder = backend.run_dir / "tls"
    folders = [folder, folder / "agent", folder / "controller"]
    assert {stat.S_IMODE(f.stat().st_mode) for f in folders} == {0o700}
    files = [*(folder / "agent").iterdir(), *(folder / "controller").iterdir()]
    assert sorted(f.name for f in files) == sorted([*tls.AGENT_FILES, *tls.CONTROLLER_FILES])
    assert {stat.S_IMODE(f.stat().st_mode) for f in files} == {0o600}


async def _next(events: AsyncIterator[ports.WorkerEvent]) -> ports.WorkerEvent:
    return await asyncio.wait_for(events.__anext__(), 20.0)


@pytest.mark.asyncio
async def test_a_worker_starts_dies_returns_and_shutdown_leaves_nothing(
    backend: local_backend.LocalBackend,
) -> None:
    assert backend.store.host == "127.0.0.1" and backend.store.port > 0
    await backend.start([W(0), W(1)])
    first = dict(backend.pids)
    assert backend.alive() == (W(0), W(1))
    agent = await backend.connect(W(0), timeout_s=10.0)
    beat = await asyncio.wait_for(agent.watch(0.05).__anext__(), 10.0)
    assert beat.state is messages.AgentState.IDLE
    await agent.close()
    await _assert_tls_only(backend, W(0))
    store_dir = SHM / backend.job / "1"
    assert store_dir.is_dir()  # the agent opened its store
    events = backend.events()
    backend.kill(W(1))
    died = await _next(events)
    assert (died.kind, died.worker) == (ports.EventKind.DIED, W(1))
    assert "SIGKILL" in died.detail and backend.alive() == (W(0),)
    with pytest.raises(ports.AgentUnreachable):
        await backend.connect(W(1), timeout_s=1.0)
    await backend.restart(W(1))
    joined = await _next(events)
    assert (joined.kind, joined.worker) == (ports.EventKind.JOINED, W(1))
    assert backend.pids[W(1)] != first[W(1)] and backend.pids[W(0)] == first[W(0)]
    assert (backend.run_dir / "workers" / "worker-1.log").read_text().count("serving on") == 2
    await backend.shutdown()
    await backend.shutdown()
    assert [e async for e in events] == []  # the stream ends, no DIED for a shutdown
    assert not any(_exists(p) for p in [*first.values(), *backend.pids.values()])
    assert not store_dir.exists() and not (SHM / backend.job).exists()


@pytest.mark.asyncio
async def test_restarting_a_live_worker_or_killing_a_dead_one_is_refused(
    backend: local_backend.LocalBackend,
) -> None:
    await backend.start([W(2)])
    await backend.start([W(2)])  # adopted: already running
    pid = backend.pids[W(2)]
    with pytest.raises(local_backend.LocalBackendError, match="still runs"):
        await backend.restart(W(2))
    with pytest.raises(local_backend.LocalBackendError, match="does not run"):
        backend.kill(W(5))
    assert backend.pids[W(2)] == pid


@pytest.mark.asyncio
async def test_kill_all_skips_the_graces_and_a_cancelled_shutdown_still_finishes(
    tmp_path: Path,
) -> None:
    base = tmp_path / "shm"
    pool = local_backend.LocalBackend(job="cut", run_dir=tmp_path / "run", snapshot_base=base)
    await pool.start([W(0), W(1)])
    pids, events = dict(pool.pids), pool.events()
    pool.kill_all()  # a second interrupt: no Stop RPC, no grace
    died = sorted([await _next(events), await _next(events)], key=lambda e: e.worker)
    assert [(e.worker, "SIGKILL" in e.detail) for e in died] == [(W(0), True), (W(1), True)]
    assert (base / "cut").is_dir()
    first = asyncio.ensure_future(pool.shutdown())
    await asyncio.sleep(0)
    first.cancel()  # its caller interrupted: the shutdown goes on, the next call awaits it
    await asyncio.wait_for(pool.shutdown(), 10.0)
    assert first.cancelled() and not any(_exists(p) for p in pids.values())
    assert not (base / "cut").exists()
    pool.kill_all()  # nothing left to kill: a no-op


@pytest.mark.asyncio
async def test_kept_stores_survive_shutdown(tmp_path: Path) -> None:
    base = tmp_path / "shm"
    pool = local_backend.LocalBackend(
        job="kept", run_dir=tmp_path / "run", snapshot_base=base, keep_snapshots=True
    )
    (base / "kept" / "0").mkdir(parents=True)
    await pool.start([W(0)])
    pid = pool.pids[W(0)]
    await pool.shutdown()
    assert (base / "kept" / "0").is_dir() and not _exists(pid)


def test_a_job_name_with_a_slash_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="without '/'"):
        local_backend.LocalBackend(job="a/b", run_dir=tmp_path)
    assert os.getpid() > 0
