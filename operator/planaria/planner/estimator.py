"""Time estimator: how long one training step of a schedule takes (Odyssey §IV-C, eq. 9-13).

Odyssey simulates each pipeline with a DP over its stages' ops (eq. 11: an op starts when both
the previous op of its stage and the op it depends on in the neighbouring stage have ended) and
takes the slowest pipeline (eq. 10). We generalise that DP to the whole schedule: `execution`
replays every worker's stream, where a receive waits for its send's arrival and a collective for
all its members, so heterogeneous pipelines, rerouted micro-batches (eq. 12-13) and the
layer-granular all-reduce rounds (Odyssey §IV-B) are timed by the same recurrence.

Costs, from the profile (a stage of k workers uses the k-GPU timings; Odyssey's notation):
- Forward / Backward: sum of forward_s[k-1] / backward_s[k-1] of the op's layers (Tf, Tb);
- a send: latency + bytes / bandwidth of the intra-node link when both workers share a node,
  else the inter-node link; an activation is the output_bytes of the sender's last layer, a
  gradient the output_bytes of the layer before the sender's first (the tensor it received);
  sends run in the background: the sender does not wait, the receiver waits for the arrival;
- AllReduce: ring all-reduce (LinkProfile.allreduce_s) of the layers' gradient_bytes over the
  group, inter-node link when the group spans nodes, at the collective's measured per-step
  latency and bandwidth where the profile has them (a library's all-reduce is several times
  slower than point-to-point sends of the same bytes); with tensor-parallel members each of the
  k shards is reduced concurrently, so the bytes per ring are those of the narrowest member's
  shard (gradient bytes / smallest k). Collectives of one round run concurrently; network
  contention between them is not modelled;
- the commit barrier (the executor's, before the first OptimizerStep: `execution`): a ring
  all-reduce of BARRIER_BYTES over every worker, inter-node link when they span nodes. It ends
  Odyssey's eq. 10 max over pipelines one step early: the step is max over workers of their
  arrival, plus the barrier, plus the largest optimizer step, not max over workers of arrival
  plus their own optimizer step;
- OptimizerStep: sum of optimizer_s / k; Snapshot: 0 (REFT snapshots asynchronously to host
  memory; its overhead belongs to the snapshot model, not to the step).

A measured profile (`planaria profile`) times each layer in place in a whole-model pass with
gradients accumulating, as a stage computes a micro-batch, and measures the link's all-reduce
beside its point-to-point sends; docs/planner.md (the estimator) has the measured errors.

Not here: memory (`memory`), choosing plans (the policy).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from planaria.contract import errors, instructions, plan, profile, schedule
from planaria.planner import execution


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerTime:
    """Where one worker's step went, in seconds. `wait_s` is time blocked in receives and in
    collectives before their last member arrived; `finish_s` is when its stream ended; `idle_s`
    is the step minus the busy time (waiting, plus waiting for the slowest worker at the end).
    `seconds` is the wall time per kind of instruction as the executor's StepResult.seconds
    counts it: a receive, a collective and the optimizer step (the commit barrier is inside it)
    include their waiting."""

    worker: plan.WorkerId
    forward_s: float
    backward_s: float
    allreduce_s: float
    optimizer_s: float
    wait_s: float
    finish_s: float
    idle_s: float
    seconds: Mapping[instructions.Op, float]

    @property
    def busy_s(self) -> float:
        """Computing or reducing (not waiting)."""
        return self.forward_s + self.backward_s + self.allreduce_s + self.optimizer_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    """One link of the critical path: instruction `index` of `worker` (for a receive: the
    message's transfer) occupied [start_s, end_s]."""

    worker: plan.WorkerId
    index: int
    op: instructions.Op
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class StepEstimate:
    """The step time, each worker's breakdown, and the critical path: a chain of segments from
    0 to `step_s` where each starts when the one before ends (zero-time hops left out)."""

    step_s: float
    workers: tuple[WorkerTime, ...]
    critical_path: tuple[Segment, ...]

    def critical_s(self, op: instructions.Op) -> float:
        """Seconds of the critical path spent in instructions of kind `op` (per-phase view:
        forward, backward, recv_* = transfers, all_reduce, optimizer_step)."""
        return sum(s.end_s - s.start_s for s in self.critical_path if s.op == op)


class ProfileCosts:
    """`execution.Costs` from a profile, as described in the module docstring. A worker repeats
    the same few costs (one layer range, a few destinations), so they are memoised."""

    def __init__(self, sched: schedule.Schedule, prof: profile.Profile) -> None:
        _check_fits(sched, prof)
        self.schedule = sched
        self.profile = prof
        self.width = {s.worker: s.width for s in sched.streams}
        self._memo: dict[tuple[object, ...], float] = {}

    def compute_s(
        self,
        stream: schedule.WorkerStream,
        instruction: instructions.Compute | instructions.OptimizerStep | instructions.Snapshot,
    ) -> float:
        op = instruction.op  # one attribute read, not an isinstance chain: the replay's hot path
        if op is instructions.Op.OPTIMIZER_STEP:
            assert isinstance(instruction, instructions.OptimizerStep)
            return optimizer_s(self.profile, instruction.layers, stream.width)
        if op is instructions.Op.SNAPSHOT:
            return 0.0
        assert isinstance(instruction, instructions.Forward | instructions.Backward)
        key = (op, instruction.layer_start, instruction.layer_stop, stream.width)
        found = self._memo.get(key)
        if found is None:
            layers = self.profile.layers[instruction.layer_start : instruction.layer_stop]
            backward = op is instructions.Op.BACKWARD
            times = (layer.backward_s if backward else layer.forward_s for layer in layers)
            found = self._memo[key] = sum(t[stream.width - 1] for t in times)
        return found

    def transfer_s(self, stream: schedule.WorkerStream, instruction: instructions.Send) -> float:
        key = (instruction.op, stream.worker, instruction.destination)
        found = self._memo.get(key)
        if found is None:
            if isinstance(instruction, instructions.SendActivation):
                num_bytes = self.profile.layers[stream.layer_stop - 1].output_bytes
            else:
                num_bytes = self.profile.layers[stream.layer_start - 1].output_bytes
            link = self._link(stream.worker, instruction.destination)
            found = self._memo[key] = link.transfer_s(num_bytes)
        return found

    def collective_s(self, instruction: instructions.AllReduce) -> float:
        narrowest = min(self.width[w] for w in instruction.group)
        return allreduce_s(self._link(*instruction.group), self.profile, instruction, narrowest)

    def barrier_s(self, workers: tuple[plan.WorkerId, ...]) -> float:
        return barrier_s(self._link(*workers), len(workers))

    def _link(self, *workers: plan.WorkerId) -> profile.LinkProfile:
        return link_among(self.profile, self.schedule.gpus_per_node, workers)


def link_among(
    prof: profile.Profile, gpus_per_node: int, workers: Iterable[int]
) -> profile.LinkProfile:
    """The link a message or a collective among `workers` uses: the intra-node link when they
    all share a node (`gpus_per_node` workers per node, in worker order), else the inter-node
    link. Every cost of this package picks its link here."""
    nodes = {worker // gpus_per_node for worker in workers}
    return prof.intra_node if len(nodes) == 1 else prof.inter_node


BARRIER_BYTES = 16  # the commit barrier reduces two float64: the loss share and a flag


def barrier_s(link: profile.LinkProfile, num_workers: int) -> float:
    """The commit barrier among `num_workers` over `link` (module docstring)."""
    return link.allreduce_s(BARRIER_BYTES, num_workers)


def optimizer_s(prof: profile.Profile, layers: Sequence[int], width: int) -> float:
    """An OptimizerStep over `layers` on a stage of `width` GPUs: sum of optimizer_s / k."""
    return sum(prof.layers[i].optimizer_s for i in layers) / width


def allreduce_s(
    link: profile.LinkProfile,
    prof: profile.Profile,
    instruction: instructions.AllReduce,
    narrowest: int,
) -> float:
    """Ring all-reduce of the layers' gradient bytes over `link`, per shard of the narrowest
    member's `narrowest` GPUs (module docstring)."""
    num_bytes = sum(prof.layers[i].gradient_bytes for i in instruction.layers)
    return link.allreduce_s(num_bytes / narrowest, len(instruction.group))


def _check_fits(sched: schedule.Schedule, prof: profile.Profile) -> None:
    if prof.num_layers != sched.num_layers:
        raise errors.PlanInputError(
            f"the profile has {prof.num_layers} layers but the plan {sched.num_layers}; "
            "profile the model the plan is for"
        )
    for stream in sched.streams:
        if stream.width > prof.max_gpus_per_stage:
            raise errors.PlanInputError(
                f"worker {stream.worker}'s stage has {stream.width} GPUs but the profile times "
                f"stages of up to {prof.max_gpus_per_stage}; profile with more GPUs per stage"
            )


def estimate_step(sched: schedule.Schedule, prof: profile.Profile) -> StepEstimate:
    """Replay `sched` with `prof`'s costs. Raises PlanInputError when the profile does not fit
    the schedule, DeadlockError when the schedule cannot finish."""
    result = execution.replay(sched, ProfileCosts(sched, prof))
    execution.raise_if_stuck(sched, result)
    step_s = result.step_s  # once: a max over every worker's events
    return StepEstimate(
        step_s=step_s,
        workers=tuple(_worker_time(s, result.events[s.worker], step_s) for s in sched.streams),
        critical_path=_critical_path(sched, result),
    )


_BUSY = (
    instructions.Op.FORWARD,
    instructions.Op.BACKWARD,
    instructions.Op.ALL_REDUCE,
    instructions.Op.OPTIMIZER_STEP,
)


def _worker_time(
    stream: schedule.WorkerStream, events: tuple[execution.Event, ...], step_s: float
) -> WorkerTime:
    spent = dict.fromkeys(instructions.Op, 0.0)
    seconds = dict.fromkeys(instructions.Op, 0.0)
    wait = 0.0
    for op, event in zip(stream.instructions, events, strict=True):
        spent[op.op] += event.end_s - event.start_s
        seconds[op.op] += event.end_s - event.ready_s
        wait += event.start_s - event.ready_s
    busy = sum(spent[op] for op in _BUSY)
    return WorkerTime(
        worker=stream.worker,
        forward_s=spent[instructions.Op.FORWARD],
        backward_s=spent[instructions.Op.BACKWARD],
        allreduce_s=spent[instructions.Op.ALL_REDUCE],
        optimizer_s=spent[instructions.Op.OPTIMIZER_STEP],
        wait_s=wait,
        finish_s=events[-1].end_s if events else 0.0,
        idle_s=step_s - busy,
        seconds=seconds,
    )


def _critical_path(sched: schedule.Schedule, result: execution.Replay) -> tuple[Segment, ...]:
    """Walk back from the last event: through the previous op of the same worker, or, when a
    receive waited for its message or a collective for a late member, to that worker."""
    ends = [(events[-1].end_s, w) for w, events in result.events.items() if events]
    if not ends:
        return ()
    _, worker = max(ends)
    index = len(result.events[worker]) - 1
    path: list[Segment] = []
    while index >= 0:
        event = result.events[worker][index]
        op = sched.stream(worker).instructions[index].op
        start = event.start_s
        if op == instructions.Op.OPTIMIZER_STEP:
            # from the last arrival at the commit barrier: the barrier, then the step
            last = event if event.cause is None else result.events[event.cause[0]][event.cause[1]]
            start = last.ready_s
        elif event.cause is not None and op != instructions.Op.ALL_REDUCE:
            # a receive that waited: the path runs through the message's transfer
            start = result.events[event.cause[0]][event.cause[1]].end_s
        if event.end_s > start:
            path.append(
                Segment(worker=worker, index=index, op=op, start_s=start, end_s=event.end_s)
            )
        worker, index = event.cause if event.cause is not None else (worker, index)
        index -= 1
    return tuple(reversed(path))
