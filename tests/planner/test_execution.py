"""The replay's hot loop (planaria.planner.execution) against the loop it replaced.

Covers (hypothesis): on drawn plans (heterogeneous pipelines, reroutes, tensor-parallel stages,
several GPUs per node) with drawn layer costs and links, `replay` gives the same events, bit for
bit (times, causes, where a stuck worker waits), as the previous loop, kept below as the oracle:
one `match` per instruction and the dataclass's own constructor for every event. And the class
look-up that dispatches the loop agrees with the `match` for every instruction class.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.contract import instructions, plan, schedule
from planaria.planner import estimator, execution
from tests import strategies
from tests.planner.test_estimator import uniform_profile


class _OldRun(execution._Run):
    """The replay loop before the class look-up and the direct event constructor."""

    def advance(self, worker: plan.WorkerId) -> None:
        stream = self.streams[worker]
        while len(self.events[worker]) < len(stream.instructions):
            instruction = stream.instructions[len(self.events[worker])]
            event: execution.Event | None
            match instruction:
                case instructions.RecvActivation() | instructions.RecvGrad():
                    event = self._old_receive(worker, instruction)
                case instructions.SendActivation() | instructions.SendGrad():
                    event = self._old_send(stream, instruction)
                case instructions.AllReduce():
                    if not self._collective(worker, instruction):
                        return
                    continue
                case instructions.OptimizerStep() if worker not in self.committed:
                    if worker not in self.passed and not self._barrier(worker):
                        return
                    ready, cause = self.passed.pop(worker)
                    self.committed.add(worker)
                    now = self.clock[worker]
                    duration = self.costs.compute_s(stream, instruction)
                    event = execution.Event(
                        ready_s=ready, start_s=now, end_s=now + duration, cause=cause
                    )
                case _:
                    now = self.clock[worker]
                    duration = self.costs.compute_s(stream, instruction)
                    event = execution.Event(ready_s=now, start_s=now, end_s=now + duration)
            if event is None:
                return
            self.clock[worker] = event.end_s
            self.events[worker].append(event)

    def _old_send(
        self, stream: schedule.WorkerStream, instruction: instructions.Send
    ) -> execution.Event:
        now = self.clock[stream.worker]
        key = (stream.worker, instruction.destination, instruction.tag)
        arrival = now + self.costs.transfer_s(stream, instruction)
        self.arrivals[key] = (arrival, (stream.worker, len(self.events[stream.worker])))
        if key in self.waiting:
            self.ready.append(self.waiting.pop(key))
        return execution.Event(ready_s=now, start_s=now, end_s=now)

    def _old_receive(
        self, worker: plan.WorkerId, instruction: instructions.Recv
    ) -> execution.Event | None:
        key = (instruction.source, worker, instruction.tag)
        if key not in self.arrivals:
            self.waiting[key] = worker
            return None
        arrival, sender = self.arrivals[key]
        now = self.clock[worker]
        start = max(now, arrival)
        return execution.Event(
            ready_s=now, start_s=start, end_s=start, cause=sender if arrival > now else None
        )


def _old_replay(sched: schedule.Schedule, costs: execution.Costs) -> execution.Replay:
    run = _OldRun(sched, costs)
    while run.ready:
        run.advance(run.ready.popleft())
    stuck = tuple(
        (s.worker, len(run.events[s.worker]))
        for s in sched.streams
        if len(run.events[s.worker]) < len(s.instructions)
    )
    return execution.Replay(events={w: tuple(e) for w, e in run.events.items()}, stuck=stuck)


@settings(max_examples=80, deadline=None)
@given(p=strategies.plans(max_gpus_per_node=2), drawn=st.data())
def test_the_replay_is_the_previous_loop_bit_for_bit(p: plan.Plan, drawn: st.DataObject) -> None:
    layers = st.lists(
        strategies.layer_profiles(2), min_size=p.num_layers, max_size=p.num_layers
    ).map(tuple)
    prof = dataclasses.replace(
        uniform_profile(1, 1, 1),
        layers=drawn.draw(layers),
        intra_node=drawn.draw(strategies.link_profiles()),
        inter_node=drawn.draw(strategies.link_profiles()),
    )
    sched = schedule.compile_schedule(p)
    new = execution.replay(sched, estimator.ProfileCosts(sched, prof))
    old = _old_replay(sched, estimator.ProfileCosts(sched, prof))
    assert new == old
    for worker, events in new.events.items():  # == on floats: also the same bits of each
        for mine, theirs in zip(events, old.events[worker], strict=True):
            assert type(mine) is execution.Event
            assert repr(dataclasses.astuple(mine)) == repr(dataclasses.astuple(theirs))
    zero = execution.replay(sched, execution.ZeroCosts())
    assert zero == _old_replay(sched, execution.ZeroCosts())


def test_the_class_look_up_is_the_match_for_every_instruction() -> None:
    examples: list[instructions.Instruction] = [
        instructions.RecvActivation(source=plan.WorkerId(0), micro_batch=0, tag=0),
        instructions.RecvGrad(source=plan.WorkerId(0), micro_batch=0, tag=0),
        instructions.SendActivation(destination=plan.WorkerId(0), micro_batch=0, tag=0),
        instructions.SendGrad(destination=plan.WorkerId(0), micro_batch=0, tag=0),
        instructions.AllReduce(layers=(0,), group=(plan.WorkerId(0), plan.WorkerId(1)), round=0),
        instructions.OptimizerStep(layers=(0,)),
        instructions.Forward(micro_batch=0, layer_start=0, layer_stop=1),
        instructions.Backward(micro_batch=0, layer_start=0, layer_stop=1),
        instructions.Snapshot(layers=(0,)),
    ]
    assert set(execution._KINDS) == {type(op) for op in examples}
    for op in examples:
        assert execution._KINDS[type(op)] is execution._kind_of(op)
    kinds = {execution._kind_of(op) for op in examples}
    assert kinds == set(execution._Kind)
