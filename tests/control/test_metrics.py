"""Prometheus metrics from the job's status (planaria.control.metrics), scraped over HTTP.

Covers: gauges follow the latest status, one phase set at a time, recoveries counted by tier
and kind with their seconds in the histogram and their lost steps, each sink on its own
registry, the endpoint served on a free port, and a non-status value refused.
"""

from __future__ import annotations

import urllib.request

import pytest

from planaria.contract import plan as plans
from planaria.control import metrics, status
from planaria.wire import messages


def _status(step: int, recoveries: tuple[status.Recovery, ...] = ()) -> status.JobStatus:
    view = status.View(
        phase=status.Phase.RUNNING,
        epoch=len(recoveries) + 1,
        step=step,
        loss=1.0,
        samples_per_s=123.5,
        live_workers=7,
        total_workers=8,
        plan=None,
        plan_kind=status.MoveKind.INITIAL,
        recoveries=recoveries,
        message="",
    )
    return status.compute(view)


def _recovery(total_s: float, lost: int) -> status.Recovery:
    return status.Recovery(
        started_s=0.0,
        failed=(plans.WorkerId(3),),
        epoch=2,
        tier=messages.RecoveryTier.LIVE_REPLICA,
        kind=status.MoveKind.DYNAMIC,
        reason="r",
        total_s=total_s,
        lost_steps=lost,
    )


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


@pytest.mark.asyncio
async def test_the_endpoint_serves_the_latest_status_and_counts_recoveries() -> None:
    sink = metrics.MetricsSink("demo")
    server = metrics.serve(sink, 0)
    try:
        port = server.server_port
        await sink.publish(_status(10))
        first = _recovery(0.3, 1)
        await sink.publish(_status(20, (first,)))
        await sink.publish(_status(21, (first,)))  # the same recovery is not counted twice
        scraped = _scrape(port)
    finally:
        server.shutdown()
        server.server_close()
    job = '{job="demo"}'
    assert scraped[f"planaria_step{job}"] == 21
    assert scraped[f"planaria_samples_per_second{job}"] == 123.5
    assert scraped[f"planaria_live_workers{job}"] == 7
    assert scraped[f"planaria_epoch{job}"] == 2
    assert scraped['planaria_phase{job="demo",phase="Running"}'] == 1
    assert scraped['planaria_phase{job="demo",phase="Suspended"}'] == 0
    assert scraped['planaria_recoveries_total{job="demo",kind="dynamic",tier="live_replica"}'] == 1
    assert scraped[f"planaria_recovery_seconds_count{job}"] == 1
    assert scraped['planaria_recovery_seconds_bucket{job="demo",le="0.5"}'] == 1
    assert scraped['planaria_recovery_seconds_bucket{job="demo",le="0.25"}'] == 0
    assert scraped[f"planaria_lost_steps_total{job}"] == 1


@pytest.mark.asyncio
async def test_sinks_keep_separate_registries() -> None:
    one, two = metrics.MetricsSink("a"), metrics.MetricsSink("a")
    await one.publish(_status(5))
    assert one.registry.get_sample_value("planaria_step", {"job": "a"}) == 5
    assert two.registry.get_sample_value("planaria_step", {"job": "a"}) == 0
