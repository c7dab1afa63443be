"""A controller handing a running job to a successor, with real agent processes (gloo).

Covers: the first controller detached while the job trains, a successor adopting the journalled
epoch (no new epoch, the agents' processes unchanged, parameters equal to the fault-free
reference); and the first controller detached in the middle of a recovery (a worker SIGKILLed,
the next epoch being opened), the successor finishing that recovery from the journal and the
job ending exact: once with the predecessor's Configures racing its detach, once stopped after
journalling the epoch and before any Configure went out (the successor opens it again). This is
what an operator restart does (docs/controller.md, Adoption).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from planaria.contract import plan
from planaria.control import clock, controller, ports
from planaria.control import status as statuses
from tests.e2e import local_job

W = plan.WorkerId
Phase = statuses.Phase


class Journal:
    """The latest record, in memory (the operator keeps it in a ConfigMap). `hold_at`: the
    record of that epoch is kept and the call never returns, so its Configures never go out."""

    def __init__(self, hold_at: int | None = None) -> None:
        self.latest: ports.EpochRecord | None = None
        self.hold_at = hold_at

    async def record(self, entry: ports.EpochRecord) -> None:
        self.latest = entry
        if entry.epoch == self.hold_at:
            await asyncio.Event().wait()


async def _until(ctl: controller.Controller, check: object, timeout_s: float = 90.0) -> None:
    async def poll() -> None:
        while not check(ctl.status):  # type: ignore[operator]
            await asyncio.sleep(local_job.POLL_S)

    try:
        await asyncio.wait_for(poll(), timeout_s)
    except TimeoutError:
        raise AssertionError(f"not reached in {timeout_s} s: {ctl.status}") from None


async def _hand_over(
    job: local_job.LocalJob, journal: Journal, when: object, act: object = None
) -> tuple[controller.Controller, statuses.JobStatus]:
    """Run the first controller until `when(status)` (doing `act(backend)` first, if given),
    detach it, and let a successor adopt the journal's latest epoch and finish the job."""
    real = clock.RealClock()
    first = controller.Controller(job.settings, job.backend, clock=real, journal=journal)
    running = asyncio.ensure_future(first.run())
    try:
        if act is not None:
            await _until(first, lambda s: s.phase is Phase.RUNNING and s.step >= 3)
            act(job.backend)  # type: ignore[operator]
        await _until(first, when)
        first.detach()
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        assert journal.latest is not None
        successor = controller.Controller(
            job.settings, job.backend, clock=real, adopt=journal.latest
        )
        final = await asyncio.wait_for(successor.run(), local_job.RUN_TIMEOUT_S)
        job.final_plan = successor.plan
        return successor, final
    finally:
        running.cancel()
        await job.backend.shutdown()


@pytest.mark.asyncio
async def test_a_successor_adopts_the_running_agents(
    corpus: Path, shm: Path, tmp_path: Path
) -> None:
    settings = local_job.job("adopt-steady", local_job.training(corpus), steps=12)
    job, journal = local_job.LocalJob(settings, tmp_path / "run", shm), Journal()
    pids: dict[plan.WorkerId, int] = {}

    def running_at_5(status: statuses.JobStatus) -> bool:
        pids.update(job.backend.pids)
        return status.phase is Phase.RUNNING and status.step >= 4

    successor, final = await _hand_over(job, journal, running_at_5)
    assert final.phase is Phase.SUCCEEDED, final.message
    # Epoch 1 adopted as it runs; on a loaded machine (load 14) the first controller can
    # regroup (a heartbeat late past the timeout: epoch 2, no worker lost, no recovery counted)
    # before it is stopped, and epoch 2 is adopted. No process restarts either way.
    assert (final.step, final.recoveries) == (12, 0) and final.epoch in (1, 2)
    assert job.backend.pids == pids  # nobody was restarted
    local_job.assert_like_reference(job, shm)


@pytest.mark.parametrize("hold", [False, True], ids=["configures-racing", "never-sent"])
@pytest.mark.asyncio
async def test_a_successor_finishes_a_recovery_its_predecessor_began(
    corpus: Path, shm: Path, tmp_path: Path, hold: bool
) -> None:
    settings = local_job.job(
        "adopt-recovering",
        local_job.training(corpus),
        workers=4,
        steps=12,
        configure_timeout_s=20.0,
    )
    job = local_job.LocalJob(settings, tmp_path / "run", shm)
    journal = Journal(hold_at=2 if hold else None)

    def recovering(status: statuses.JobStatus) -> bool:
        return (
            status.phase is Phase.RECOVERING
            and journal.latest is not None
            and (journal.latest.epoch >= 2)
        )

    successor, final = await _hand_over(job, journal, recovering, lambda b: b.kill(W(1)))
    assert final.phase is Phase.SUCCEEDED, final.message
    assert final.step == 12 and final.epoch >= 2
    local_job.assert_like_reference(job, shm)
