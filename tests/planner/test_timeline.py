"""The virtual timeline (planaria.contract.timeline) that orders every schedule stream.

Covers:
- `one_f_one_b`: warm-up depth, alternation, every slot once forward and once backward;
- `unit_times`: every op ends strictly after the op it depends on and after the previous op
  of its stage (the property the no-deadlock argument rests on); the last op ends at
  2 (N + S - 1), eq. 9 with unit costs;
- `pack_slots`: slots increase along each pipeline, no worker gets two micro-batches in one slot,
  micro-batch j sits in slot j when no pipeline borrows a worker, and a pipeline borrowing peers
  gets consecutive slots first.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.contract import plan, timeline

W = plan.WorkerId


@given(
    num_stages=st.integers(min_value=1, max_value=6),
    stage_seed=st.integers(min_value=0, max_value=5),
    slots=st.lists(st.integers(min_value=0, max_value=20), unique=True, max_size=8),
)
def test_one_f_one_b_has_the_warm_up_depth_and_every_slot_twice(
    num_stages: int, stage_seed: int, slots: list[int]
) -> None:
    stage = stage_seed % num_stages
    order = timeline.one_f_one_b(num_stages, stage, slots)
    assert sorted(s for b, s in order if not b) == sorted(slots)
    assert sorted(s for b, s in order if b) == sorted(slots)
    in_flight, most = 0, 0
    for is_backward, _ in order:
        in_flight += -1 if is_backward else 1
        most = max(most, in_flight)
        assert in_flight >= 0
    assert most == min(len(slots), num_stages - stage)


@settings(max_examples=40)
@given(
    num_stages=st.integers(min_value=1, max_value=6),
    num_slots=st.integers(min_value=1, max_value=10),
)
def test_unit_times_respect_every_dependency_and_give_eq_9(num_stages: int, num_slots: int) -> None:
    forward, backward = timeline.unit_times(num_stages, num_slots)
    for s in range(num_stages):
        for j in range(num_slots):
            if s > 0:
                assert forward[s][j] > forward[s - 1][j]
            upstream = backward[s + 1][j] if s + 1 < num_stages else forward[s][j]
            assert backward[s][j] > upstream
        ends = [
            (backward if b else forward)[s][j]
            for b, j in timeline.one_f_one_b(num_stages, s, range(num_slots))
        ]
        assert ends == sorted(set(ends))
    assert max(max(row) for row in backward) == 2 * (num_slots + num_stages - 1)


@st.composite
def routed_pipelines(draw: st.DrawFn) -> tuple[list[list[timeline.Route]], list[frozenset[W]]]:
    """Pipelines of one depth; each micro-batch borrows, at some stages, another pipeline's
    worker of the same stage."""
    num_pipelines = draw(st.integers(min_value=1, max_value=4))
    depth = draw(st.integers(min_value=1, max_value=4))
    own = [[W(p * depth + s) for s in range(depth)] for p in range(num_pipelines)]
    routes = []
    for p in range(num_pipelines):
        count = draw(st.integers(min_value=0, max_value=6))
        pick = st.integers(min_value=0, max_value=num_pipelines - 1)
        routes.append(
            [
                tuple(
                    own[draw(pick)][s] if draw(st.booleans()) else own[p][s] for s in range(depth)
                )
                for _ in range(count)
            ]
        )
    return routes, [frozenset(o) for o in own]


@settings(max_examples=100)
@given(routed=routed_pipelines())
def test_packed_slots_increase_and_never_double_book_a_worker(
    routed: tuple[list[list[timeline.Route]], list[frozenset[W]]],
) -> None:
    routes, owners = routed
    slots = timeline.pack_slots(routes, owners)
    booked: set[tuple[W, int]] = set()
    for pipeline, pipeline_slots in zip(routes, slots, strict=True):
        assert list(pipeline_slots) == sorted(set(pipeline_slots))
        for route, slot in zip(pipeline, pipeline_slots, strict=True):
            for worker in route:
                assert (worker, slot) not in booked
                booked.add((worker, slot))


def test_without_borrowing_micro_batch_j_sits_in_slot_j() -> None:
    routes = [[(W(0), W(1))] * 3, [(W(2), W(3))] * 5]
    assert timeline.pack_slots(routes, [frozenset({W(0), W(1)}), frozenset({W(2), W(3)})]) == (
        (0, 1, 2),
        (0, 1, 2, 3, 4),
    )


def test_a_pipeline_borrowing_peers_goes_first() -> None:
    """Pipeline 1 lost its stage 1 and borrows worker 1 (pipeline 0's stage 1) for both of its
    micro-batches: they take slots 0 and 1, pipeline 0's own fill slots 2 and 3."""
    routes = [[(W(0), W(1))] * 2, [(W(2), W(1))] * 2]
    owners = [frozenset({W(0), W(1)}), frozenset({W(2)})]
    assert timeline.pack_slots(routes, owners) == ((2, 3), (0, 1))
