"""`plan.Plan`'s checks of its workers, as the planner's ~1,000-worker layouts meet them.

Covers, against the stage-by-stage walk the checks were before (kept here as the oracle): a
plan is accepted exactly when the walk accepts it, and refused with the walk's message (the
first stage in plan order that spans nodes or holds a worker of an earlier stage) otherwise;
hypothesis over pipelines of stages of 0..3 workers drawn from a few ids (so repeats within a
pipeline and across pipelines are common), on nodes of 1..3 GPUs, with and without reroutes.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.contract import errors, plan


def _old_refusal(plan_fields: dict[str, object]) -> str | None:
    """`Plan.__post_init__` as it was, without the reroutes' checks (which came after): the
    walk over every stage (the oracle). Its message, or None."""
    pipelines = plan_fields["pipelines"]
    gpus = plan_fields["gpus_per_node"]
    assert isinstance(pipelines, tuple) and isinstance(gpus, int)
    if not pipelines:
        return "a plan needs at least one pipeline"
    depths = {p.num_layers for p in pipelines}
    if len(depths) != 1:
        return f"pipelines cover different layer counts: {depths}"
    seen: set[plan.WorkerId] = set()
    for pipeline in pipelines:
        for stage in pipeline.stages:
            nodes = {w // gpus for w in stage.workers}
            if len(nodes) > 1:
                return f"stage {stage.layer_start}-{stage.layer_stop} spans nodes {sorted(nodes)}"
            if seen & set(stage.workers):
                return f"workers {sorted(seen & set(stage.workers))} appear in two stages"
            seen.update(stage.workers)
    return None


@st.composite
def plan_fields(draw: st.DrawFn) -> dict[str, object]:
    """Pipelines of 1..3 stages over 3 layers, each stage 0..3 distinct workers among 0..7."""
    pipelines = []
    for _ in range(draw(st.integers(1, 4))):
        cuts = sorted(draw(st.sets(st.integers(1, 2))))
        bounds = list(zip([0, *cuts], [*cuts, 3], strict=True))
        stages = tuple(
            plan.Stage(
                layer_start=a,
                layer_stop=b,
                workers=tuple(
                    plan.WorkerId(w)
                    for w in draw(st.lists(st.integers(0, 7), max_size=3, unique=True))
                ),
            )
            for a, b in bounds
        )
        pipelines.append(plan.Pipeline(stages=stages, num_micro_batches=draw(st.integers(0, 3))))
    return {
        "pipelines": tuple(pipelines),
        "micro_batch_size": 1,
        "gpus_per_node": draw(st.integers(1, 3)),
    }


@given(plan_fields())
@settings(max_examples=300, deadline=None)
def test_a_plan_is_refused_exactly_as_the_stage_walk_refused_it(fields: dict[str, object]) -> None:
    want = _old_refusal(fields)
    try:
        plan.Plan(**fields)  # type: ignore[arg-type]
    except errors.PlanInputError as error:
        assert str(error) == want
    else:
        assert want is None


@given(plan_fields(), st.integers(0, 3), st.integers(0, 2), st.integers(0, 3))
@settings(max_examples=100, deadline=None)
def test_reroutes_are_checked_after_the_workers(
    fields: dict[str, object], pipeline: int, stage: int, peer: int
) -> None:
    # a fault in the workers is named before any fault of a reroute, as before
    reroute = plan.Reroute(pipeline=pipeline, stage=stage, peer_pipeline=peer, micro_batches=(0,))
    want = _old_refusal(fields)
    try:
        plan.Plan(**fields, reroutes=(reroute,))  # type: ignore[arg-type]
    except errors.PlanInputError as error:
        assert want is None or str(error) == want
    else:
        assert want is None


@given(st.integers(-2, 4), st.integers(-2, 4), st.integers(0, 9))
@settings(max_examples=100, deadline=None)
def test_a_one_worker_stage_is_the_stage_its_constructor_builds(
    start: int, stop: int, worker: int
) -> None:
    # the same object (equal, hashing alike) or the same error as `plan.Stage(...)`
    try:
        want = plan.Stage(layer_start=start, layer_stop=stop, workers=(plan.WorkerId(worker),))
    except errors.PlanInputError as error:
        try:
            plan.one_worker_stage(start, stop, plan.WorkerId(worker))
        except errors.PlanInputError as again:
            assert str(again) == str(error)
        else:
            raise AssertionError("accepted what Stage refuses") from None
    else:
        got = plan.one_worker_stage(start, stop, plan.WorkerId(worker))
        assert got == want and hash(got) == hash(want) and repr(got) == repr(want)
