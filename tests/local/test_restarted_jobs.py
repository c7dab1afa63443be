"""Jobs whose agent process exits on its own, end to end: the real controller over the local
backend, real `planaria agent` processes, the real clock, the tiny model in exact mode.

Covered: the only worker of a job SIGKILLed from outside (not through the backend's failure
injection: the OOM killer, a user) is restarted by the backend's policy, reloads its own
snapshot and the job finishes with parameters and optimizer moments equal to the fault-free
reference bit for bit (before the policy, the job stayed Suspended with 0 workers for ever);
a worker whose every restart crashes at start ends the job Failed, through `planaria run`'s
`execute`, with the backend's one-line cause (the exit, the restarts, the worker's log) after
the bounded restarts: the run ends, it does not hang. Waits are bounded by events (a hang
guard only)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from planaria.cli import run
from planaria.contract import plan
from planaria.control import clock
from planaria.control import status as statuses
from planaria.local import backend as local_backend
from planaria.local import launching, restarts
from planaria.wire import messages
from tests.control import scenarios
from tests.e2e import local_job

W = plan.WorkerId
Phase = statuses.Phase
HANG_GUARD_S = 150.0  # only against a hang: never reached when the restarts work


def _single(name: str, corpus: Path) -> local_job.job_settings.JobSettings:
    """One worker, no fault tolerance: without its restart the job cannot go on."""
    return local_job.job(name, local_job.training(corpus), workers=1, fault_tolerance=0)


@pytest.mark.asyncio
async def test_a_worker_killed_from_outside_is_restarted_and_the_result_exact(
    corpus: Path, shm: Path, tmp_path: Path
) -> None:
    job = local_job.LocalJob(_single("outside-kill", corpus), tmp_path / "run", shm)
    killed: list[int] = []

    async def kill(job: local_job.LocalJob) -> None:
        await job.until(lambda s: s.phase is Phase.RUNNING and s.step >= 3)
        killed.append(job.backend.pids[W(0)])
        os.kill(killed[0], signal.SIGKILL)  # not `backend.kill`: nobody asked for it

    final = await job.run(kill)
    assert final.phase is Phase.SUCCEEDED, final.message
    assert final.step == job.settings.steps
    local_job.assert_like_reference(job, shm)
    assert job.backend.restarts == {W(0): 1} and job.backend.pids[W(0)] != killed[0]
    tiers = {r.tier for r in job.controller.recoveries}
    assert messages.RecoveryTier.LOCAL_SNAPSHOT in tiers, tiers
    log = (tmp_path / "run" / "workers" / "worker-0.log").read_text()
    assert f"process {killed[0]} exited with signal SIGKILL; restarting it" in log


@pytest.mark.asyncio
async def test_a_worker_that_keeps_crashing_fails_the_job_with_the_cause(
    corpus: Path, shm: Path, tmp_path: Path
) -> None:
    launches: list[plan.WorkerId] = []

    def placement(worker: plan.WorkerId) -> launching.Placement:
        """The first launch is the real agent; every restart exits 3 at start."""
        launches.append(worker)
        if len(launches) == 1:
            return launching.Placement()
        crash = "echo planaria-test: crashing at start >&2; exit 3"
        return launching.Placement(prefix=("sh", "-c", crash, "sh"))

    settings = _single("crash-loop", corpus)
    policy = restarts.RestartPolicy(max_restarts=2, initial_backoff_s=0.05, max_backoff_s=0.1)
    backend = local_backend.LocalBackend(
        job=settings.name,
        run_dir=tmp_path / "run",
        snapshot_base=shm,
        placement=placement,
        restart=policy,
    )
    sink, killed = scenarios.Sink(), []

    async def kill_when_running() -> None:
        while not sink.published or sink.published[-1].step < 2:
            await asyncio.sleep(local_job.POLL_S)
        killed.append(backend.pids[W(0)])
        os.kill(killed[0], signal.SIGKILL)

    killing = asyncio.ensure_future(kill_when_running())
    try:
        final = await asyncio.wait_for(
            run.execute(
                settings,
                backend,
                clock=clock.RealClock(),
                sink=sink,
                out=tmp_path / "out",
                gave_up=backend.gave_up,
            ),
            HANG_GUARD_S,
        )
    finally:
        killing.cancel()
        await backend.shutdown()
    assert len(killed) == 1 and final.phase is Phase.FAILED
    assert len(launches) == 1 + policy.max_restarts and backend.restarts == {W(0): 2}
    assert "worker 0's agent process" in final.message and "\n" not in final.message
    assert "exit code 3 after 2 restart(s); not restarted again" in final.message
    assert "worker-0.log" in final.message
    failed = {c.type: c for c in final.conditions}["Failed"]
    assert failed.reason == run.GAVE_UP_REASON
    summary = (tmp_path / "out" / "summary.md").read_text(encoding="utf-8")
    assert final.message in summary.splitlines()[0]
