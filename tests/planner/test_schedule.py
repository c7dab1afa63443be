"""Schedule compiler (planaria.contract.schedule) and its instructions (planner.instructions).

Covers:
- fault-free pipelines, symmetric and heterogeneous: each stage's compute is exactly 1F1B
  (S - s - 1 warm-up forwards, alternation, cool-down), written out independently here;
- global micro-batch numbering: contiguous per pipeline in pipeline order;
- messages: a receive right before the compute that needs it, a send after the compute that
  produces it, tags 0, 1, 2, ... per (source, destination) pair, sends to one destination in
  its receive order even when produced in another order;
- rerouting: the failed stage's micro-batches run on its peers, the neighbours send to and
  receive from the peer, the peer keeps 1F1B's in-flight bound; holes without reroutes and
  double reroutes are input errors;
- gradients: one all-reduce per bucket of layers with the same holders, rounds from colouring
  (one round when symmetric), the distinct groups in one order, optimizer step and snapshot
  marker last;
- tensor-parallel stages: the first worker's stream stands for the stage; the executor's
  one-worker-per-stage check names the stage;
- compilation is deterministic; malformed instructions and streams are input errors.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from planaria.contract import errors, instructions, plan, schedule
from planaria.planner import deadlock, memory
from tests import strategies

W = plan.WorkerId


def pipeline_of(stage_bounds: list[tuple[int, int]], first_worker: int, n: int) -> plan.Pipeline:
    return plan.Pipeline(
        stages=tuple(
            plan.Stage(layer_start=a, layer_stop=b, workers=(W(first_worker + i),))
            for i, (a, b) in enumerate(stage_bounds)
        ),
        num_micro_batches=n,
    )


def reference_1f1b(num_stages: int, stage: int, micro_batches: list[int]) -> list[str]:
    """PipeDream-Flush as usually written: warm-up, steady 1F1B, cool-down."""
    warmup = min(num_stages - stage - 1, len(micro_batches))
    order = [f"F{g}" for g in micro_batches[:warmup]]
    backward = 0
    for g in micro_batches[warmup:]:
        order += [f"F{g}", f"B{micro_batches[backward]}"]
        backward += 1
    return order + [f"B{g}" for g in micro_batches[backward:]]


def compute_order(stream: schedule.WorkerStream) -> list[str]:
    return [
        f"{'F' if isinstance(op, instructions.Forward) else 'B'}{op.micro_batch}"
        for op in stream.instructions
        if isinstance(op, instructions.Forward | instructions.Backward)
    ]


@pytest.mark.parametrize(
    "layouts",
    [
        [[(0, 1), (1, 2)], [(0, 1), (1, 2)]],
        [[(0, 1), (1, 2), (2, 3), (3, 4)]] * 3,
        [[(0, 2), (2, 3), (3, 5)], [(0, 3), (3, 5)]],
        [[(0, 1), (1, 3)], [(0, 2), (2, 3)], [(0, 3)]],
    ],
    ids=["2x2", "3x4", "stage counts 3 and 2", "stage counts 2, 2 and 1"],
)
@pytest.mark.parametrize("num_micro_batches", [1, 2, 5, 8])
def test_fault_free_stages_run_exactly_1f1b(
    layouts: list[list[tuple[int, int]]], num_micro_batches: int
) -> None:
    pipelines, first, offset = [], 0, 0
    expected: dict[plan.WorkerId, list[str]] = {}
    for bounds in layouts:
        pipelines.append(pipeline_of(bounds, first, num_micro_batches))
        batches = list(range(offset, offset + num_micro_batches))
        for s in range(len(bounds)):
            expected[W(first + s)] = reference_1f1b(len(bounds), s, batches)
        first, offset = first + len(bounds), offset + num_micro_batches
    sched = schedule.compile_schedule(plan.Plan(pipelines=tuple(pipelines), micro_batch_size=4))
    assert {s.worker: compute_order(s) for s in sched.streams} == expected
    assert sched.num_micro_batches == len(layouts) * num_micro_batches


def test_micro_batches_are_numbered_contiguously_per_pipeline() -> None:
    p = plan.Plan(
        pipelines=(
            pipeline_of([(0, 2)], 0, 3),
            pipeline_of([(0, 1), (1, 2)], 1, 2),
            pipeline_of([(0, 2)], 3, 4),
        ),
        micro_batch_size=2,
    )
    sched = schedule.compile_schedule(p)
    first_stages = {W(0): [0, 1, 2], W(1): [3, 4], W(3): [5, 6, 7, 8]}
    for worker, batches in first_stages.items():
        forwards = [
            op.micro_batch
            for op in sched.stream(worker).instructions
            if isinstance(op, instructions.Forward)
        ]
        assert forwards == batches


@settings(max_examples=60, deadline=None)
@given(p=strategies.plans())
def test_messages_sit_next_to_their_compute_and_tags_count_each_pair(p: plan.Plan) -> None:
    sched = schedule.compile_schedule(p)
    counts: dict[tuple[int, int], list[int]] = {}
    for stream in sched.streams:
        ops = stream.instructions
        for i, op in enumerate(ops):
            if isinstance(op, instructions.RecvActivation | instructions.RecvGrad):
                consumer = ops[i + 1]
                assert isinstance(consumer, instructions.Forward | instructions.Backward)
                assert consumer.micro_batch == op.micro_batch
                assert isinstance(consumer, instructions.Backward) == isinstance(
                    op, instructions.RecvGrad
                )
                counts.setdefault((op.source, stream.worker), []).append(op.tag)
            if isinstance(op, instructions.SendActivation | instructions.SendGrad):
                producers = [
                    x
                    for x in ops[:i]
                    if isinstance(x, instructions.Forward | instructions.Backward)
                    and x.micro_batch == op.micro_batch
                ]
                assert producers, f"{op} before anything produced it"
    for tags in counts.values():
        assert tags == list(range(len(tags)))


def failed_plan(num_pipelines: int, num_stages: int, n: int, stage: int) -> plan.Plan:
    """Pipeline 0 lost `stage`; its micro-batches go round-robin to the other pipelines."""
    pipelines = [
        pipeline_of([(s, s + 1) for s in range(num_stages)], p * num_stages, n)
        for p in range(num_pipelines)
    ]
    stages = list(pipelines[0].stages)
    stages[stage] = plan.Stage(layer_start=stage, layer_stop=stage + 1, workers=())
    pipelines[0] = plan.Pipeline(stages=tuple(stages), num_micro_batches=n)
    reroutes = tuple(
        plan.Reroute(
            pipeline=0,
            stage=stage,
            peer_pipeline=q,
            micro_batches=tuple(range(q - 1, n, num_pipelines - 1)),
        )
        for q in range(1, num_pipelines)
    )
    return plan.Plan(pipelines=tuple(pipelines), micro_batch_size=1, reroutes=reroutes)


def test_a_failed_stage_runs_on_its_peers_and_its_neighbours_talk_to_them() -> None:
    sched = schedule.compile_schedule(failed_plan(3, 3, 4, stage=1))
    assert W(1) not in {s.worker for s in sched.streams}
    peers = {W(4): [0, 2], W(7): [1, 3]}  # stage 1 of pipelines 1 and 2
    for peer, adopted in peers.items():
        forwards = {
            op.micro_batch
            for op in sched.stream(peer).instructions
            if isinstance(op, instructions.Forward)
        }
        own = {g + 4 for g in range(4)} if peer == W(4) else {g + 8 for g in range(4)}
        assert forwards == own | set(adopted)
    upstream = sched.stream(W(0)).instructions
    downstream = sched.stream(W(2)).instructions
    for peer, adopted in peers.items():
        for g in adopted:
            assert any(
                isinstance(op, instructions.SendActivation)
                and op.destination == peer
                and op.micro_batch == g
                for op in upstream
            )
            assert any(
                isinstance(op, instructions.RecvActivation)
                and op.source == peer
                and op.micro_batch == g
                for op in downstream
            )
            assert any(
                isinstance(op, instructions.RecvGrad) and op.source == peer and op.micro_batch == g
                for op in upstream
            )


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_peer_running_adopted_micro_batches_keeps_the_1f1b_in_flight_bound(stage: int) -> None:
    sched = schedule.compile_schedule(failed_plan(2, 4, 6, stage=stage))
    peer = sched.stream(W(4 + stage))
    assert memory.max_in_flight(peer) == 4 - stage
    assert len(compute_order(peer)) == 2 * 12


def test_a_stage_without_workers_needs_every_micro_batch_rerouted() -> None:
    p = failed_plan(2, 2, 3, stage=1)
    partial = plan.Plan(
        pipelines=p.pipelines,
        micro_batch_size=1,
        reroutes=(plan.Reroute(pipeline=0, stage=1, peer_pipeline=1, micro_batches=(0, 2)),),
    )
    with pytest.raises(errors.PlanInputError, match=r"micro-batches \[1\] are not rerouted"):
        schedule.compile_schedule(partial)


def test_a_micro_batch_rerouted_twice_is_an_input_error() -> None:
    p = failed_plan(3, 2, 2, stage=0)
    twice = plan.Plan(
        pipelines=p.pipelines,
        micro_batch_size=1,
        reroutes=(
            plan.Reroute(pipeline=0, stage=0, peer_pipeline=1, micro_batches=(0, 1)),
            plan.Reroute(pipeline=0, stage=0, peer_pipeline=2, micro_batches=(1,)),
        ),
    )
    with pytest.raises(errors.PlanInputError, match="micro-batch 1 .* is rerouted twice"):
        schedule.compile_schedule(twice)


def reductions(stream: schedule.WorkerStream) -> list[instructions.AllReduce]:
    return [op for op in stream.instructions if isinstance(op, instructions.AllReduce)]


def test_symmetric_pipelines_reduce_each_stage_once_in_one_round() -> None:
    p = plan.Plan(
        pipelines=tuple(pipeline_of([(0, 2), (2, 5)], 2 * i, 3) for i in range(3)),
        micro_batch_size=1,
    )
    sched = schedule.compile_schedule(p)
    assert sched.num_rounds == 1
    assert reductions(sched.stream(W(0))) == [
        instructions.AllReduce(layers=(0, 1), group=(W(0), W(2), W(4)), round=0)
    ]
    assert reductions(sched.stream(W(3))) == [
        instructions.AllReduce(layers=(2, 3, 4), group=(W(1), W(3), W(5)), round=0)
    ]
    tail = sched.stream(W(3)).instructions[-2:]
    assert tail == (
        instructions.OptimizerStep(layers=(2, 3, 4)),
        instructions.Snapshot(layers=(2, 3, 4)),
    )


def test_heterogeneous_pipelines_reduce_layer_buckets_in_coloured_rounds() -> None:
    """Oobleck §6.1 / Odyssey Fig. 4: [0,2)+[2,4) against [0,1)+[1,4) gives buckets {0} over
    workers 0 and 2, {1} over 0 and 3, {2, 3} over 1 and 3; {1} conflicts with both others."""
    p = plan.Plan(
        pipelines=(pipeline_of([(0, 2), (2, 4)], 0, 2), pipeline_of([(0, 1), (1, 4)], 2, 2)),
        micro_batch_size=1,
    )
    sched = schedule.compile_schedule(p)
    assert sched.num_rounds == 2
    assert reductions(sched.stream(W(0))) == [
        instructions.AllReduce(layers=(1,), group=(W(0), W(3)), round=0),
        instructions.AllReduce(layers=(0,), group=(W(0), W(2)), round=1),
    ]
    assert reductions(sched.stream(W(1))) == [
        instructions.AllReduce(layers=(2, 3), group=(W(1), W(3)), round=1)
    ]


def test_the_schedule_lists_its_all_reduce_groups_in_one_order() -> None:
    p = plan.Plan(
        pipelines=(pipeline_of([(0, 2), (2, 4)], 0, 2), pipeline_of([(0, 1), (1, 4)], 2, 2)),
        micro_batch_size=1,
    )
    assert schedule.compile_schedule(p).all_reduce_groups() == ((0, 2), (0, 3), (1, 3))


def test_one_pipeline_needs_no_all_reduce() -> None:
    sched = schedule.compile_schedule(
        plan.Plan(pipelines=(pipeline_of([(0, 1), (1, 2)], 0, 2),), micro_batch_size=1)
    )
    assert sched.num_rounds == 0
    assert not any(reductions(s) for s in sched.streams)


def tensor_parallel_plan() -> plan.Plan:
    stages = (
        plan.Stage(layer_start=0, layer_stop=1, workers=(W(0), W(1))),
        plan.Stage(layer_start=1, layer_stop=2, workers=(W(2),)),
    )
    return plan.Plan(
        pipelines=(plan.Pipeline(stages=stages, num_micro_batches=2),),
        micro_batch_size=1,
        gpus_per_node=2,
    )


def test_a_tensor_parallel_stage_is_its_first_workers_stream() -> None:
    sched = schedule.compile_schedule(tensor_parallel_plan())
    assert [s.worker for s in sched.streams] == [W(0), W(2)]
    assert sched.stream(W(0)).stage_workers == (W(0), W(1))
    assert sched.stream(W(0)).width == 2


def test_the_executor_check_names_a_tensor_parallel_stage() -> None:
    sched = schedule.compile_schedule(tensor_parallel_plan())
    with pytest.raises(errors.PlanInputError, match=r"pipeline 0 stage 0 .* runs on 2 workers"):
        schedule.require_one_worker_per_stage(sched)
    single = schedule.compile_schedule(failed_plan(2, 2, 2, stage=0))
    schedule.require_one_worker_per_stage(single)


@settings(max_examples=30, deadline=None)
@given(p=strategies.plans())
def test_compiling_is_deterministic(p: plan.Plan) -> None:
    assert schedule.compile_schedule(p) == schedule.compile_schedule(p)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: instructions.Forward(micro_batch=0, layer_start=2, layer_stop=2), "non-empty"),
        (lambda: instructions.Backward(micro_batch=-1, layer_start=0, layer_stop=1), ">= 0"),
        (lambda: instructions.SendGrad(destination=W(1), micro_batch=0, tag=-1), ">= 0"),
        (
            lambda: instructions.AllReduce(layers=(1, 0), group=(W(0), W(1)), round=0),
            "sorted",
        ),
        (lambda: instructions.AllReduce(layers=(0,), group=(W(0),), round=0), ">= 2"),
    ],
    ids=[
        "empty layer range",
        "negative micro-batch",
        "negative tag",
        "unsorted layers",
        "group of one",
    ],
)
def test_malformed_instructions_are_input_errors(build: object, message: str) -> None:
    with pytest.raises(errors.PlanInputError, match=message):
        build()  # type: ignore[operator]


def test_streams_must_be_sorted_and_start_with_their_worker() -> None:
    def stream(worker: int, stage_workers: tuple[int, ...]) -> schedule.WorkerStream:
        return schedule.WorkerStream(
            worker=W(worker),
            pipeline=0,
            stage=0,
            layer_start=0,
            layer_stop=1,
            stage_workers=tuple(W(w) for w in stage_workers),
            instructions=(),
        )

    with pytest.raises(errors.PlanInputError, match="must start with it"):
        stream(1, (0, 1))
    with pytest.raises(errors.PlanInputError, match="sorted by worker"):
        schedule.Schedule(
            num_layers=1,
            num_micro_batches=0,
            gpus_per_node=1,
            num_rounds=0,
            streams=(stream(1, (1,)), stream(0, (0,))),
        )


def test_sends_to_one_destination_follow_its_receive_order() -> None:
    """Heterogeneous pipelines with three holes (found by a search over shaped_plans): worker 3
    forwards micro-batch 4 before 6, but worker 8 (running both pipelines' last layers) needs
    6 first, so worker 3 holds 4's activation back until 6's is sent (NCCL matches by order)."""

    def stage(a: int, b: int, *workers: int) -> plan.Stage:
        return plan.Stage(layer_start=a, layer_stop=b, workers=tuple(W(w) for w in workers))

    def moved(p: int, s: int, peer: int, *batches: int) -> plan.Reroute:
        return plan.Reroute(pipeline=p, stage=s, peer_pipeline=peer, micro_batches=batches)

    p = plan.Plan(
        pipelines=(
            plan.Pipeline(stages=(stage(0, 2, 0), stage(2, 6, 1)), num_micro_batches=4),
            plan.Pipeline(
                stages=(stage(0, 3, 2), stage(3, 4, 3), stage(4, 6)), num_micro_batches=2
            ),
            plan.Pipeline(
                stages=(stage(0, 2), stage(2, 3, 6), stage(3, 4), stage(4, 6, 8)),
                num_micro_batches=1,
            ),
        ),
        micro_batch_size=1,
        gpus_per_node=2,
        reroutes=(moved(2, 0, 0, 0), moved(2, 2, 1, 0), moved(1, 2, 2, 0, 1)),
    )
    sched = schedule.compile_schedule(p)
    deadlock.check_schedule(sched)
    worker_3 = [
        f"{type(op).__name__}{op.micro_batch}"
        for op in sched.stream(W(3)).instructions
        if isinstance(op, instructions.Forward | instructions.SendActivation)
    ]
    assert worker_3[:4] == ["Forward4", "Forward6", "SendActivation6", "SendActivation4"]
