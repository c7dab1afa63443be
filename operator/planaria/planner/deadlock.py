"""The schedule checker: a schedule runs to the end and computes exactly one training step.

`check_schedule` replays every stream under the executor's rules (`execution`: buffered sends,
blocking receives, blocking collectives met in the same order by all members) and raises
`errors.DeadlockError` naming the stuck instructions when it cannot finish. It then verifies the
step's semantics:
- messages: every send has exactly one matching receive (same pair, tag, kind, micro-batch), and
  each pair's messages are posted in tag order on both sides (so order-matching NCCL agrees);
- work: every layer of every micro-batch is forwarded exactly once and backwarded exactly once,
  by the worker that forwarded it, with the activation received from the worker that ran the
  layers before and the gradient from the worker that ran the layers after;
- gradients: every layer held by two or more workers is all-reduced exactly once on each holder,
  over exactly its holders, after that worker's last backward through it; holders include every
  worker that computed the layer (a holder that computed nothing adds zeros); the members of a
  group agree on each collective; collectives of one round have disjoint groups;
- each worker ends with one optimizer step over exactly its layers (a snapshot marker, if any,
  after it).
Any other violation raises `errors.ScheduleError`.

Not here: the rules themselves (`execution`), building schedules (`schedule`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import NoReturn

from planaria.contract import errors, instructions, plan, schedule
from planaria.planner import execution


def check_schedule(sched: schedule.Schedule) -> None:
    """Raise DeadlockError or ScheduleError unless `sched` is a correct, finishing step."""
    _check_groups_exist(sched)
    _check_nothing_after_the_optimizer(sched)
    execution.raise_if_stuck(sched, execution.replay(sched, execution.ZeroCosts()))
    _check_messages(sched)
    _check_work(sched)
    _check_gradients(sched)
    _check_optimizer(sched)


def _fail(message: str) -> NoReturn:
    raise errors.ScheduleError(message)


def _each(
    sched: schedule.Schedule,
) -> Iterator[tuple[schedule.WorkerStream, int, instructions.Instruction]]:
    for stream in sched.streams:
        for index, instruction in enumerate(stream.instructions):
            yield stream, index, instruction


def _check_groups_exist(sched: schedule.Schedule) -> None:
    workers = {s.worker for s in sched.streams}
    for stream, index, op in _each(sched):
        if isinstance(op, instructions.AllReduce) and not workers.issuperset(op.group):
            _fail(
                f"worker {stream.worker} #{index}: group {op.group} names workers without a stream"
            )


# --- messages ----------------------------------------------------------------------------------

_Side = dict[tuple[plan.WorkerId, plan.WorkerId, int], tuple[bool, int, int]]


def _check_messages(sched: schedule.Schedule) -> None:
    sends: _Side = {}
    receives: _Side = {}
    for stream, index, op in _each(sched):
        if isinstance(op, instructions.SendActivation | instructions.SendGrad):
            _record(sends, (stream.worker, op.destination, op.tag), op, index, "sends")
        elif isinstance(op, instructions.RecvActivation | instructions.RecvGrad):
            _record(receives, (op.source, stream.worker, op.tag), op, index, "receives")
    for key in sends.keys() | receives.keys():
        sent, received = sends.get(key), receives.get(key)
        if sent is None or received is None or sent[:2] != received[:2]:
            _fail(
                f"message {key} (source, destination, tag): sent as {sent}, received as "
                f"{received}; every send needs exactly one receive of the same kind and g"
            )
    _check_fifo(sends, "sends")
    _check_fifo(receives, "receives")


def _record(
    side: _Side,
    key: tuple[plan.WorkerId, plan.WorkerId, int],
    op: instructions.Send | instructions.Recv,
    index: int,
    what: str,
) -> None:
    if key in side:
        _fail(f"two {what} of message {key} (source, destination, tag)")
    grad = isinstance(op, instructions.SendGrad | instructions.RecvGrad)
    side[key] = (grad, op.micro_batch, index)


def _check_fifo(side: _Side, what: str) -> None:
    """Tags of each pair must be 0, 1, 2, ... in stream order (NCCL matches by order)."""
    by_pair: dict[tuple[plan.WorkerId, plan.WorkerId], list[tuple[int, int]]] = defaultdict(list)
    for (source, destination, tag), (_, _, index) in side.items():
        by_pair[(source, destination)].append((index, tag))
    for pair, posted in by_pair.items():
        tags = [tag for _, tag in sorted(posted)]
        if tags != list(range(len(tags))):
            _fail(f"{what} of pair {pair} are posted with tags {tags}, not 0, 1, 2, ... in order")


# --- work --------------------------------------------------------------------------------------


def _check_work(sched: schedule.Schedule) -> None:
    forwards = _owners(sched, instructions.Forward)
    backwards = _owners(sched, instructions.Backward)
    for g in range(sched.num_micro_batches):
        for layer in range(sched.num_layers):
            if (g, layer) not in forwards or (g, layer) not in backwards:
                _fail(f"layer {layer} of micro-batch {g} is not forwarded and backwarded")
    for stream in sched.streams:
        where = _positions(stream)
        for index, op in enumerate(stream.instructions):
            if isinstance(op, instructions.Forward | instructions.Backward):
                wiring = _wiring(sched, op, forwards, backwards)
                for need, (kind, peer), later in wiring:
                    found = where.get((kind, op.micro_batch, peer))
                    if found is None or (found > index) != later:
                        _fail(
                            f"worker {stream.worker} #{index}: {op} needs {need} "
                            f"{'after' if later else 'before'} it"
                        )


def _owners(
    sched: schedule.Schedule, kind: type[instructions.Forward] | type[instructions.Backward]
) -> dict[tuple[int, int], plan.WorkerId]:
    """(micro-batch, layer) -> the worker computing it; repeated or out-of-range work fails."""
    owners: dict[tuple[int, int], plan.WorkerId] = {}
    for stream, index, op in _each(sched):
        if isinstance(op, kind):
            if op.micro_batch >= sched.num_micro_batches or op.layer_stop > sched.num_layers:
                _fail(f"worker {stream.worker} #{index}: {op} is outside the step")
            if op.layer_start < stream.layer_start or op.layer_stop > stream.layer_stop:
                _fail(f"worker {stream.worker} #{index}: {op} runs layers it does not hold")
            for layer in range(op.layer_start, op.layer_stop):
                if (op.micro_batch, layer) in owners:
                    _fail(f"layer {layer} of micro-batch {op.micro_batch}: {kind.op} twice")
                owners[(op.micro_batch, layer)] = stream.worker
    return owners


# (what, micro-batch, peer): for messages the peer worker; for a forward its layer range.
_Position = tuple[str, int, object]


def _positions(stream: schedule.WorkerStream) -> dict[_Position, int]:
    """Where each message and forward sits in the stream."""
    where: dict[_Position, int] = {}
    for index, op in enumerate(stream.instructions):
        if isinstance(op, instructions.Send):
            where[(op.op, op.micro_batch, op.destination)] = index
        elif isinstance(op, instructions.Recv):
            where[(op.op, op.micro_batch, op.source)] = index
        elif isinstance(op, instructions.Forward):
            where[(op.op, op.micro_batch, (op.layer_start, op.layer_stop))] = index
    return where


def _wiring(
    sched: schedule.Schedule,
    op: instructions.Forward | instructions.Backward,
    forwards: dict[tuple[int, int], plan.WorkerId],
    backwards: dict[tuple[int, int], plan.WorkerId],
) -> list[tuple[str, tuple[str, object], bool]]:
    """What `op` needs in its own stream: (description, (kind, peer), needed after it?).

    A forward receives its input from whoever forwarded the layer before and sends its output
    to whoever forwards the layer after; a backward follows its own forward of the same layers,
    receives the gradient from whoever backwarded the layer after, sends to the one before."""
    g, first, last = op.micro_batch, op.layer_start, op.layer_stop - 1
    more = last + 1 < sched.num_layers
    needs: list[tuple[str, tuple[str, object], bool]] = []
    if isinstance(op, instructions.Forward):
        if first > 0:
            peer = forwards[(g, first - 1)]
            needs.append(
                (f"the activation from {peer}", (instructions.Op.RECV_ACTIVATION, peer), False)
            )
        if more:
            peer = forwards[(g, last + 1)]
            needs.append((f"a send to {peer}", (instructions.Op.SEND_ACTIVATION, peer), True))
        return needs
    needs.append(("its own forward", (instructions.Op.FORWARD, (first, last + 1)), False))
    if more:
        peer = backwards[(g, last + 1)]
        needs.append((f"the gradient from {peer}", (instructions.Op.RECV_GRAD, peer), False))
    if first > 0:
        peer = backwards[(g, first - 1)]
        needs.append((f"a gradient send to {peer}", (instructions.Op.SEND_GRAD, peer), True))
    return needs


# --- gradients ---------------------------------------------------------------------------------


def _check_gradients(sched: schedule.Schedule) -> None:
    holders: dict[int, set[plan.WorkerId]] = defaultdict(set)
    for stream in sched.streams:
        for layer in stream.layers:
            holders[layer].add(stream.worker)
    for stream in sched.streams:
        _check_worker_reductions(stream, holders)
    _check_members_agree(sched)
    _check_rounds(sched)


def _check_worker_reductions(
    stream: schedule.WorkerStream, holders: dict[int, set[plan.WorkerId]]
) -> None:
    reduced: dict[int, int] = {}
    last_backward: dict[int, int] = {}
    for index, op in enumerate(stream.instructions):
        if isinstance(op, instructions.Backward):
            last_backward.update(dict.fromkeys(range(op.layer_start, op.layer_stop), index))
        if isinstance(op, instructions.AllReduce):
            for layer in op.layers:
                if layer in reduced or layer not in stream.layers:
                    _fail(
                        f"worker {stream.worker} #{index}: layer {layer} reduced twice or not held"
                    )
                if set(op.group) != holders[layer]:
                    _fail(
                        f"layer {layer} is reduced over {op.group}, its holders are "
                        f"{sorted(holders[layer])}"
                    )
                reduced[layer] = index
    for layer in stream.layers:
        shared = len(holders[layer]) > 1
        if shared != (layer in reduced):
            _fail(
                f"worker {stream.worker}: layer {layer} has {len(holders[layer])} holder(s) "
                f"but is {'' if layer in reduced else 'not '}all-reduced"
            )
        if layer in reduced and reduced[layer] < last_backward.get(layer, -1):
            _fail(f"worker {stream.worker}: layer {layer} is all-reduced before its last backward")


def _check_members_agree(sched: schedule.Schedule) -> None:
    """The k-th collective on a group is the same instruction on every member."""
    sequences: dict[tuple[plan.WorkerId, ...], dict[plan.WorkerId, list[instructions.AllReduce]]]
    sequences = defaultdict(lambda: defaultdict(list))
    for stream, _, op in _each(sched):
        if isinstance(op, instructions.AllReduce):
            sequences[op.group][stream.worker].append(op)
    for group, by_member in sequences.items():
        if len({tuple(ops) for ops in by_member.values()}) != 1:
            _fail(f"members of group {group} disagree on its collectives")


def _check_rounds(sched: schedule.Schedule) -> None:
    by_round: dict[int, set[instructions.AllReduce]] = defaultdict(set)
    for _, _, op in _each(sched):
        if isinstance(op, instructions.AllReduce):
            by_round[op.round].add(op)
    for round_, ops in by_round.items():
        seen: set[plan.WorkerId] = set()
        for op in sorted(ops, key=lambda o: o.layers):
            if not seen.isdisjoint(op.group):
                _fail(f"round {round_} has collectives whose groups share workers")
            seen.update(op.group)


# --- optimizer ---------------------------------------------------------------------------------


def _check_nothing_after_the_optimizer(sched: schedule.Schedule) -> None:
    """Before the replay: work after the optimizer step would wait at the commit barrier for
    peers that wait for it, and naming the misplaced instruction is the clearer error."""
    for stream in sched.streams:
        ops = stream.instructions
        steps = [i for i, op in enumerate(ops) if isinstance(op, instructions.OptimizerStep)]
        for index in range(steps[0] + 1 if steps else len(ops), len(ops)):
            if not isinstance(ops[index], instructions.Snapshot | instructions.OptimizerStep):
                _fail(f"worker {stream.worker} #{index}: {ops[index]} after the optimizer step")


def _check_optimizer(sched: schedule.Schedule) -> None:
    for stream in sched.streams:
        ops = stream.instructions
        steps = [i for i, op in enumerate(ops) if isinstance(op, instructions.OptimizerStep)]
        if len(steps) != 1:
            _fail(f"worker {stream.worker} has {len(steps)} optimizer steps, needs 1")
        step = ops[steps[0]]
        assert isinstance(step, instructions.OptimizerStep)
        if step.layers != tuple(stream.layers):
            _fail(f"worker {stream.worker} steps layers {step.layers}, holds {stream.layers}")
        for index, op in enumerate(ops):
            after = index > steps[0]
            if after and not isinstance(op, instructions.Snapshot):
                _fail(f"worker {stream.worker} #{index}: {op} after the optimizer step")
            if isinstance(op, instructions.Snapshot) and not after:
                _fail(f"worker {stream.worker} #{index}: snapshot before the optimizer step")
            if isinstance(op, instructions.Snapshot) and not set(op.layers) <= set(stream.layers):
                _fail(f"worker {stream.worker} #{index}: snapshot of layers it does not hold")
