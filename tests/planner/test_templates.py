"""Pipeline templates and node specification (planaria.planner.templates).

Covers: n0 is the fewest nodes a pipeline fits on and sizes run n0..N - f*n0; every template is
the exact mapping of its size; App. A: every N' in [(f + 1) n0, N] is covered by an
instantiation with at least f + 1 pipelines, both for the full sizes and for sizes cut short at
2 n0 - 1; sizes stop (with a reason) where a model has too few layers, and that is refused when
it would break App. A; N < (f + 1) n0, a model that fits nowhere and bad arguments are refused
with errors that say what to change; fitted templates (instantiation.fit_templates): each size
the best plan uses is mapped for the most micro-batches its pipelines run, with the T a
brute-force enumerator finds for that count, the plan is no slower than with 4S templates, a
mapping deeper than its count is not used, and unused sizes stay at 4S.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.contract import errors, profile, shapes
from planaria.planner import (
    accelerators,
    instantiation,
    stage_mapping,
    stage_table,
    synthetic,
    templates,
)
from tests.planner import test_stage_mapping

MIB = 2**20


def tiny(gpus_per_node: int) -> profile.Profile:
    """The `tiny` model (6 planner layers) on A100s, micro-batch 2."""
    return synthetic.synthesize(
        shapes.named("tiny"), accelerators.named("a100-80gb"), 2, gpus_per_node
    )


def test_sizes_run_from_n0_to_n_minus_f_n0_and_each_is_the_exact_mapping() -> None:
    source = tiny(2)
    result = templates.generate_templates(
        source, num_nodes=6, gpus_per_node=2, fault_tolerance=1, memory_bytes=2 * MIB
    )
    assert result.min_nodes == 2
    assert result.sizes == (2, 3, 4)
    table = stage_table.build_table(source, gpus_per_node=2, memory_bytes=2 * MIB)
    fresh = stage_mapping.MappingSearch(table, gpus_per_node=2, max_nodes=6)
    assert not fresh.feasible()[1]
    for template in result.templates:
        expected = fresh.map(template.num_nodes).iteration_time_s()
        assert template.iteration_time_s() == pytest.approx(expected, rel=1e-12)
        assert template.mapping.num_nodes == template.num_nodes
    assert "n0 = 2" in result.node_spec.reason and "N - f*n0" in result.node_spec.reason
    assert result.layer_state_bytes == tuple(
        layer.parameter_bytes + layer.optimizer_bytes for layer in source.layers
    )


def test_f_zero_with_ample_memory_makes_a_template_of_every_size() -> None:
    result = templates.generate_templates(tiny(1), num_nodes=4, gpus_per_node=1, fault_tolerance=0)
    assert result.sizes == (1, 2, 3, 4)
    assert result.template(3).num_stages == 3


def test_sizes_stop_where_the_model_runs_out_of_layers() -> None:
    result = templates.generate_templates(tiny(1), num_nodes=9, gpus_per_node=1, fault_tolerance=0)
    assert result.sizes == (1, 2, 3, 4, 5, 6)
    assert "sizes stop at 6" in result.node_spec.reason


def test_stopping_short_of_2_n0_minus_1_is_refused() -> None:
    # Each of the 2 layers needs a node of its own (n0 = 2), so no pipeline spans 3 = 2 n0 - 1.
    layer = profile.LayerProfile(
        name="big",
        forward_s=(1.0,),
        backward_s=(2.0,),
        parameter_bytes=60,
        gradient_bytes=0,
        optimizer_bytes=0,
        activation_bytes=0,
        output_bytes=8,
    )
    link = profile.LinkProfile(bandwidth_bytes_per_s=1e9, latency_s=0.0)
    source = profile.Profile(
        model="two-big-layers",
        accelerator="hand",
        micro_batch_size=1,
        memory_bytes=100,
        layers=(layer, layer),
        intra_node=link,
        inter_node=link,
    )
    with pytest.raises(errors.InfeasibleError, match=r"must cover 2\.\.3 nodes"):
        templates.generate_templates(source, num_nodes=4, gpus_per_node=1, fault_tolerance=0)


def test_too_few_nodes_for_the_fault_tolerance_says_what_to_change() -> None:
    with pytest.raises(errors.InfeasibleError, match="lower the fault tolerance to 2"):
        templates.generate_templates(
            tiny(2), num_nodes=7, gpus_per_node=2, fault_tolerance=3, memory_bytes=2 * MIB
        )


def test_a_model_that_fits_nowhere_is_refused() -> None:
    with pytest.raises(errors.InfeasibleError, match="does not fit"):
        templates.generate_templates(
            tiny(1), num_nodes=3, gpus_per_node=1, fault_tolerance=0, memory_bytes=MIB
        )


@pytest.mark.parametrize(
    ("nodes", "gpus", "f", "field"),
    [
        pytest.param(0, 1, 0, "number of nodes", id="no nodes"),
        pytest.param(2, 0, 0, "GPUs per node", id="no GPUs"),
        pytest.param(2, 1, -1, "fault tolerance", id="negative fault tolerance"),
    ],
)
def test_bad_arguments_name_the_field(nodes: int, gpus: int, f: int, field: str) -> None:
    with pytest.raises(errors.PlanInputError, match=field):
        templates.generate_templates(
            tiny(1), num_nodes=nodes, gpus_per_node=gpus, fault_tolerance=f
        )


def test_asking_for_a_missing_template_lists_the_sizes() -> None:
    result = templates.generate_templates(tiny(1), num_nodes=3, gpus_per_node=1, fault_tolerance=0)
    with pytest.raises(errors.PlanInputError, match=r"1\.\.3"):
        result.template(5)


@settings(max_examples=150, deadline=None)
@given(
    n0=st.integers(1, 5),
    f=st.integers(0, 3),
    spare=st.integers(0, 12),
    cut=st.booleans(),
)
def test_every_feasible_node_count_has_an_instantiation(
    n0: int, f: int, spare: int, cut: bool
) -> None:
    """Oobleck App. A, for the sizes n0..N - f*n0 and for sizes stopped at 2 n0 - 1."""
    num_nodes = (f + 1) * n0 + spare
    top = num_nodes - f * n0
    last = min(top, 2 * n0 - 1) if cut else top
    sizes = list(range(n0, last + 1))
    for survivors in range((f + 1) * n0, num_nodes + 1):
        options = instantiation.enumerate_instantiations(sizes, survivors, f)
        assert options, f"no instantiation of {survivors} nodes from {sizes}"
        assert all(option.num_pipelines >= f + 1 for option in options)
        assert all(option.num_nodes == survivors for option in options)


@settings(max_examples=12, deadline=None)
@given(
    config=st.sampled_from([(6, 2, 1, 2 * MIB), (5, 1, 1, None), (4, 2, 0, None)]),
    global_batch=st.sampled_from([4, 8, 24, 96]),
)
def test_fitted_templates_are_exact_for_the_micro_batches_the_plan_runs(
    config: tuple[int, int, int, int | None], global_batch: int
) -> None:
    num_nodes, m, f, memory = config
    source = tiny(m)
    at_4s = templates.generate_templates(
        source, num_nodes=num_nodes, gpus_per_node=m, fault_tolerance=f, memory_bytes=memory
    )
    fitted = instantiation.fit_templates(at_4s, source, global_batch, memory)
    nodes = list(range(num_nodes))
    before = instantiation.choose_plan(at_4s, nodes, global_batch)
    after = instantiation.choose_plan(fitted, nodes, global_batch)
    assert after.chosen.throughput >= before.chosen.throughput
    table = stage_table.build_table(source, gpus_per_node=m, memory_bytes=memory)
    runs: dict[int, int] = {}
    for size, count in zip(
        after.chosen.instantiation.pipeline_sizes,
        after.chosen.distribution.micro_batches,
        strict=True,
    ):
        runs[size] = max(runs.get(size, 0), count)
    for template in fitted.templates:
        planned = template.mapping.planned_micro_batches
        if planned is None:
            assert template == at_4s.template(template.num_nodes)
            continue
        expected = test_stage_mapping.brute_force(table, template.num_nodes, m, planned)
        assert template.iteration_time_s(planned) == pytest.approx(expected, rel=1e-12)
        assert template.iteration_time_s(planned) <= at_4s.template(
            template.num_nodes
        ).iteration_time_s(planned) * (1 + 1e-12)
    # the fit settled: the sizes the plan uses are mapped for what they run (or the fit stopped
    # after FIT_ROUNDS, which these inputs never reach)
    for size, count in runs.items():
        mapping = fitted.template(size).mapping
        if mapping.planned_micro_batches is None:
            # dropped: the exact mapping for `count` has more stages than micro-batches
            search = stage_mapping.MappingSearch(
                table, gpus_per_node=m, max_nodes=size, num_micro_batches=count
            )
            assert search.map(size).num_stages > count
        else:
            assert mapping.planned_micro_batches == count
            assert mapping.num_stages <= count
