"""Compile a plan into a schedule: every worker's instruction stream for one training step.

The schedule is the contract between planner and agent: the executor interprets each stream
literally (`planaria.contract.instructions`), the checker (`deadlock`), the time estimator and the
memory estimator read the very same streams. Symmetric pipelines, heterogeneous pipelines and
rerouted micro-batches are all just schedules; docs/schedule.md explains the design.

How `compile_schedule` builds the streams:
1. Route: which worker runs each stage of each micro-batch: the stage's own (first) worker, or,
   for a rerouted micro-batch (ReCycle, Odyssey §II-C), the first worker of the same-layer stage
   of the peer pipeline. Global micro-batch numbers run contiguously per pipeline in order.
2. Order: `timeline.pack_slots` puts micro-batches in slots of a virtual 1F1B pipeline and every
   compute op is ordered by its virtual time (`timeline` explains why that cannot deadlock).
3. Messages: a receive right before the compute that needs it, a send right after the compute
   that produces it; tags count each (source, destination) pair in the receiver's order, and a
   sender posts its sends to one destination in tag order (so NCCL's order matching holds).
4. Gradients: layers held by the same set of workers form a bucket; each bucket held by two or
   more workers is all-reduced over them (Oobleck §6.1), in rounds from `colouring`; then one
   optimizer step and a snapshot marker per worker.

A stage of k > 1 workers (intra-stage tensor parallelism) is represented by its first worker's
stream; the estimators cost it with k-GPU timings, and `require_one_worker_per_stage` lets an
executor that runs one worker per stage refuse it with a clear error.

Errors: `errors.PlanInputError` for a plan whose reroutes do not cover its holes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

from planaria.contract import colouring, errors, instructions, plan, timeline


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerStream:
    """One worker's role in the plan and its instructions for one step.

    `stage_workers` are all workers of its stage (this worker first); more than one means the
    stage is tensor-parallel and this stream stands for all of them.
    """

    worker: plan.WorkerId
    pipeline: int
    stage: int
    layer_start: int
    layer_stop: int
    stage_workers: tuple[plan.WorkerId, ...]
    instructions: tuple[instructions.Instruction, ...]

    def __post_init__(self) -> None:
        if not self.stage_workers or self.stage_workers[0] != self.worker:
            raise errors.PlanInputError(
                f"worker {self.worker}: stage_workers {self.stage_workers} must start with it"
            )

    @property
    def layers(self) -> range:
        return range(self.layer_start, self.layer_stop)

    @property
    def width(self) -> int:
        """GPUs sharing the stage (k of the profile's k-GPU timings)."""
        return len(self.stage_workers)


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """Streams of every (first) worker of every stage, sorted by worker id, plus what readers
    of the streams need to know about the plan."""

    num_layers: int
    num_micro_batches: int
    gpus_per_node: int
    num_rounds: int
    streams: tuple[WorkerStream, ...]

    def __post_init__(self) -> None:
        workers = [s.worker for s in self.streams]
        if workers != sorted(set(workers)):
            raise errors.PlanInputError(f"schedule streams must be sorted by worker: {workers}")

    def stream(self, worker: plan.WorkerId) -> WorkerStream:
        """The stream of `worker`; KeyError when it has none."""
        for stream in self.streams:
            if stream.worker == worker:
                return stream
        raise KeyError(worker)

    def node_of(self, worker: plan.WorkerId) -> plan.NodeId:
        return plan.NodeId(worker // self.gpus_per_node)

    def all_reduce_groups(self) -> tuple[tuple[plan.WorkerId, ...], ...]:
        """Every distinct all-reduce group, in one order all workers agree on (sorted), e.g. for
        creating the process groups, which torch.distributed requires on every rank alike."""
        return tuple(
            sorted(
                {
                    op.group
                    for stream in self.streams
                    for op in stream.instructions
                    if isinstance(op, instructions.AllReduce)
                }
            )
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Task:
    """One compute op before it becomes instructions: where it runs, its order key, and whom it
    receives from / sends to (None at the ends of the pipeline)."""

    worker: plan.WorkerId
    key: tuple[int, int, int, bool]
    op: instructions.Compute
    source: plan.WorkerId | None
    destination: plan.WorkerId | None


def compile_schedule(plan_: plan.Plan) -> Schedule:
    """The schedule of one training step of `plan_`; pure and deterministic.

    Raises PlanInputError when a stage without workers has micro-batches that are not rerouted,
    or a micro-batch of a stage is rerouted twice.
    """
    routes = micro_batch_routes(plan_)
    owners = [frozenset(w for w in _leads(p) if w is not None) for p in plan_.pipelines]
    slots = timeline.pack_slots(routes, owners)
    tasks = _tasks(plan_, routes, slots)
    computes = _by_worker(tasks)
    by_pair, tags = _messages(computes)
    reductions = all_reductions(plan_)
    streams = []
    for pipeline_index, pipeline in enumerate(plan_.pipelines):
        for stage_index, stage in enumerate(pipeline.stages):
            if not stage.workers:
                continue
            worker = stage.workers[0]
            body = _stream_body(computes.get(worker, []), by_pair, tags)
            tail = _stream_tail(worker, stage, reductions)
            streams.append(
                WorkerStream(
                    worker=worker,
                    pipeline=pipeline_index,
                    stage=stage_index,
                    layer_start=stage.layer_start,
                    layer_stop=stage.layer_stop,
                    stage_workers=stage.workers,
                    instructions=(*body, *tail),
                )
            )
    return Schedule(
        num_layers=plan_.num_layers,
        num_micro_batches=plan_.num_micro_batches,
        gpus_per_node=plan_.gpus_per_node,
        num_rounds=colouring.num_colours([r.round for r in reductions]),
        streams=tuple(sorted(streams, key=lambda s: s.worker)),
    )


def require_one_worker_per_stage(schedule: Schedule) -> None:
    """Raise PlanInputError when a stage has more than one worker (tensor parallelism), which an
    executor running one worker per stage cannot run; the message names the stage."""
    for stream in schedule.streams:
        if stream.width > 1:
            raise errors.PlanInputError(
                f"pipeline {stream.pipeline} stage {stream.stage} (layers "
                f"[{stream.layer_start}, {stream.layer_stop})) runs on {stream.width} workers "
                f"{list(stream.stage_workers)}, but this executor runs one worker per stage; "
                "plan with one GPU per stage"
            )


# --- 1. routes ---------------------------------------------------------------------------------


def micro_batch_routes(plan_: plan.Plan) -> list[list[timeline.Route]]:
    """routes[p][j]: the (first) worker running each stage of pipeline p's local micro-batch j
    (step 1); PlanInputError as `compile_schedule` says. The planner's compile-free timing of
    rerouted plans (`composition`) starts from the same routes."""
    return _routes(plan_, _rerouted(plan_))


def _leads(pipeline: plan.Pipeline) -> list[plan.WorkerId | None]:
    """The first worker of each stage (None for a stage without workers)."""
    return [stage.workers[0] if stage.workers else None for stage in pipeline.stages]


def _rerouted(plan_: plan.Plan) -> dict[tuple[int, int, int], int]:
    """(pipeline, stage, local micro-batch) -> peer pipeline, checked for repeats and holes."""
    moved: dict[tuple[int, int, int], int] = {}
    for reroute in plan_.reroutes:
        for local in reroute.micro_batches:
            key = (reroute.pipeline, reroute.stage, local)
            if key in moved:
                raise errors.PlanInputError(
                    f"micro-batch {local} of pipeline {reroute.pipeline} stage {reroute.stage} "
                    "is rerouted twice; list it in one reroute only"
                )
            moved[key] = reroute.peer_pipeline
    for p, pipeline in enumerate(plan_.pipelines):
        for s, stage in enumerate(pipeline.stages):
            missing = [j for j in range(pipeline.num_micro_batches) if (p, s, j) not in moved]
            if not stage.workers and missing:
                raise errors.PlanInputError(
                    f"pipeline {p} stage {s} has no workers but its micro-batches {missing} are "
                    "not rerouted; reroute them to a peer pipeline's stage with the same layers"
                )
    return moved


def _peer_worker(plan_: plan.Plan, peer: int, stage: plan.Stage) -> plan.WorkerId:
    """First worker of the stage of pipeline `peer` with the same layers (Plan checked it)."""
    for candidate in plan_.pipelines[peer].stages:
        if candidate.layers == stage.layers and candidate.workers:
            return candidate.workers[0]
    raise AssertionError("Plan validation guarantees a live peer stage")


def _routes(plan_: plan.Plan, moved: dict[tuple[int, int, int], int]) -> list[list[timeline.Route]]:
    """routes[p][j]: the worker running each stage of pipeline p's local micro-batch j."""
    peers: dict[tuple[int, int, int], plan.WorkerId] = {}  # by (peer pipeline, layer range)

    def peer_worker(peer: int, stage: plan.Stage) -> plan.WorkerId:
        key = (peer, stage.layer_start, stage.layer_stop)
        if key not in peers:
            peers[key] = _peer_worker(plan_, peer, stage)
        return peers[key]

    routes = []
    for p, pipeline in enumerate(plan_.pipelines):
        leads = _leads(pipeline)
        routes.append(
            [
                tuple(
                    peer_worker(moved[(p, s, j)], stage) if (p, s, j) in moved else _live(leads[s])
                    for s, stage in enumerate(pipeline.stages)
                )
                for j in range(pipeline.num_micro_batches)
            ]
        )
    return routes


def _live(worker: plan.WorkerId | None) -> plan.WorkerId:
    assert worker is not None, "_rerouted guarantees every hole's micro-batches are rerouted"
    return worker


# --- 2. compute tasks in virtual-time order ----------------------------------------------------


def _tasks(
    plan_: plan.Plan, routes: list[list[timeline.Route]], slots: tuple[tuple[int, ...], ...]
) -> Iterator[_Task]:
    """Every forward and backward of every micro-batch, keyed by virtual time (ties: pipeline,
    slot, forward before backward)."""
    # One slot count for every pipeline, so that a peer's own and adopted micro-batches are
    # ordered on the same virtual clock (equal depths give identical times per slot).
    num_slots = 1 + max((s for pipeline in slots for s in pipeline), default=-1)
    times = {}
    offset = 0
    for p, pipeline in enumerate(plan_.pipelines):
        depth = len(pipeline.stages)
        if depth not in times:
            times[depth] = timeline.unit_times(depth, num_slots)
        forward_end, backward_end = times[depth]
        for j, route in enumerate(routes[p]):
            # the global micro-batch number: contiguous per pipeline, in pipeline order
            slot, g = slots[p][j], offset + j
            for s, stage in enumerate(pipeline.stages):
                before = route[s - 1] if s > 0 else None
                after = route[s + 1] if s + 1 < depth else None
                span = {"layer_start": stage.layer_start, "layer_stop": stage.layer_stop}
                yield _Task(
                    worker=route[s],
                    key=(forward_end[s][slot], p, slot, False),
                    op=instructions.Forward(micro_batch=g, **span),
                    source=before,
                    destination=after,
                )
                yield _Task(
                    worker=route[s],
                    key=(backward_end[s][slot], p, slot, True),
                    op=instructions.Backward(micro_batch=g, **span),
                    source=after,
                    destination=before,
                )
        offset += pipeline.num_micro_batches


def _by_worker(tasks: Iterator[_Task]) -> dict[plan.WorkerId, list[_Task]]:
    computes: dict[plan.WorkerId, list[_Task]] = defaultdict(list)
    for task in tasks:
        computes[task.worker].append(task)
    for worker_tasks in computes.values():
        worker_tasks.sort(key=lambda t: t.key)
    return computes


# --- 3. messages -------------------------------------------------------------------------------

_MessageKey = tuple[plan.WorkerId, plan.WorkerId, bool, int]  # source, destination, grad?, g


def _messages(
    computes: dict[plan.WorkerId, list[_Task]],
) -> tuple[dict[tuple[plan.WorkerId, plan.WorkerId], list[_MessageKey]], dict[_MessageKey, int]]:
    """Per (source, destination) pair, its messages in the receiver's order, and their tags."""
    by_pair: dict[tuple[plan.WorkerId, plan.WorkerId], list[_MessageKey]] = defaultdict(list)
    tags: dict[_MessageKey, int] = {}
    for worker in sorted(computes):
        # tags follow the receiver's order: it posts its receives in that order, the sender
        # then posts its sends in tag order (see _stream_body)
        for task in computes[worker]:
            if task.source is not None:
                key = _inbound(task)
                pair = by_pair[(task.source, worker)]
                tags[key] = len(pair)
                pair.append(key)
    return by_pair, tags


def _inbound(task: _Task) -> _MessageKey:
    assert task.source is not None
    grad = isinstance(task.op, instructions.Backward)
    return (task.source, task.worker, grad, task.op.micro_batch)


def _outbound(task: _Task) -> _MessageKey:
    assert task.destination is not None
    grad = isinstance(task.op, instructions.Backward)
    return (task.worker, task.destination, grad, task.op.micro_batch)


def _stream_body(
    tasks: list[_Task],
    by_pair: dict[tuple[plan.WorkerId, plan.WorkerId], list[_MessageKey]],
    tags: dict[_MessageKey, int],
) -> list[instructions.Instruction]:
    """Receives, computes and sends of one worker. A produced message is sent as soon as every
    message the destination receives from us before it has been produced (tag order)."""
    body: list[instructions.Instruction] = []
    produced: set[_MessageKey] = set()
    next_tag: dict[plan.WorkerId, int] = defaultdict(int)
    for task in tasks:
        if task.source is not None:
            body.append(_receive(_inbound(task), tags))
        body.append(task.op)
        if task.destination is not None:
            produced.add(_outbound(task))
            pair = by_pair[(task.worker, task.destination)]
            while next_tag[task.destination] < len(pair):
                key = pair[next_tag[task.destination]]
                if key not in produced:
                    break
                body.append(_send(key, next_tag[task.destination]))
                next_tag[task.destination] += 1
    return body


def _receive(key: _MessageKey, tags: dict[_MessageKey, int]) -> instructions.Recv:
    source, _, grad, g = key
    if grad:
        return instructions.RecvGrad(source=source, micro_batch=g, tag=tags[key])
    return instructions.RecvActivation(source=source, micro_batch=g, tag=tags[key])


def _send(key: _MessageKey, tag: int) -> instructions.Send:
    _, destination, grad, g = key
    if grad:
        return instructions.SendGrad(destination=destination, micro_batch=g, tag=tag)
    return instructions.SendActivation(destination=destination, micro_batch=g, tag=tag)


# --- 4. gradients ------------------------------------------------------------------------------


def all_reductions(plan_: plan.Plan) -> list[instructions.AllReduce]:
    """One AllReduce per bucket (maximal run of layers with the same holders: the first workers
    of every stage holding them) held by two or more workers, with rounds from a greedy
    colouring of their conflict graph (Oobleck §6.1)."""
    holders: dict[int, set[plan.WorkerId]] = {layer: set() for layer in range(plan_.num_layers)}
    for pipeline in plan_.pipelines:
        for stage in pipeline.stages:
            for layer in stage.layers if stage.workers else ():
                holders[layer].add(stage.workers[0])
    buckets: list[tuple[list[int], tuple[plan.WorkerId, ...]]] = []
    for layer in range(plan_.num_layers):
        group = tuple(sorted(holders[layer]))
        if buckets and buckets[-1][1] == group:
            buckets[-1][0].append(layer)
        else:
            buckets.append(([layer], group))
    shared = [(layers, group) for layers, group in buckets if len(group) > 1]
    rounds = colouring.welsh_powell(colouring.conflict_graph([g for _, g in shared]))
    return [
        instructions.AllReduce(layers=tuple(layers), group=group, round=r)
        for (layers, group), r in zip(shared, rounds, strict=True)
    ]


def _stream_tail(
    worker: plan.WorkerId, stage: plan.Stage, reductions: list[instructions.AllReduce]
) -> list[instructions.Instruction]:
    """After all compute: this worker's all-reduces by (round, first layer), the optimizer step
    and the snapshot marker. Collectives after all compute can never block a compute op."""
    mine = sorted(
        (r for r in reductions if worker in r.group), key=lambda r: (r.round, r.layers[0])
    )
    layers = tuple(stage.layers)
    return [
        *mine,
        instructions.OptimizerStep(layers=layers),
        instructions.Snapshot(layers=layers),
    ]
