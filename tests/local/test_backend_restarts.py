"""The local backend restarts agent processes that exit on their own (planaria.local.restarts),
with real `planaria agent` processes: one SIGKILLed from outside is reported DIED, restarted
after the back-off and reported JOINED (a new pid, the exit and the restart written to its log);
one killed through the backend (failure injection) or one that exits 0 (told to stop) is not
restarted; one that keeps exiting at start is restarted the policy's number of times, then
given up on with a one-line cause naming the exit and the log, and a start that meets such a
worker returns instead of raising; a `restart` during the policy's back-off replaces its
restart, and a shutdown cancels a waiting one. Every wait is bounded by events, not by time."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from planaria.contract import plan
from planaria.control import ports
from planaria.local import backend as local_backend
from planaria.local import launching, restarts

W = plan.WorkerId
QUICK = restarts.RestartPolicy(max_restarts=2, initial_backoff_s=0.05, max_backoff_s=0.1)
HANG_GUARD_S = 60.0  # only against a hang: never reached when the backend works


def _pool(tmp_path: Path, **options: object) -> local_backend.LocalBackend:
    return local_backend.LocalBackend(
        job=f"l2-restart-{uuid.uuid4().hex[:8]}",
        run_dir=tmp_path / "run",
        snapshot_base=tmp_path / "shm",
        **options,  # type: ignore[arg-type]
    )


async def _next(events: AsyncIterator[ports.WorkerEvent]) -> ports.WorkerEvent:
    return await asyncio.wait_for(events.__anext__(), HANG_GUARD_S)


def _crashing(worker: plan.WorkerId) -> launching.Placement:
    """Every launch exits 3 before it serves, saying so on stderr (a broken install)."""
    return launching.Placement(prefix=("sh", "-c", "echo crashing at start >&2; exit 3", "sh"))


@pytest.mark.asyncio
async def test_an_agent_killed_from_outside_is_restarted_and_joins(tmp_path: Path) -> None:
    pool = _pool(tmp_path, restart=QUICK)
    try:
        await pool.start([W(0), W(1)])
        events, first = pool.events(), dict(pool.pids)
        os.kill(first[W(1)], signal.SIGKILL)  # not through the backend: the OOM killer, a user
        died = await _next(events)
        assert (died.kind, died.worker) == (ports.EventKind.DIED, W(1))
        assert "SIGKILL" in died.detail
        joined = await _next(events)
        assert (joined.kind, joined.worker) == (ports.EventKind.JOINED, W(1))
        assert pool.running(W(1)) and pool.pids[W(1)] != first[W(1)]
        assert pool.pids[W(0)] == first[W(0)] and pool.restarts == {W(1): 1}
        agent = await pool.connect(W(1), timeout_s=10.0)  # the new process serves
        await agent.close()
        log = (pool.run_dir / "workers" / "worker-1.log").read_text()
        assert log.count("serving on") == 2
        assert f"process {first[W(1)]} exited with signal SIGKILL; restarting it" in log
    finally:
        await pool.shutdown()
    assert "(stopped at the end of the run)" in log_of(pool, W(0))


def log_of(pool: local_backend.LocalBackend, worker: plan.WorkerId) -> str:
    return (pool.run_dir / "workers" / f"worker-{worker}.log").read_text()


@pytest.mark.parametrize(
    "signum",
    [
        pytest.param(signal.SIGKILL, id="a kill through the backend is on purpose"),
        pytest.param(signal.SIGTERM, id="an agent told to stop exits 0"),
    ],
)
@pytest.mark.asyncio
async def test_an_exit_on_purpose_is_not_restarted(tmp_path: Path, signum: signal.Signals) -> None:
    pool = _pool(tmp_path, restart=QUICK)
    try:
        await pool.start([W(0)])
        events, pid = pool.events(), pool.pids[W(0)]
        if signum is signal.SIGKILL:
            pool.kill(W(0))
        else:
            os.kill(pid, signum)  # graceful: the agent stops and exits 0
        died = await _next(events)
        assert died.kind is ports.EventKind.DIED
        # The backend decides right after it queues DIED, before this test runs again.
        assert pool.restarts == {} and not pool.running(W(0))
    finally:
        await pool.shutdown()
    assert [e async for e in events] == []  # no JOINED, ever
    expected = "(killed on purpose)" if signum is signal.SIGKILL else "exited with exit code 0"
    assert expected in log_of(pool, W(0))


@pytest.mark.asyncio
async def test_an_agent_that_keeps_crashing_is_given_up_on_with_its_cause(
    tmp_path: Path,
) -> None:
    pool = _pool(tmp_path, restart=QUICK, placement=_crashing)
    try:
        await pool.start([W(0)])  # returns: the worker exited, its restarts follow
        events = pool.events()
        cause = await asyncio.wait_for(pool.gave_up(), HANG_GUARD_S)
    finally:
        await pool.shutdown()
    kinds = [e.kind async for e in events]
    assert kinds == [ports.EventKind.DIED] * (QUICK.max_restarts + 1)  # never JOINED
    assert pool.restarts == {W(0): QUICK.max_restarts}
    assert "\n" not in cause and "worker 0's agent process" in cause
    assert "exit code 3 after 2 restart(s); not restarted again" in cause
    assert str(pool.run_dir / "workers" / "worker-0.log") in cause
    log = log_of(pool, W(0))
    assert log.count("crashing at start") == QUICK.max_restarts + 1
    assert log.count("restarting it in") == QUICK.max_restarts and cause in log


@pytest.mark.asyncio
async def test_a_process_that_ran_long_enough_has_its_earlier_restarts_forgiven(
    tmp_path: Path,
) -> None:
    # Every process "ran long enough" (reset_after_s 0): each exit starts the count afresh, so
    # a worker allowed one restart in a row is restarted after every one of its exits.
    forgiving = restarts.RestartPolicy(
        max_restarts=1, initial_backoff_s=0.05, max_backoff_s=0.1, reset_after_s=0.0
    )
    pool = _pool(tmp_path, restart=forgiving, placement=_crashing)
    exits = 4  # more than max_restarts + 1, after which the policy alone would give up
    try:
        await pool.start([W(0)])
        events = pool.events()
        for _ in range(exits):
            assert (await _next(events)).kind is ports.EventKind.DIED
        assert pool.restarts == {W(0): 1}
    finally:
        await pool.shutdown()
    log = log_of(pool, W(0))
    assert log.count("its 1 earlier restart(s) are forgiven") >= exits - 1
    assert "not restarted again" not in log


@pytest.mark.asyncio
async def test_a_worker_that_cannot_serve_is_given_up_on_at_once_without_restarts(
    tmp_path: Path,
) -> None:
    pool = _pool(tmp_path, restart=restarts.NEVER, agent_args=("--threads", "0"))
    try:
        await pool.start([W(0)])
        cause = await asyncio.wait_for(pool.gave_up(), HANG_GUARD_S)
    finally:
        await pool.shutdown()
    assert "exit code 2 after 0 restart(s)" in cause and "worker-0.log" in cause
    assert "--threads" in log_of(pool, W(0))


@pytest.mark.asyncio
async def test_a_restart_or_a_shutdown_during_the_back_off_ends_the_policys_wait(
    tmp_path: Path,
) -> None:
    # A back-off of an hour: only `restart` or `shutdown` can end it within the test.
    slow = restarts.RestartPolicy(max_restarts=1, initial_backoff_s=3600.0, max_backoff_s=3600.0)
    pool = _pool(tmp_path, restart=slow)
    try:
        await pool.start([W(0), W(1)])
        events, first = pool.events(), dict(pool.pids)
        for worker in (W(0), W(1)):
            os.kill(first[worker], signal.SIGKILL)
            died = await _next(events)
            assert (died.kind, died.worker) == (ports.EventKind.DIED, worker)
        assert pool.restarts == {W(0): 1, W(1): 1} and pool.alive() == ()
        await pool.restart(W(0))  # replaces worker 0's waiting restart
        joined = await _next(events)
        assert (joined.kind, joined.worker) == (ports.EventKind.JOINED, W(0))
        assert pool.alive() == (W(0),) and pool.pids[W(0)] != first[W(0)]
    finally:
        await asyncio.wait_for(pool.shutdown(), HANG_GUARD_S)  # cancels worker 1's wait
    assert [e async for e in events] == []  # no second JOINED of worker 0, none of worker 1
    assert pool.alive() == ()
