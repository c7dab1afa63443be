"""The virtual timeline that orders every worker's stream: micro-batch slots and unit 1F1B times.

Every pipeline runs 1F1B (PipeDream-Flush; Odyssey Fig. 5): stage s of S runs S - s - 1 warm-up
forwards, then alternates one forward and one backward, then drains the remaining backwards. We
place each micro-batch in a *slot* of a virtual 1F1B pipeline of M slots and give every compute op
(slot, stage, forward or backward) the time it ends at in that virtual pipeline when every op
takes one unit. A worker runs its ops in increasing virtual time.

Why no deadlock: an op's virtual time is strictly later than that of every op it depends on (the
forward of the previous stage, the backward of the next), so sorting all ops of all workers by
virtual time is one global order that respects every dependency and every worker's order; with
buffered sends and blocking receives the streams can therefore always run to the end, whatever
the real costs are (docs/schedule.md, "Why the streams cannot deadlock").

Without rerouting, micro-batch j of a pipeline sits in slot j and each stage's order is exactly
1F1B. With rerouting (ReCycle; Odyssey §II-C) a peer runs micro-batches of its own pipeline and
adopted ones of a pipeline that lost the stage; `pack_slots` gives them different slots, so the
peer runs one 1F1B over the union and the other stages run 1F1B over their pipeline's slots,
idling in the slots that belong to another pipeline's micro-batches. In the symmetric case this
keeps every stage's bubble at (S - 1)(Tf + Tb) and charges the peer exactly the extra compute:
Odyssey eq. 12 and eq. 13 hold with equality (tests/planner/test_estimator.py).

Not here: instructions and messages (`schedule`), real costs (`estimator`).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence

from planaria.contract import plan

# A micro-batch's route: the (lead) worker that runs each stage of its pipeline, in stage order.
Route = tuple[plan.WorkerId, ...]


def one_f_one_b(num_stages: int, stage: int, slots: Sequence[int]) -> tuple[tuple[bool, int], ...]:
    """The 1F1B order of `stage` over the given slots, as (is_backward, slot) pairs.

    Warm-up: the first min(S - s - 1, n) forwards; steady state: one forward then one backward;
    cool-down: the remaining backwards. Slots are taken in increasing order.
    """
    ordered = sorted(slots)
    warmup = min(num_stages - stage - 1, len(ordered))
    order = [(False, slot) for slot in ordered[:warmup]]
    for forward, backward in zip(ordered[warmup:], ordered, strict=False):
        order += [(False, forward), (True, backward)]
    done_backward = len(ordered) - warmup
    order += [(True, slot) for slot in ordered[done_backward:]]
    return tuple(order)


def unit_times(num_stages: int, num_slots: int) -> tuple[list[list[int]], list[list[int]]]:
    """End times (forward[s][j], backward[s][j]) of a full 1F1B pipeline with unit op costs.

    The pipeline DP of Odyssey eq. 11 with Tf = Tb = 1: an op starts when both the previous op
    of its stage and the op it depends on (forward of stage s-1, backward of stage s+1) are done.
    """
    orders = [one_f_one_b(num_stages, s, range(num_slots)) for s in range(num_stages)]
    forward = [[-1] * num_slots for _ in range(num_stages)]
    backward = [[-1] * num_slots for _ in range(num_stages)]
    position, clock = [0] * num_stages, [0] * num_stages
    pending = deque(range(num_stages))
    while pending:
        stage = pending.popleft()
        while position[stage] < len(orders[stage]):
            is_backward, slot = orders[stage][position[stage]]
            ready = _dependency_end(forward, backward, stage, slot, is_backward)
            if ready < 0:
                break
            clock[stage] = max(clock[stage], ready) + 1
            (backward if is_backward else forward)[stage][slot] = clock[stage]
            position[stage] += 1
            neighbour = stage - 1 if is_backward else stage + 1
            if 0 <= neighbour < num_stages:
                pending.append(neighbour)
    assert all(p == len(o) for p, o in zip(position, orders, strict=True)), "1F1B deadlocked"
    return forward, backward


def _dependency_end(
    forward: list[list[int]], backward: list[list[int]], stage: int, slot: int, is_backward: bool
) -> int:
    """End of the op this one waits for on another stage (0: none), or -1 when not done yet."""
    if not is_backward:
        return forward[stage - 1][slot] if stage > 0 else 0
    if stage + 1 < len(backward):
        return backward[stage + 1][slot]
    return forward[stage][slot]


def pack_slots(
    routes: Sequence[Sequence[Route]], owners: Sequence[frozenset[plan.WorkerId]]
) -> tuple[tuple[int, ...], ...]:
    """Slot of every micro-batch (routes[p][j] is micro-batch j of pipeline p): increasing along
    a pipeline, and no worker gets two micro-batches in one slot.

    Greedy, slot by slot: pipelines whose next micro-batch borrows a worker outside the pipeline
    (`owners[p]`) go first, since its slot must be free in two pipelines; then those whose
    busiest worker has the most micro-batches left; then by index. Each takes the slot when none
    of its workers is taken yet. Every slot places at least one micro-batch, so this ends; with
    no rerouting micro-batch j gets slot j.
    """
    left = Counter(w for pipeline in routes for route in pipeline for w in route)
    placed: list[list[int]] = [[] for _ in routes]
    slot = 0
    while waiting := [p for p, pipeline in enumerate(routes) if len(placed[p]) < len(pipeline)]:
        taken: set[plan.WorkerId] = set()
        nexts = {p: routes[p][len(placed[p])] for p in waiting}
        # (own pipeline only?, minus the busiest worker's remaining load, pipeline index)
        urgency = {
            p: (owners[p].issuperset(r), -max(left[w] for w in r), p) for p, r in nexts.items()
        }
        for p in sorted(waiting, key=urgency.__getitem__):
            if taken.isdisjoint(nexts[p]):
                taken.update(nexts[p])
                left.subtract(nexts[p])
                placed[p].append(slot)
        slot += 1
    return tuple(tuple(slots) for slots in placed)
