"""Failure traces (planaria.sim.traces).

Covers: every generator is deterministic for a seed and differs across seeds; per-device
traces fail each node at most once, within the horizon; per-cluster traces end with exactly
min_nodes live, at the horizon; spot traces keep 1..N nodes live and join only absent ones
(hypothesis over every generator: events ordered, within the horizon); the mean gap of a long
per-cluster trace is near its MTBF; a per-cluster trace given a horizon stops failing there and
ends at it. CSV traces: a valid file round-trips, ending at its last event or at the horizon
given; a header alone with a horizon is a trace without events; a bad header, event, number,
negative time, decreasing times, an event after the horizon, a node outside the cluster, a
failure of a failed node or a join of a live one is a SimInputError naming the line; a header
alone without a horizon is an error asking for one; generator inputs out of range are errors
naming the field.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings

from planaria.sim import errors, traces
from tests import strategies


def test_generators_are_deterministic_for_a_seed() -> None:
    makers: list[Callable[[int], traces.Trace]] = [
        lambda s: traces.per_device(16, 0.3, 7200.0, s),
        lambda s: traces.per_cluster(16, 600.0, 4, s),
        lambda s: traces.spot(16, 300.0, 7200.0, s),
    ]
    for make in makers:
        assert make(3) == make(3)
        assert make(3) != make(4)


def test_per_device_fails_each_node_at_most_once_within_the_horizon() -> None:
    trace = traces.per_device(32, 0.1, 9 * 3600.0, seed=1)
    nodes = [e.node for e in trace.events]
    assert len(nodes) == len(set(nodes))
    assert all(e.kind is traces.Kind.FAIL and e.time_s <= trace.horizon_s for e in trace.events)


def test_per_cluster_runs_until_min_nodes_remain() -> None:
    trace = traces.per_cluster(30, 3600.0, 15, seed=2)
    assert len(trace.events) == 15
    assert len(trace.live_after()[-1]) == 15
    assert trace.horizon_s == trace.events[-1].time_s


def test_per_cluster_with_a_horizon_stops_failing_there() -> None:
    open_ended = traces.per_cluster(30, 3600.0, 15, seed=2)
    capped = traces.per_cluster(30, 3600.0, 15, seed=2, horizon_s=7200.0)
    assert capped.horizon_s == 7200.0
    assert capped.events == tuple(e for e in open_ended.events if e.time_s <= 7200.0)
    longer = traces.per_cluster(30, 3600.0, 15, seed=2, horizon_s=open_ended.horizon_s * 2)
    assert longer.events == open_ended.events  # the floor stops the failures, not the run
    assert longer.horizon_s == open_ended.horizon_s * 2


def test_per_cluster_gaps_average_the_mtbf() -> None:
    trace = traces.per_cluster(2001, 600.0, 1, seed=5)
    times = [0.0] + [e.time_s for e in trace.events]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(600.0, rel=0.1)


@settings(max_examples=60, deadline=None)
@given(strategies.sim_traces(max_nodes=12))
def test_every_trace_is_ordered_and_keeps_a_node_alive(trace: traces.Trace) -> None:
    times = [e.time_s for e in trace.events]
    assert times == sorted(times)
    assert all(0 <= t <= trace.horizon_s for t in times)
    live = set(range(trace.num_nodes))
    for event, after in zip(trace.events, trace.live_after(), strict=True):
        if event.kind is traces.Kind.JOIN:
            assert event.node not in live  # generators join only absent nodes
        live = set(after)
        assert 0 <= len(live) <= trace.num_nodes


def test_spot_traces_add_nodes_back() -> None:
    trace = traces.spot(30, 462.0, 12 * 3600.0, seed=0)
    kinds = {e.kind for e in trace.events}
    assert kinds == {traces.Kind.FAIL, traces.Kind.JOIN}
    assert min(len(live) for live in trace.live_after()) >= 1


def test_csv_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("time,event,node\n10,fail,3\n20.5,join,3\n30,fail,1\n")
    trace = traces.read_csv(path, num_nodes=4)
    assert [(e.time_s, e.kind, e.node) for e in trace.events] == [
        (10.0, traces.Kind.FAIL, 3),
        (20.5, traces.Kind.JOIN, 3),
        (30.0, traces.Kind.FAIL, 1),
    ]
    assert trace.horizon_s == 30.0
    assert traces.read_csv(path, num_nodes=4, horizon_s=3600.0).horizon_s == 3600.0


def test_a_header_alone_is_a_fault_free_trace_of_the_horizon(tmp_path: Path) -> None:
    path = tmp_path / "empty.csv"
    path.write_text("time,event,node\n")
    trace = traces.read_csv(path, num_nodes=4, horizon_s=7200.0)
    assert trace.events == () and trace.horizon_s == 7200.0
    with pytest.raises(errors.SimInputError, match="no event after time 0 ends the run"):
        traces.read_csv(path, num_nodes=4)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("when,what,who\n", "line 1 must be the header time,event,node"),
        ("time,event,node\n10,explode,3\n", "line 2: event is 'explode'; give fail or join"),
        ("time,event,node\nten,fail,3\n", "line 2: time must be seconds"),
        ("time,event,node\n10,fail\n", "line 2: give three fields"),
        ("time,event,node\n-1,fail,3\n", "line 2: time must be finite seconds >= 0"),
        ("time,event,node\n10,fail,1\n5,fail,2\n", "line 3: times must not decrease"),
        (
            "time,event,node\n10,fail,1\n20,fail,999\n",
            r"line 3: node 999 is not in the cluster \(nodes 0..3\)",
        ),
        ("time,event,node\n10,fail,4\n", r"line 2: node 4 is not in the cluster"),
        ("time,event,node\n10,join,9\n", r"line 2: node 9 is not in the cluster"),
        (
            "time,event,node\n10,fail,1\n20,join,1\n30,fail,1\n40,fail,1\n",
            "line 5: node 1 already failed at line 4",
        ),
        ("time,event,node\n10,join,2\n", "line 2: node 2 cannot join, it is live from the start"),
        (
            "time,event,node\n10,fail,2\n20,join,2\n30,join,2\n",
            "line 4: node 2 cannot join, it is live since line 3",
        ),
        ("time,event,node\n10,fail,2\n7201,fail,3\n", "line 3: time 7201 s is after the horizon"),
    ],
    ids=[
        "a wrong header is refused",
        "an unknown event is named",
        "a time that is not a number is refused",
        "a short row is refused",
        "a negative time is refused",
        "decreasing times are refused",
        "a failure of a node outside the cluster is refused",
        "the first id past the cluster is refused",
        "a join of a node outside the cluster is refused",
        "a second failure without a join between is refused",
        "a join of a node live from the start is refused",
        "a join of a node that already joined is refused",
        "an event after the horizon is refused",
    ],
)
def test_csv_errors_name_the_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(errors.SimInputError, match=message):
        traces.read_csv(path, num_nodes=4, horizon_s=7200.0)


def test_missing_csv_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(errors.SimInputError, match="cannot read trace"):
        traces.read_csv(tmp_path / "absent.csv", num_nodes=4)


def test_generator_inputs_are_checked() -> None:
    with pytest.raises(ValueError, match="rate_per_hour is 0"):
        traces.per_device(4, 0.0, 100.0, 0)
    with pytest.raises(ValueError, match="min_nodes is 4; give 1..3"):
        traces.per_cluster(4, 60.0, 4, 0)
