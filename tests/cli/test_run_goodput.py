"""Goodput and rates of the run report, measured over the steps trained (planaria.cli.run_goodput,
through planaria.cli.run_report), from histories built directly (no workers, no clock).

Covers: a run without failures is 100% of fault-free whatever its start-up and shutdown took
(hypothesis; the report once divided by time up to the end of shutdown and said 21-40%); a
failure inside the window costs exactly its seconds; a rollback's retrained steps count once;
the fault-free rate is samples over seconds at full strength, never across an epoch change nor
from the controller's per-record rates; a ratio above 100% says why; under two records there is
no goodput and under two full-strength records no fault-free rate, said so in summary.md; each
recovery's measured rate is its epoch's, beside the reason's eq. 8 figure labelled an estimate
for one device per worker (summary.md and recoveries.json); a reason without an estimate is left
as it is.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planaria.cli import run_goodput, run_report
from planaria.contract import plan as plans
from planaria.control import status as statuses
from planaria.wire import messages

BATCH = 32
WORKERS = 4
# The controller's wording (planaria.control.planning), with the estimate a CPU run quoted.
REASON = (
    "chose dynamic: DP=3 PP=1; 1114 samples/s estimated by Odyssey eq. 8 for one device per "
    "worker, among 5 candidate(s)"
)


def _record(at_s: float, step: int, epoch: int = 1, live: int = WORKERS) -> statuses.StepRecord:
    # samples_per_s is nonsense on purpose: the report must not read the per-record rates.
    return statuses.StepRecord(
        at_s=at_s, step=step, loss=1.0, samples_per_s=1e6, live_workers=live, epoch=epoch
    )


def _history(
    steps: list[statuses.StepRecord],
    *,
    finished_s: float,
    recoveries: tuple[statuses.Recovery, ...] = (),
) -> run_report.History:
    final = statuses.JobStatus(
        phase=statuses.Phase.SUCCEEDED,
        conditions=(),
        epoch=steps[-1].epoch if steps else 1,
        step=steps[-1].step if steps else 0,
        loss=None,
        samples_per_s=0.0,
        live_workers=0,
        total_workers=WORKERS,
        plan="",
        last_recovery=recoveries[-1] if recoveries else None,
        recoveries=len(recoveries),
        message="",
    )
    return run_report.History(
        job="job",
        global_batch_size=BATCH,
        final=final,
        steps=tuple(steps),
        recoveries=recoveries,
        started_s=0.0,
        finished_s=finished_s,
    )


def _recovery(at_s: float, epoch: int, reason: str = REASON, lost: int = 0) -> statuses.Recovery:
    return statuses.Recovery(
        started_s=at_s,
        failed=(plans.WorkerId(3),),
        epoch=epoch,
        tier=messages.RecoveryTier.LIVE_REPLICA,
        kind=statuses.MoveKind.DYNAMIC,
        reason=reason,
        total_s=5.0,
        lost_steps=lost,
    )


@given(
    startup_s=st.floats(0.0, 600.0),
    step_s=st.floats(0.01, 60.0),
    num_steps=st.integers(2, 300),
    shutdown_s=st.floats(0.0, 600.0),
)
def test_a_run_without_failures_is_all_of_fault_free_whatever_start_up_and_shutdown_took(
    startup_s: float, step_s: float, num_steps: int, shutdown_s: float
) -> None:
    steps = [_record(startup_s + i * step_s, i + 1) for i in range(num_steps)]
    history = _history(steps, finished_s=steps[-1].at_s + shutdown_s)
    good = run_report.goodput(history)
    assert good.training_samples_per_s == pytest.approx(BATCH / step_s)
    assert good.fault_free_samples_per_s == pytest.approx(BATCH / step_s)
    assert good.ratio == pytest.approx(1.0)
    assert good.startup_s == pytest.approx(startup_s) and good.shutdown_s == pytest.approx(
        shutdown_s
    )


def _failed_run(lost: int = 0) -> run_report.History:
    """Steps 1..50 at 1 s each from t=10 (4 workers), a failure costing 10 s, then the steps
    from 51 - lost to 100 at 1.5 s each on 3 workers."""
    steps = [_record(10.0 + i, i + 1) for i in range(50)]
    resumed = 50 - lost
    steps += [
        _record(59.0 + 10.0 + (i + 1) * 1.5, resumed + i + 1, epoch=2, live=3)
        for i in range(100 - resumed)
    ]
    return _history(steps, finished_s=steps[-1].at_s + 4.0, recoveries=(_recovery(59.5, 2),))


def test_a_failure_inside_the_window_costs_exactly_its_time() -> None:
    good = run_report.goodput(_failed_run())
    window_s = 49.0 + 10.0 + 50 * 1.5
    assert (good.first_step, good.last_step, good.training_s) == (1, 100, window_s)
    assert good.training_samples_per_s == pytest.approx(99 * BATCH / window_s)
    assert good.fault_free_samples_per_s == pytest.approx(BATCH / 1.0)
    assert good.ratio == pytest.approx(99 / window_s)


def test_steps_trained_again_after_a_rollback_count_once() -> None:
    good = run_report.goodput(_failed_run(lost=5))
    window_s = 49.0 + 10.0 + 55 * 1.5
    assert good.training_samples_per_s == pytest.approx(99 * BATCH / window_s)


def test_the_fault_free_rate_never_spans_an_epoch_change_or_a_step_short_of_workers() -> None:
    steps = [_record(0.0, 1), _record(1.0, 2), _record(2.0, 3, live=3)]  # a worker gone
    steps += [_record(100.0, 4, epoch=2), _record(102.0, 5, epoch=2)]  # back, slower
    good = run_report.goodput(_history(steps, finished_s=110.0))
    assert good.fault_free_s == pytest.approx(3.0)  # 1 s in epoch 1, 2 s in epoch 2
    assert good.fault_free_samples_per_s == pytest.approx(2 * BATCH / 3.0)


def test_too_few_records_give_no_rate_and_the_summary_says_so() -> None:
    lone = _history([_record(5.0, 1)], finished_s=9.0)
    good = run_report.goodput(lone)
    assert good.training_samples_per_s is None and good.ratio is None
    assert "- goodput: none (fewer than two steps recorded)" in run_report.summary(lone)
    short = _history([_record(5.0, 1, live=3), _record(6.0, 2, live=3)], finished_s=9.0)
    text = run_report.summary(short)
    assert "- fault-free: none measured (no two consecutive steps at full strength)" in text
    assert run_report.goodput(_history([], finished_s=3.0)).startup_s == 3.0


def test_the_summary_states_the_window_and_the_ratio() -> None:
    text = run_report.summary(_failed_run())
    assert "start-up 10.0 s, training 134.0 s, shutdown 4.0 s" in text
    assert "- goodput: 23.6 samples/s over the steps trained, step 1 to 100 in 134.0 s" in text
    assert "- fault-free: 32.0 samples/s measured over 49.0 s of steps at full strength" in text
    assert "- goodput / fault-free: **74%**" in text


def test_a_run_faster_after_losing_workers_says_why_it_is_above_fault_free() -> None:
    # 8 processes on 2 cores: the 3 left after a failure step faster than the 4 did.
    steps = [_record(10.0 + i, i + 1) for i in range(10)]
    steps += [_record(20.0 + i * 0.5, 11 + i, epoch=2, live=3) for i in range(40)]
    history = _history(steps, finished_s=45.0, recoveries=(_recovery(19.5, 2),))
    good = run_report.goodput(history)
    assert good.ratio is not None and good.ratio > 1
    assert "  (above 100%: steps ran faster after workers were lost" in run_report.summary(history)
    assert "above 100%" not in run_report.summary(_failed_run())


def test_a_reasons_estimate_is_labelled_with_the_measured_rate_beside_it(tmp_path: Path) -> None:
    history = _failed_run()
    measured = BATCH / 1.5  # epoch 2: a step every 1.5 s
    (row,) = [line for line in run_report.summary(history).splitlines() if line.startswith("| 1 ")]
    assert f"| {measured:.1f} |" in row
    assert (
        "1114 samples/s estimated by Odyssey eq. 8 for one device per worker "
        f"(measured {measured:.4g} samples/s), among 5 candidate(s)" in row
    )
    run_report.write_report(history, tmp_path)
    (written,) = json.loads((tmp_path / "recoveries.json").read_text(encoding="utf-8"))
    assert written["estimated_samples_per_s"] == 1114.0
    assert written["measured_samples_per_s"] == pytest.approx(measured)


def test_a_reason_without_an_estimate_or_an_epoch_without_two_steps_is_left_plain() -> None:
    assert run_goodput.labelled_reason("rerouted", 10.0) == "rerouted"
    assert run_goodput.estimated_samples_per_s("rerouted") is None
    assert run_goodput.labelled_reason(REASON, None).endswith(
        "for one device per worker (not measured), among 5 candidate(s)"
    )
    assert run_goodput.epoch_rate([_record(1.0, 1)], 1, BATCH) is None
