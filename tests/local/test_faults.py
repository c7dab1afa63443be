"""Failure injection (planaria.local.faults): the --fail / --mtbf syntax, with round trips and
random garbage (hypothesis), durations read as a job file reads them, one-line errors naming
the bad part; no worker is a random one, as in the job file; `parse_failures` refuses a worker
or step the job lacks with the job file's own words (the same rule decides both), and
`from_spec` takes a file entry as it is; the Injector against a fake target: step and time
triggers fire once, a random worker is a live one chosen by the seed, a dead worker is skipped,
the MTBF clock kills at exponential intervals (the same seed, the same kills), a rejoin
restarts the worker, and the task ends when the job does."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planaria.contract import plan
from planaria.control import status as statuses
from planaria.local import faults
from planaria.spec import job, job_file
from tests import strategies

W = plan.WorkerId


@given(step=st.integers(1, 10**6), worker=st.one_of(st.none(), st.integers(0, 999)))
def test_a_step_failure_round_trips(step: int, worker: int | None) -> None:
    text = f"step={step}:worker={'random' if worker is None else worker}"
    assert faults.parse_failure(text) == faults.Failure(
        step=step, worker=None if worker is None else W(worker)
    )


@given(strategies.durations())
def test_a_time_failure_reads_durations_as_a_job_file_does(written: tuple[str, float]) -> None:
    text, seconds = written
    failure = faults.parse_failure(f"time={text}:worker=2:rejoin=5s")
    assert failure.time_s == pytest.approx(seconds, rel=1e-12)
    assert failure.time_s == job.FailureSpec(time=text).time_s
    assert (failure.worker, failure.rejoin_after_s, failure.step) == (W(2), 5.0, None)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("worker=3", "exactly one of step"),
        ("step=4:time=5s:worker=1", "exactly one of step"),
        ("step=0:worker=1", "step is '0'"),
        ("step=x:worker=1", "step is 'x'"),
        ("step=4:worker=-1", "worker is '-1'"),
        ("step=4:worker=any", "worker is 'any'"),
        ("time=soon:worker=1", "time is 'soon'"),
        ("time=30s1m:worker=1", "time is '30s1m'; write seconds (90, 1.5) or units"),
        ("step=4:worker=1:rejoin=0s", "rejoin is '0s'; give seconds > 0"),
        ("step=4:worker=1:rejoin=-2", "rejoin is '-2'"),
        ("step=4:worker=1:node=2", "unknown key 'node'"),
        ("step=4:step=5:worker=1", "step is given twice"),
        ("step4:worker=1", "part 'step4' is not key=value"),
    ],
)
def test_bad_failures_name_the_part_and_the_fix(text: str, words: str) -> None:
    with pytest.raises(faults.FaultSyntaxError) as caught:
        faults.parse_failure(text)
    message = str(caught.value)
    assert words in message and "\n" not in message
    assert isinstance(caught.value, ValueError)


@given(st.text(max_size=30))
def test_any_text_parses_or_says_why(text: str) -> None:
    try:
        failure = faults.parse_failure(text)
    except faults.FaultSyntaxError as exc:
        assert str(exc)
    else:
        assert (failure.step is None) != (failure.time_s is None)


def test_no_worker_is_a_random_one_as_in_the_job_file() -> None:
    assert faults.parse_failure("step=40") == faults.Failure(step=40, worker=None)
    entry = job.FailureSpec(step=40)
    assert faults.from_spec(entry) == faults.parse_failure("step=40:worker=random")


@pytest.mark.parametrize(
    ("text", "entry"),
    [
        ("step=2:worker=7", {"step": 2, "worker": 7}),
        ("step=20:worker=1", {"step": 20, "worker": 1}),
        ("step=25", {"step": 25}),
        ("time=5s:worker=3", {"time": "5s", "worker": 3}),
    ],
    ids=[
        "a worker the job lacks",
        "a step at the last one",
        "a step past the last one",
        "a time trigger of a worker the job lacks",
    ],
)
def test_a_flag_and_a_file_entry_are_refused_alike(text: str, entry: dict[str, object]) -> None:
    document = "workers: 3\nsteps: 20\n"
    with pytest.raises(faults.FaultSyntaxError) as flag:
        faults.parse_failures([text], workers=3, steps=20)
    with pytest.raises(job.JobSpecError) as file:
        job_file.parse_job(f"{document}failures: [{json.dumps(entry)}]\n", source="job.yaml")
    flag_problem = str(flag.value).removeprefix(f"--fail {text!r}: ")
    file_problem = str(file.value).split(": ", 2)[2]
    assert flag_problem == file_problem and "\n" not in flag_problem
    assert "give" in flag_problem


def test_failures_the_job_can_reach_pass_and_file_entries_convert() -> None:
    texts = ["step=19:worker=2", "time=1.5m", "step=1:worker=0:rejoin=5s"]
    parsed = faults.parse_failures(texts, workers=3, steps=20)
    assert parsed == [faults.parse_failure(t) for t in texts]
    entries = [job.FailureSpec(step=19, worker=2), job.FailureSpec(time="1.5m")]
    entries.append(job.FailureSpec(step=1, worker=0, rejoin_seconds=5.0))
    assert [faults.from_spec(e) for e in entries] == parsed
    # a file's `time: 0` and `rejoinSeconds` convert as they are; the flag reads time 0 alike
    assert faults.from_spec(job.FailureSpec(time=0)).time_s == 0.0
    assert faults.parse_failure("time=0s").time_s == 0.0


def test_mtbf_reads_durations_and_refuses_others() -> None:
    assert faults.parse_mtbf("60s") == 60.0
    assert faults.parse_mtbf("1.5m") == 90.0
    assert faults.parse_mtbf("1m30s") == 90.0
    for bad in ("", "0", "0s", "-5s", "inf", "5 days", "30s1m"):
        with pytest.raises(faults.FaultSyntaxError, match="--mtbf"):
            faults.parse_mtbf(bad)


class FakeTarget:
    """Workers that die when killed and come back when restarted."""

    def __init__(self, workers: range) -> None:
        self.live = set(map(W, workers))
        self.kills: list[plan.WorkerId] = []
        self.restarts: list[plan.WorkerId] = []

    def alive(self) -> tuple[plan.WorkerId, ...]:
        return tuple(sorted(self.live))

    def kill(self, worker: plan.WorkerId, signum: int = signal.SIGKILL) -> None:
        assert signum == signal.SIGKILL and worker in self.live
        self.live.discard(worker)
        self.kills.append(worker)

    async def restart(self, worker: plan.WorkerId) -> None:
        self.live.add(worker)
        self.restarts.append(worker)


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _status(step: int, phase: statuses.Phase = statuses.Phase.RUNNING) -> statuses.JobStatus:
    return statuses.JobStatus(
        phase=phase,
        conditions=(),
        epoch=1,
        step=step,
        loss=None,
        samples_per_s=0.0,
        live_workers=4,
        total_workers=4,
        plan="",
        last_recovery=None,
        recoveries=0,
        message="",
    )


async def _drive(
    injector: faults.Injector, timeline: list[statuses.JobStatus], time: FakeTime
) -> None:
    """Run the injector over `timeline`: one status per poll, one second apart."""
    index = 0

    def status() -> statuses.JobStatus:
        return timeline[min(index, len(timeline) - 1)]

    task = asyncio.ensure_future(injector.run(status))
    for index in range(len(timeline)):  # noqa: B007 - read by status()
        time.now = float(index)
        await asyncio.sleep(0.001)
    await asyncio.wait_for(task, 2.0)


@pytest.mark.asyncio
async def test_step_and_time_failures_fire_once_and_skip_the_dead() -> None:
    target, time = FakeTarget(range(4)), FakeTime()
    failures = [
        faults.parse_failure("step=3:worker=1"),
        faults.parse_failure("time=2s:worker=2"),
        faults.parse_failure("step=5:worker=1"),  # worker 1 is dead by then: skipped
    ]
    injector = faults.Injector(target, failures, poll_s=0.001, monotonic=time)
    steps = [0, 1, 2, 3, 4, 5, 6, 7]
    done = _status(7, statuses.Phase.SUCCEEDED)
    await _drive(injector, [*map(_status, steps), done], time)
    assert target.kills == [W(2), W(1)]
    assert [i.worker for i in injector.injected] == [W(2), W(1)]
    assert injector.injected[1].step >= 3


@pytest.mark.asyncio
async def test_a_random_failure_takes_a_live_worker_and_rejoins_it() -> None:
    target, time = FakeTarget(range(3)), FakeTime()
    target.live.discard(W(0))
    failure = faults.parse_failure("step=1:worker=random:rejoin=0.01")
    injector = faults.Injector(target, [failure], seed=3, poll_s=0.001, monotonic=time)
    task = asyncio.ensure_future(injector.run(lambda: _status(2)))
    for _ in range(200):
        await asyncio.sleep(0.002)
        if target.restarts:
            break
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert len(target.kills) == 1 and target.kills[0] in {W(1), W(2)}
    assert target.restarts == target.kills


@pytest.mark.asyncio
async def test_the_mtbf_clock_is_seeded_and_exponential() -> None:
    async def kills(seed: int) -> list[faults.Injected]:
        target, time = FakeTarget(range(1000)), FakeTime()
        injector = faults.Injector(target, [], mtbf=5.0, seed=seed, poll_s=0.0, monotonic=time)
        timeline = [_status(i) for i in range(400)] + [_status(400, statuses.Phase.FAILED)]
        await _drive(injector, timeline, time)
        return injector.injected

    first, again, other = await kills(1), await kills(1), await kills(2)
    assert [dataclasses.astuple(i) for i in first] == [dataclasses.astuple(i) for i in again]
    assert first != other
    gaps = [b.at_s - a.at_s for a, b in zip(first, first[1:], strict=False)]
    assert 40 < len(first) < 140  # ~400 s / 5 s mean
    assert 3.0 < sum(gaps) / len(gaps) < 7.5
