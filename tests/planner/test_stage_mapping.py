"""GPU-stage mapping (planaria.planner.stage_table, stage_dp, stage_mapping).

Covers: the closed form of eq. 1-4 (eq. 4's single stage, the uniform 1F1B time, the first-argmax
tie rule, linearity in N_b); the stage table (times are in-order layer sums plus 2 transfers over
the right link, memory limits agree with exact integer checks); the DP's optimum equals a
brute-force enumerator over every layer partition and GPU split on small inputs (L <= 8, <= 3
nodes, <= 4 GPUs per node; hypothesis profiles with ties and binding memory; N_b = 4S and given
N_b), for every template size of one shared search; the mapping it returns is well formed and
fits in memory; feasibility and the bottleneck floor (least slowest stage) agree with the
enumerator; infeasible sizes raise InfeasibleError.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.contract import errors, profile
from planaria.planner import stage_dp, stage_mapping, stage_table
from tests import strategies


def _compositions(total: int, largest: int) -> Iterator[tuple[int, ...]]:
    if total == 0:
        yield ()
        return
    for first in range(1, min(total, largest) + 1):
        for rest in _compositions(total - first, largest):
            yield (first, *rest)


def brute_force(
    table: stage_table.StageTable,
    num_nodes: int,
    m: int,
    num_micro_batches: int | None,
    *,
    slowest_only: bool = False,
) -> float:
    """The least T over every pipeline on num_nodes nodes: each node's GPUs split into
    consecutive stages in every way, every layer partition, memory checked at 1F1B depth (with
    `slowest_only`, the least slowest-stage time instead, memory checked at depth 1)."""
    best = math.inf
    splits = list(_compositions(m, table.max_gpus))
    for per_node in itertools.product(splits, repeat=num_nodes):
        widths = [k for node in per_node for k in node]
        owners = [i for i, node in enumerate(per_node) for _ in node]
        s = len(widths)
        if s > table.num_layers:
            continue
        links = [
            stage_table.Link.NONE
            if i == s - 1
            else stage_table.Link.INTRA
            if owners[i] == owners[i + 1]
            else stage_table.Link.INTER
            for i in range(s)
        ]
        n_b = num_micro_batches or 4 * s
        for cuts in itertools.combinations(range(1, table.num_layers), s - 1):
            bounds = (0, *cuts, table.num_layers)
            stages = list(zip(bounds, bounds[1:], widths, strict=False))
            depths = [1 if slowest_only else min(s - i, n_b) for i in range(s)]
            if not all(table.fits(a, b, k, r) for (a, b, k), r in zip(stages, depths, strict=True)):
                continue
            times = [table.stage_time_s(a, b, k, links[i]) for i, (a, b, k) in enumerate(stages)]
            value = max(times) if slowest_only else stage_table.pipeline_time_s(times, n_b)
            best = min(best, value)
    return best


def _layer(forward: float, backward: float, **fields: int) -> profile.LayerProfile:
    values = {
        "parameter_bytes": 0,
        "gradient_bytes": 0,
        "optimizer_bytes": 0,
        "activation_bytes": 0,
        "output_bytes": 0,
    }
    values.update(fields)
    return profile.LayerProfile(name="l", forward_s=(forward,), backward_s=(backward,), **values)


def _profile(layers: list[profile.LayerProfile], memory: int = 10**9) -> profile.Profile:
    link = profile.LinkProfile(bandwidth_bytes_per_s=100.0, latency_s=0.5)
    return profile.Profile(
        model="hand",
        accelerator="hand",
        micro_batch_size=1,
        memory_bytes=memory,
        layers=tuple(layers),
        intra_node=link,
        inter_node=profile.LinkProfile(bandwidth_bytes_per_s=10.0, latency_s=1.0),
    )


def test_one_stage_with_four_micro_batches_is_eq_4() -> None:
    assert stage_table.pipeline_time_s([3.0], 4) == 3.0 + 2 * 3.0 + 3.0


@pytest.mark.parametrize("num_stages", [1, 2, 5])
@pytest.mark.parametrize("num_micro_batches", [1, 4, 9])
def test_equal_stages_take_the_textbook_1f1b_time(num_stages: int, num_micro_batches: int) -> None:
    time = stage_table.pipeline_time_s([2.0] * num_stages, num_micro_batches)
    assert time == (num_micro_batches + num_stages - 1) * 2.0


def test_the_first_of_tied_slowest_stages_is_the_bottleneck() -> None:
    times = [3.0, 1.0, 3.0, 2.0]
    assert stage_table.slowest_stage(times) == 0
    # k* = 0: T1 = 9, T2 = (8 - 4 + 0 - 1) * 3 = 9, T3 = 9.
    assert stage_table.pipeline_time_s(times, 8) == 27.0


@given(st.lists(st.floats(0, 10), min_size=1, max_size=6), st.integers(1, 40))
def test_pipeline_time_is_linear_in_micro_batches(times: list[float], n_b: int) -> None:
    slope = times[stage_table.slowest_stage(times)]
    gap = stage_table.pipeline_time_s(times, n_b + 1) - stage_table.pipeline_time_s(times, n_b)
    assert gap == pytest.approx(slope, rel=1e-9, abs=1e-9)


def test_stage_times_add_layers_in_order_and_two_transfers_over_the_link() -> None:
    layers = [_layer(1.0, 2.0, output_bytes=100), _layer(0.5, 0.25, output_bytes=50)]
    table = stage_table.build_table(_profile(layers), gpus_per_node=1)
    assert table.stage_time_s(0, 2, 1, stage_table.Link.NONE) == 3.75
    # Intra-node: 2 * (0.5 s + 100 B / 100 B/s); inter-node: 2 * (1 s + 100 B / 10 B/s).
    assert table.stage_time_s(0, 1, 1, stage_table.Link.INTRA) == 3.0 + 3.0
    assert table.stage_time_s(0, 1, 1, stage_table.Link.INTER) == 3.0 + 22.0


@settings(max_examples=40, deadline=None)
@given(strategies.planning_profiles(), st.integers(1, 4))
def test_memory_limits_agree_with_exact_integer_checks(source: profile.Profile, m: int) -> None:
    table = stage_table.build_table(source, gpus_per_node=m)
    for k in range(1, table.max_gpus + 1):
        for start in range(table.num_layers):
            for stop in range(start + 1, table.num_layers + 1):
                limit = table.max_depth[k - 1, start, stop - start - 1]
                for depth in (1, 2, 5):
                    assert table.fits(start, stop, k, depth) == (depth <= limit)


def _check_well_formed(
    mapping: stage_mapping.StageMapping, table: stage_table.StageTable, m: int
) -> None:
    stages = mapping.stages
    assert stages[0].layer_start == 0 and stages[-1].layer_stop == table.num_layers
    assert all(a.layer_stop == b.layer_start for a, b in itertools.pairwise(stages))
    assert [s.node for s in stages] == sorted(s.node for s in stages)
    assert {s.node for s in stages} == set(range(mapping.num_nodes))
    for node in range(mapping.num_nodes):
        mine = [s for s in stages if s.node == node]
        assert [s.gpu_start for s in mine] == list(
            itertools.accumulate([0] + [s.num_gpus for s in mine[:-1]])
        )
        assert sum(s.num_gpus for s in mine) == m
        assert all(1 <= s.num_gpus <= table.max_gpus for s in mine)
    n_b = mapping.planning_micro_batches
    for i, s in enumerate(stages):
        assert table.fits(s.layer_start, s.layer_stop, s.num_gpus, min(len(stages) - i, n_b))


@settings(max_examples=300, deadline=None)
@given(
    source=strategies.planning_profiles(max_layers=7),
    m=st.integers(1, 4),
    max_nodes=st.integers(1, 3),
    num_micro_batches=st.sampled_from([None, None, 1, 3, 8]),
)
def test_the_optimum_equals_a_brute_force_enumerator(
    source: profile.Profile, m: int, max_nodes: int, num_micro_batches: int | None
) -> None:
    table = stage_table.build_table(source, gpus_per_node=m)
    search = stage_mapping.MappingSearch(
        table, gpus_per_node=m, max_nodes=max_nodes, num_micro_batches=num_micro_batches
    )
    feasible = search.feasible()
    for n in range(max_nodes, 0, -1):
        expected = brute_force(table, n, m, num_micro_batches)
        assert feasible[n] == math.isfinite(expected)
        if not math.isfinite(expected):
            with pytest.raises(errors.InfeasibleError):
                search.map(n)
            continue
        mapping = search.map(n)
        _check_well_formed(mapping, table, m)
        assert mapping.iteration_time_s() == pytest.approx(expected, rel=1e-9, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    source=strategies.planning_profiles(max_layers=6),
    m=st.integers(1, 3),
    max_nodes=st.integers(1, 3),
)
def test_the_bottleneck_floor_is_the_least_slowest_stage(
    source: profile.Profile, m: int, max_nodes: int
) -> None:
    table = stage_table.build_table(source, gpus_per_node=m)
    usable = stage_table.usable_times(table, table.max_depth, m, max_nodes)
    floors = stage_dp.bottleneck_floor(usable, m, max_nodes)
    for n in range(1, max_nodes + 1):
        assert floors[n] == brute_force(table, n, m, None, slowest_only=True)


def test_eight_layers_three_nodes_four_gpus_equal_the_enumerator() -> None:
    """The largest case of the acceptance bound, with memory binding at depth."""
    times = [1.0, 2.5, 0.5, 3.0, 1.5, 2.0, 0.75, 1.25]
    layers = [
        profile.LayerProfile(
            name=f"l{i}",
            forward_s=tuple(t / k + 0.1 * (k - 1) for k in range(1, 5)),
            backward_s=tuple(2 * t / k for k in range(1, 5)),
            parameter_bytes=4,
            gradient_bytes=4,
            optimizer_bytes=8,
            activation_bytes=3,
            output_bytes=40,
        )
        for i, t in enumerate(times)
    ]
    table = stage_table.build_table(_profile(layers, memory=40), gpus_per_node=4)
    search = stage_mapping.MappingSearch(table, gpus_per_node=4, max_nodes=3)
    for n in (3, 2, 1):
        expected = brute_force(table, n, 4, None)
        assert search.map(n).iteration_time_s() == pytest.approx(expected, rel=1e-9)


def test_more_nodes_than_layers_is_infeasible_with_a_reason() -> None:
    table = stage_table.build_table(_profile([_layer(1.0, 1.0)] * 2), gpus_per_node=1)
    search = stage_mapping.MappingSearch(table, gpus_per_node=1, max_nodes=3)
    assert search.feasible() == [False, True, True, False]
    with pytest.raises(errors.InfeasibleError, match="at least 3 stages"):
        search.map(3)


def test_a_model_too_big_for_memory_is_infeasible_with_a_reason() -> None:
    layers = [_layer(1.0, 1.0, parameter_bytes=60)] * 2
    table = stage_table.build_table(_profile(layers, memory=50), gpus_per_node=1)
    search = stage_mapping.MappingSearch(table, gpus_per_node=1, max_nodes=2)
    assert search.feasible() == [False, False, False]
    with pytest.raises(errors.InfeasibleError, match="fits in"):
        search.map(2)
