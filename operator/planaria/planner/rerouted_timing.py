"""A rerouted plan's streams timed without compiling its schedule or replaying instructions.

`composition.run_rerouted` times the pipelines a reroute ties together as a plan of their own
(at 1,024 workers ~36 pipelines, ~650 workers, ~23,000 computes); compiling that plan and
replaying its ~90,000 instructions cost ~6x what `run_routed` does. It reproduces what the
schedule compiler decides (`schedule`: the routes of step 1, the compute order of step 2 from
`timeline.pack_slots`' slots, the message placement of step 3) on plain tuples, and times each
worker's computes with the replay's arithmetic (`execution`, `estimator`'s costs), the same
floats in the same order, so its arrivals and peak are those of compile + replay bit for bit
(tests/planner/test_rerouted_timing.py keeps that path as the oracle). It does what
`composition.run_chain` does for a lone pipeline, for pipelines whose micro-batches cross.

Not here: the gradient tail (`composition.step_s`), which plans to time this way
(`composition.run_rerouted`).
"""

from __future__ import annotations

import itertools
from collections import deque

from planaria.contract import errors, plan, profile, schedule, timeline
from planaria.planner import memory

# One compute of the routed timing, in a worker's order (`schedule._Task` without its
# instruction): its order key (unit 1F1B time, pipeline, slot, backward?), then the worker it
# receives from and the message, the worker it sends to and the message (None at the ends of
# its pipeline, where the message's number is never read). A message is numbered by the
# compute that receives it: micro-batch g (global), stage s, gradient or not:
# (g * _STAGES + s) * 2 + backward.
_Compute = tuple[int, int, int, bool, plan.WorkerId | None, int, plan.WorkerId | None, int]
# One compute as the replay meets it: the message it waits for (-1: none), its duration, then
# the messages posted right after it and their transfer time (all to one destination).
_Step = tuple[int, float, tuple[int, ...], float]


def run_routed(plan_: plan.Plan, prof: profile.Profile) -> tuple[dict[plan.WorkerId, float], int]:
    """`composition.run_sub_replayed`'s numbers, bit for bit, without compiling the schedule
    or replaying its instructions: the schedule's compute order (`schedule` step 2:
    `timeline.pack_slots`' slots, computes sorted by unit 1F1B time, pipeline, slot, forward
    first) and its message placement (step 3: a receive right before its compute; the sends to
    one destination in the receiver's order, each right after the compute that makes it and
    every earlier one to that destination available), timed with the replay's arithmetic
    (`execution`: a receive waits for its send's post plus the link's transfer, as `estimator`
    costs it; a compute adds the sum of its layers' times at the stream's width; sends take no
    time). No tail: a stream arrives at it at its clock after its last compute. Memory:
    `memory.stage_memory` of each stream's own order. The profile must fit the plan
    (`composition.run_rerouted` checks). Returns each stream's arrival (by worker) and the
    largest peak."""
    routes = schedule.micro_batch_routes(plan_)
    owners = [frozenset(s.workers[0] for s in p.stages if s.workers) for p in plan_.pipelines]
    orders = _compute_orders(plan_, routes, timeline.pack_slots(routes, owners))
    tags: dict[tuple[plan.WorkerId | None, plan.WorkerId], list[int]] = {}
    for worker, order in orders.items():  # per pair, the receiver's order is the tag order
        sources = {c[4] for c in order}
        sources.discard(None)
        for source in sources:  # a few neighbours: one C-level pass each
            tags[(source, worker)] = [c[5] for c in order if c[4] == source]
    stages = {s.workers[0]: s for p in plan_.pipelines for s in p.stages if s.workers}
    programs = {}
    shapes = set()  # what each stream's peak depends on (`_routed_peak`)
    for w in sorted(stages):
        order = orders.get(w, [])
        programs[w], most = _program(w, stages[w], order, tags, plan_.gpus_per_node, prof)
        # a stream sends activations on and receives gradients unless its stage (whose layers
        # every compute of it runs) holds the last layer: its forwards then go nowhere
        inner = bool(order) and stages[w].layer_stop < plan_.num_layers
        shapes.add(
            (stages[w].layer_start, stages[w].layer_stop, len(stages[w].workers), most, inner)
        )
    peak = max(_routed_peak(*shape, prof) for shape in shapes)
    return _routed_clocks(programs), peak


_STAGES = 1 << 16  # more than any pipeline's stages: a message number's stage digit


def _compute_orders(
    plan_: plan.Plan, routes: list[list[timeline.Route]], slots: tuple[tuple[int, ...], ...]
) -> dict[plan.WorkerId, list[_Compute]]:
    """Each worker's computes in the schedule's order: by virtual time on one slot count for
    all pipelines, then pipeline, slot, forward before backward (`schedule._tasks`)."""
    num_slots = 1 + max((s for pipeline in slots for s in pipeline), default=-1)
    times: dict[int, tuple[list[list[int]], list[list[int]]]] = {}
    orders: dict[plan.WorkerId, list[_Compute]] = {}
    g = 0  # the global micro-batch number: contiguous per pipeline, in pipeline order
    for p, pipeline in enumerate(plan_.pipelines):
        depth = len(pipeline.stages)
        assert depth < _STAGES, "a message number holds the stage"
        if depth not in times:
            times[depth] = timeline.unit_times(depth, num_slots)
        forward_end, backward_end = times[depth]
        for j, route in enumerate(routes[p]):
            slot, first = slots[p][j], g * 2 * _STAGES
            for s, worker in enumerate(route):
                before = route[s - 1] if s > 0 else None
                after = route[s + 1] if s + 1 < depth else None
                here = first + 2 * s
                mine = orders.get(worker)
                if mine is None:
                    mine = orders[worker] = []
                # activations from and to the neighbours (here, here + 2), gradients
                # (here + 1, here - 1); the numbers at the pipeline's ends are never read
                mine.append((forward_end[s][slot], p, slot, False, before, here, after, here + 2))
                mine.append(
                    (backward_end[s][slot], p, slot, True, after, here + 1, before, here - 1)
                )
            g += 1
    # the order key is unique per worker (a worker runs one stage of a pipeline, a slot holds
    # one micro-batch of a pipeline), so what follows it is never compared
    for mine in orders.values():
        mine.sort()
    return orders


def _program(
    worker: plan.WorkerId,
    stage: plan.Stage,
    order: list[_Compute],
    tags: dict[tuple[plan.WorkerId | None, plan.WorkerId], list[int]],
    gpus_per_node: int,
    prof: profile.Profile,
) -> tuple[list[_Step], int]:
    """`worker`'s computes as the replay meets them (`schedule._stream_body`'s placement), and
    the most micro-batches it has in flight (forwards run less backwards, at any point)."""
    layers = prof.layers[stage.layer_start : stage.layer_stop]
    k = len(stage.workers) - 1  # a rerouted compute runs a peer stage's layers: the same
    cost = (sum(x.forward_s[k] for x in layers), sum(x.backward_s[k] for x in layers))
    # what a send carries (`estimator.ProfileCosts.transfer_s`): the output of the stage's
    # last layer forward, of the layer before its first backward; a worker sends only
    # activations or only gradients to one destination (its layers follow or precede its)
    carried = (layers[-1].output_bytes, prof.layers[stage.layer_start - 1].output_bytes)
    transfer: dict[plan.WorkerId | None, float] = {None: 0.0}
    for destination, backward in {c[6]: c[3] for c in order}.items():
        if destination is not None:  # `estimator.link_among` of the two
            near = worker // gpus_per_node == destination // gpus_per_node
            link = prof.intra_node if near else prof.inter_node
            transfer[destination] = link.transfer_s(carried[backward])
    most = max(itertools.accumulate((-1 if c[3] else 1 for c in order), initial=0))
    in_order = all(
        [c[7] for c in order if c[6] == destination] == tags[(worker, destination)]
        for destination in transfer
        if destination is not None
    )
    if in_order:  # every send is made in its receiver's order: each is posted at once
        return [
            (
                c[5] if c[4] is not None else -1,
                cost[c[3]],
                (c[7],) if c[6] is not None else (),
                transfer[c[6]],
            )
            for c in order
        ], most
    return _held_back(worker, order, tags, cost, transfer), most


def _held_back(
    worker: plan.WorkerId,
    order: list[_Compute],
    tags: dict[tuple[plan.WorkerId | None, plan.WorkerId], list[int]],
    cost: tuple[float, float],
    transfer: dict[plan.WorkerId | None, float],
) -> list[_Step]:
    """`_program` when some send is made before an earlier one to the same destination: it is
    held back and posted right after the compute that makes the earlier one."""
    # per destination: the messages to it in tag order, the next tag to send
    sending: dict[plan.WorkerId, tuple[list[int], list[int]]] = {}
    produced: set[int] = set()
    program: list[_Step] = []
    for _, _, _, backward, source, inbound, destination, outbound in order:
        waits = inbound if source is not None else -1
        if destination is None:
            program.append((waits, cost[backward], (), 0.0))
            continue
        to = sending.get(destination)
        if to is None:
            to = sending[destination] = (tags[(worker, destination)], [0])
        pair, next_tag = to
        tag = next_tag[0]
        if pair[tag] != outbound:  # made before its turn: pair[tag], earlier, is not made yet
            produced.add(outbound)
            program.append((waits, cost[backward], (), 0.0))
            continue
        first, tag = tag, tag + 1
        while tag < len(pair) and pair[tag] in produced:
            tag += 1
        next_tag[0] = tag
        program.append((waits, cost[backward], tuple(pair[first:tag]), transfer[destination]))
    return program


def _routed_clocks(programs: dict[plan.WorkerId, list[_Step]]) -> dict[plan.WorkerId, float]:
    """Each worker's clock after its last compute: the workers advanced in turn as far as
    their messages have come. Raises DeadlockError when some cannot finish (the timeline
    guarantees they can)."""
    clock = dict.fromkeys(programs, 0.0)
    position = dict.fromkeys(programs, 0)
    arrived: dict[int, float] = {}
    waiting: dict[int, plan.WorkerId] = {}
    ready = deque(programs)
    while ready:
        worker = ready.popleft()
        program, k, now = programs[worker], position[worker], clock[worker]
        end = len(program)
        while k < end:
            inbound, cost, posts, transfer_s = program[k]
            if inbound >= 0:
                arrival = arrived.get(inbound)
                if arrival is None:
                    waiting[inbound] = worker
                    break
                if arrival > now:  # the replay's receive: max(now, arrival), without a call
                    now = arrival
            now = now + cost
            for message in posts:
                arrived[message] = now + transfer_s
                if message in waiting:
                    ready.append(waiting.pop(message))
            k += 1
        position[worker], clock[worker] = k, now
    stuck = sorted(w for w, program in programs.items() if position[w] < len(program))
    if stuck:
        raise errors.DeadlockError(f"the rerouted computes deadlock: workers {stuck} wait")
    return clock


def _routed_peak(
    layer_start: int,
    layer_stop: int,
    width: int,
    max_in_flight: int,
    inner: bool,
    prof: profile.Profile,
) -> int:
    """`memory`'s peak of a stream of a `width`-worker stage of layers [layer_start,
    layer_stop) with `max_in_flight` micro-batches in flight, sending activations on and
    receiving gradients when `inner` (the worker's id is not part of it)."""
    return memory.stage_memory(
        plan.WorkerId(0),
        prof.layers[layer_start:layer_stop],
        width,
        max_in_flight=max_in_flight,
        sends_on=inner,
        receives_grads=inner,
    ).peak_bytes
