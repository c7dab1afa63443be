"""A plan: which workers run which layers of which pipeline, and how the batch is split.

This is the planner's output and the input of the schedule compiler (`planaria.contract.schedule`),
the estimator, the controller and (through the wire contract) the agents. Workers are identified
by `WorkerId = node * gpus_per_node + local GPU index`, so a worker's node is `worker //
gpus_per_node`.

Layers are the planner's layers (embedding, blocks, head), numbered 0..num_layers-1; a stage owns
the half-open range [layer_start, layer_stop). All workers of a stage sit on one node; more than one
means the stage is split across them (intra-stage parallelism).

Rerouting (ReCycle, Odyssey §II-C): a `Reroute` sends the micro-batches of one pipeline's stage to a
worker of the same stage (same layer range) in another pipeline. A stage whose every micro-batch is
rerouted has no workers of its own (it is a hole left by a failure).

A `LayerTransfer` is part of the move from one plan to the next: it names a layer a worker of the
new plan lacks and the live workers that send it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NewType

from planaria.contract import errors

WorkerId = NewType("WorkerId", int)
NodeId = NewType("NodeId", int)


@dataclass(frozen=True, slots=True, kw_only=True)
class Stage:
    """Layers [layer_start, layer_stop) run on `workers` (all on one node; may be empty only
    when every micro-batch of the stage is rerouted)."""

    layer_start: int
    layer_stop: int
    workers: tuple[WorkerId, ...]

    def __post_init__(self) -> None:
        if not 0 <= self.layer_start < self.layer_stop:
            raise errors.PlanInputError(
                f"stage layers [{self.layer_start}, {self.layer_stop}) must be a non-empty range"
            )
        if len(set(self.workers)) != len(self.workers):
            raise errors.PlanInputError(f"stage workers {self.workers} repeat a worker")

    @property
    def layers(self) -> range:
        return range(self.layer_start, self.layer_stop)


# `one_worker_stage` sets a Stage's slots directly: its frozen-dataclass __init__ and
# __post_init__ cost more than the rest of relabelling a ~1,000-stage plan
_set_start, _set_stop, _set_workers = (
    vars(Stage)[name].__set__ for name in ("layer_start", "layer_stop", "workers")
)


def one_worker_stage(layer_start: int, layer_stop: int, worker: WorkerId) -> Stage:
    """`Stage(layer_start=..., layer_stop=..., workers=(worker,))`, the same object and error,
    with only the check one worker needs (a non-empty layer range)."""
    if not 0 <= layer_start < layer_stop:
        return Stage(layer_start=layer_start, layer_stop=layer_stop, workers=(worker,))  # raises
    stage: Stage = object.__new__(Stage)
    _set_start(stage, layer_start)
    _set_stop(stage, layer_stop)
    _set_workers(stage, (worker,))
    return stage


@dataclass(frozen=True, slots=True, kw_only=True)
class Pipeline:
    """One pipeline replica: consecutive stages covering every layer, and its share of the batch."""

    stages: tuple[Stage, ...]
    num_micro_batches: int

    def __post_init__(self) -> None:
        if not self.stages:
            raise errors.PlanInputError("a pipeline needs at least one stage")
        if self.stages[0].layer_start != 0:
            raise errors.PlanInputError("a pipeline's first stage must start at layer 0")
        for before, after in zip(self.stages, self.stages[1:], strict=False):
            if before.layer_stop != after.layer_start:
                raise errors.PlanInputError(
                    f"pipeline stages must be contiguous: a stage ends at layer "
                    f"{before.layer_stop} but the next starts at {after.layer_start}"
                )
        if self.num_micro_batches < 0:
            raise errors.PlanInputError("num_micro_batches must be >= 0")

    @property
    def num_layers(self) -> int:
        return self.stages[-1].layer_stop

    @property
    def workers(self) -> tuple[WorkerId, ...]:
        return tuple(w for stage in self.stages for w in stage.workers)


@dataclass(frozen=True, slots=True, kw_only=True)
class Reroute:
    """Micro-batches `micro_batches` of pipeline `pipeline` run its stage `stage` on the stage of
    pipeline `peer_pipeline` that has the same layer range (ReCycle)."""

    pipeline: int
    stage: int
    peer_pipeline: int
    micro_batches: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerTransfer:
    """Copy layer `layer`'s state (parameters and optimizer state) to `destination`, which holds
    the layer in the new plan, from live replicas `sources` (Oobleck §6.2; which survivor plays
    which role is a min-cost matching, Odyssey §IV; the planner names a few of a layer's
    replicas per copy, `planaria.planner.transfers`, and any non-empty set of them is valid).

    The state, flattened in a fixed order into n elements, is split among the k sources in order:
    source i sends elements [i*n//k, (i+1)*n//k), so shards are contiguous, cover the state, and
    differ in size by at most one element.
    """

    layer: int
    destination: WorkerId
    sources: tuple[WorkerId, ...]

    def __post_init__(self) -> None:
        if self.layer < 0:
            raise errors.PlanInputError(f"layer transfer: layer {self.layer} must be >= 0")
        if not self.sources:
            raise errors.PlanInputError(
                f"layer transfer of layer {self.layer}: give at least one source worker"
            )
        if len(set(self.sources)) != len(self.sources):
            raise errors.PlanInputError(
                f"layer transfer of layer {self.layer}: sources {self.sources} repeat a worker"
            )
        if self.destination in self.sources:
            raise errors.PlanInputError(
                f"layer transfer of layer {self.layer}: destination {self.destination} is also "
                "a source; a worker never sends a layer to itself"
            )

    def shard(self, source: WorkerId, num_elements: int) -> range:
        """The elements of the flattened state that `source` sends (see the class docstring)."""
        if source not in self.sources or num_elements < 0:
            raise errors.PlanInputError(
                f"layer transfer of layer {self.layer}: ask for the shard of one of the sources "
                f"{self.sources} (got {source}) of a state of >= 0 elements (got {num_elements})"
            )
        i, k = self.sources.index(source), len(self.sources)
        return range(i * num_elements // k, (i + 1) * num_elements // k)


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """Pipelines, micro-batch size and reroutes; the global batch is micro_batch_size times the
    total number of micro-batches, and never changes when the plan does."""

    pipelines: tuple[Pipeline, ...]
    micro_batch_size: int
    gpus_per_node: int = 1
    reroutes: tuple[Reroute, ...] = ()

    def __post_init__(self) -> None:
        if not self.pipelines:
            raise errors.PlanInputError("a plan needs at least one pipeline")
        if self.micro_batch_size < 1 or self.gpus_per_node < 1:
            raise errors.PlanInputError("micro_batch_size and gpus_per_node must be >= 1")
        depths = {p.num_layers for p in self.pipelines}
        if len(depths) != 1:
            raise errors.PlanInputError(f"pipelines cover different layer counts: {depths}")
        # the common case at once (a planner's ~1,000-worker layouts): no worker twice and no
        # stage across nodes; else `_check_workers` walks the stages and names the first fault
        stages = [stage for pipeline in self.pipelines for stage in pipeline.stages]
        workers = [w for stage in stages for w in stage.workers]
        gpus = self.gpus_per_node
        if len(set(workers)) != len(workers) or any(
            len({w // gpus for w in stage.workers}) > 1 for stage in stages if stage.workers[1:]
        ):
            self._check_workers()
        for reroute in self.reroutes:
            self._check_reroute(reroute)

    def _check_workers(self) -> None:
        """PlanInputError for the first stage (in plan order) that spans nodes or holds a
        worker of an earlier stage."""
        seen: set[WorkerId] = set()
        for pipeline in self.pipelines:
            for stage in pipeline.stages:
                nodes = {self.node_of(w) for w in stage.workers}
                if len(nodes) > 1:
                    raise errors.PlanInputError(
                        f"stage {stage.layer_start}-{stage.layer_stop} spans nodes {sorted(nodes)}"
                    )
                if seen & set(stage.workers):
                    raise errors.PlanInputError(
                        f"workers {sorted(seen & set(stage.workers))} appear in two stages"
                    )
                seen.update(stage.workers)

    def _check_reroute(self, reroute: Reroute) -> None:
        n = len(self.pipelines)
        if not (0 <= reroute.pipeline < n and 0 <= reroute.peer_pipeline < n):
            raise errors.PlanInputError(f"reroute {reroute} names a pipeline that does not exist")
        if reroute.pipeline == reroute.peer_pipeline:
            raise errors.PlanInputError(f"reroute {reroute} sends work to its own pipeline")
        source = self.pipelines[reroute.pipeline]
        if not 0 <= reroute.stage < len(source.stages):
            raise errors.PlanInputError(f"reroute {reroute} names a stage that does not exist")
        stage = source.stages[reroute.stage]
        peers = [
            s
            for s in self.pipelines[reroute.peer_pipeline].stages
            if s.layers == stage.layers and s.workers
        ]
        if not peers:
            raise errors.PlanInputError(
                f"reroute {reroute}: pipeline {reroute.peer_pipeline} has no live stage with "
                f"layers [{stage.layer_start}, {stage.layer_stop})"
            )
        for m in reroute.micro_batches:
            if not 0 <= m < source.num_micro_batches:
                raise errors.PlanInputError(f"reroute {reroute}: no micro-batch {m} in pipeline")

    @property
    def num_layers(self) -> int:
        return self.pipelines[0].num_layers

    @property
    def num_micro_batches(self) -> int:
        return sum(p.num_micro_batches for p in self.pipelines)

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.num_micro_batches

    @property
    def workers(self) -> tuple[WorkerId, ...]:
        return tuple(w for p in self.pipelines for w in p.workers)

    def node_of(self, worker: WorkerId) -> NodeId:
        return NodeId(worker // self.gpus_per_node)
