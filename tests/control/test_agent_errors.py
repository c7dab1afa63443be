"""Errors the agents latch of their own, not a peer's (planaria.control.controller, failures).

Covers, against the fake cluster in simulated time: a corpus no worker can read (INVALID_DATA
at every set-up) fails the job at once, before the settle bound, without a second epoch, with
the agents' message naming the workers, a Failed condition with reason InvalidData, every
agent stopped and no status ever calling the workers lost; a permanent error on a single worker
(its set-up in a recovery epoch) fails the job too; out of memory on every worker of the plan
is retried once with the same workers from their committed step (a `restart`), and the job
goes on when the fault was transient, or fails with the message when it comes back before a
step is committed; and why no worker survived is worded truthfully (lost only when dead or
silent).
"""

from __future__ import annotations

import pytest

from planaria.contract import plan as plans
from planaria.control import failures, membership, status
from planaria.wire import messages
from tests.control import scenarios

Kind = messages.ErrorKind
MISSING = "corpus path '/data/missing' does not exist; name a file or directory"
OUT_OF_MEMORY = "OutOfMemoryError: CUDA out of memory (at executor.py:1)"


def _conditions(value: status.JobStatus) -> dict[str, status.Condition]:
    return {c.type: c for c in value.conditions}


@pytest.mark.asyncio
async def test_a_corpus_no_worker_can_read_fails_the_job_at_once_with_its_message() -> None:
    job = scenarios.job()
    unreadable = {w: (Kind.INVALID_DATA, MISSING) for w in range(job.workers)}
    run = scenarios.Run(job, setup_errors=unreadable)
    # Sooner than the settle bound (step + heartbeat timeout): nothing is waited for.
    final = await run.finish(limit_s=job.step_timeout_s)
    assert final.phase is status.Phase.FAILED
    cause = f"workers 0,1,2,3,4,5,6,7: the job's data cannot be read: {MISSING}"
    assert final.message == cause
    failed = _conditions(final)["Failed"]
    assert (failed.status, failed.reason, failed.message) == ("True", "InvalidData", cause)
    assert list(run.cluster.sent) == [1], "a permanent error is not retried"
    assert all(a.state is messages.AgentState.STOPPED for a in run.cluster.agents.values())
    assert not any("lost" in s.message for s in run.sink.published)


@pytest.mark.asyncio
async def test_a_permanent_error_on_one_worker_fails_the_job() -> None:
    run = scenarios.Run(scenarios.job())
    await run.until(lambda: run.step() >= 10)
    run.cluster.setup_errors[3] = (Kind.INVALID_DATA, MISSING)  # its node lacks the corpus
    run.cluster.kill(5)
    final = await run.finish(limit_s=10.0)
    assert final.phase is status.Phase.FAILED and final.step >= 10
    assert final.message == f"worker 3: the job's data cannot be read: {MISSING}"
    assert list(run.cluster.sent) == [1, 2]


async def _out_of_memory_everywhere(run: scenarios.Run) -> int:
    """Every agent latches OUT_OF_MEMORY in the step after 10; the step they committed."""
    await run.until(lambda: run.step() >= 10)
    committed = run.cluster.agent(0).step
    for agent in run.cluster.agents.values():
        agent.latch(Kind.OUT_OF_MEMORY, OUT_OF_MEMORY)
    return committed


@pytest.mark.asyncio
async def test_a_transient_error_on_every_worker_is_retried_with_the_same_workers() -> None:
    run = scenarios.Run(scenarios.job())
    await run.until(lambda: run.controller.plan is not None)
    assert run.controller.plan is not None
    workers = run.controller.plan.workers
    committed = await _out_of_memory_everywhere(run)
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED
    (retry,) = run.controller.recoveries
    assert (retry.kind, retry.failed, retry.lost_steps) == ("restart", (), 0)
    assert "every worker latched an error of its own" in retry.reason
    assert run.cluster.sent[2][0].resume_step == committed
    assert run.controller.plan is not None and run.controller.plan.workers == workers


@pytest.mark.asyncio
async def test_an_error_on_every_worker_that_comes_back_fails_the_job_after_one_retry() -> None:
    run = scenarios.Run(scenarios.job())
    committed = await _out_of_memory_everywhere(run)
    run.cluster.setup_errors = {w: (Kind.OUT_OF_MEMORY, OUT_OF_MEMORY) for w in range(8)}
    final = await run.finish(limit_s=10.0)
    assert final.phase is status.Phase.FAILED
    assert final.message == (
        f"workers 0,1,2,3,4,5,6,7: out of memory: {OUT_OF_MEMORY} "
        f"(after 1 retry from step {committed})"
    )
    assert _conditions(final)["Failed"].reason == "OutOfMemory"
    assert list(run.cluster.sent) == [1, 2]


def test_why_no_worker_survived_says_lost_only_of_the_dead_and_silent() -> None:
    roster = membership.Roster(heartbeat_timeout_s=1.0)
    for worker in range(3):
        roster.connected(plans.WorkerId(worker), now=0.0)
    roster.dead[plans.WorkerId(0)] = 0.5
    roster.faulty.add(plans.WorkerId(1))
    failed = {plans.WorkerId(0), plans.WorkerId(1)}
    assert failures.without_survivors(roster, failed, now=0.9) == (
        "workers [0] are lost and workers [1] are alive but were given up on (a refused or "
        "unanswered Configure, or not stopped in time)"
    )
    assert failures.without_survivors(roster, {plans.WorkerId(0)}, now=0.9) == (
        "every worker of the plan is lost"
    )
    # Silent past the heartbeat timeout counts as lost, too.
    assert failures.without_survivors(roster, {plans.WorkerId(2)}, now=2.0) == (
        "every worker of the plan is lost"
    )
