"""The tied embedding matrix's gradient exchanged between the stages holding its two copies.

`planaria.agent.training.tying` defines the tie: W's gradient is G = E + H, the embedding use's
total plus the head use's, and both copies take it. In a plan the copies live with the holders
of layer 0 (the first stages) and of the head (the last stages). After the per-layer
all-reduces every holder of layer 0 has the same E and every holder of the head the same H
(an all-reduce leaves identical sums on its members, as data parallelism already relies on),
so each holder needs only the use it lacks:

    embeds = holders of layer 0, heads = holders of the head (workers sorted by id)
    the i-th holder of layer 0 alone     receives H from heads[i % len(heads)]
    the j-th holder of the head alone    receives E from embeds[j % len(embeds)]
    a holder of both (a 1-stage pipeline) has both: no message

and then every holder computes `tying.combine(E, H)` itself, in the one order, so all copies
get bit-identical G (a local sum where one worker holds both). The sums are the reduction's:
float64 in exact mode (the executor defers their rounding, `GradientSums.defer`), float32 in
fast mode. Messages are point-to-point on the epoch's world group, so no process group is
added to the epoch, on gloo and NCCL alike: tagged past every tag the schedule gives a pair
(`TAG`), and, per pair of workers, the lower rank posts its send before its receive and the
higher rank the other way round, which NCCL's in-order matching needs. Every holder of either
copy runs the exchange after its all-reduces and before the commit barrier; a pipeline with
both ends, heterogeneous and rerouted plans need nothing else (the holders are the schedule's
streams).

Not here: the rule itself (`tying`), the executor's order of events (`executor`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from planaria.agent.execution import failures, groups, held_layers
from planaria.agent.training import hf_models, reduction, tying
from planaria.contract import plan, schedule, shapes

# dist.isend / dist.irecv: (tensor, peer rank, tag=) -> work
_PointToPoint = Callable[..., dist.Work | None]
TAG = 1 << 20  # above any schedule tag: a pair's tags count its messages (fewer than 2 M)


class Use(enum.StrEnum):
    """The two uses of the tied matrix, by the layer that makes them."""

    EMBEDDING = "embedding"  # layer 0: E
    HEAD = "head"  # the last layer: H


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """One worker's part of the exchange: the uses it holds, which of them it sends to whom,
    and whom it receives the use it lacks from (None when it holds both)."""

    holds: frozenset[Use]
    sends: tuple[tuple[plan.WorkerId, Use], ...]
    source: plan.WorkerId | None


def route(sched: schedule.Schedule, worker: plan.WorkerId) -> Route | None:
    """`worker`'s part of the exchange in `sched` (module docstring); None when it holds
    neither copy."""
    holders = {
        Use.EMBEDDING: sorted(s.worker for s in sched.streams if 0 in s.layers),
        Use.HEAD: sorted(s.worker for s in sched.streams if sched.num_layers - 1 in s.layers),
    }
    holds = frozenset(use for use, workers in holders.items() if worker in workers)
    if not holds:
        return None
    # receiver -> (its source, the use it lacks)
    needs: dict[plan.WorkerId, tuple[plan.WorkerId, Use]] = {}
    for held, lacked in ((Use.EMBEDDING, Use.HEAD), (Use.HEAD, Use.EMBEDDING)):
        alone = [w for w in holders[held] if w not in holders[lacked]]
        sources = holders[lacked]
        needs.update({w: (sources[i % len(sources)], lacked) for i, w in enumerate(alone)})
    return Route(
        holds=holds,
        sends=tuple((w, use) for w, (source, use) in sorted(needs.items()) if source == worker),
        source=needs[worker][0] if worker in needs else None,
    )


class TieExchange:
    """Gives the copies of a tied matrix that one worker holds their combined gradient, each
    step (module docstring)."""

    def __init__(
        self,
        copies: Mapping[Use, nn.Parameter],
        route_: Route,
        ranks: Mapping[plan.WorkerId, int],
        worker: plan.WorkerId,
    ) -> None:
        self.copies, self.route, self.ranks = dict(copies), route_, ranks
        self.rank = ranks[worker]

    @classmethod
    def of(
        cls,
        shape: shapes.ModelShape,
        sched: schedule.Schedule,
        worker: plan.WorkerId,
        layers: held_layers.HeldLayers,
    ) -> TieExchange | None:
        """`worker`'s exchange in `sched`; None for an untied model or a worker holding
        neither copy."""
        mine = route(sched, worker) if tying.ties(shape) else None
        if mine is None:
            return None
        index = {Use.EMBEDDING: 0, Use.HEAD: tying.head_index(shape)}
        copies = {use: hf_models.tied_matrix(layers.modules[index[use]]) for use in mine.holds}
        return cls(copies, mine, groups.worker_ranks(sched), worker)

    def exchange(self, sums: reduction.GradientSums, waits: failures.Waits) -> None:
        """Set every held copy's gradient sum to E + H; raises failures.CommFailure when a
        peer fails."""
        uses = {use: sums.total(p).contiguous() for use, p in self.copies.items()}
        received = self._swap(uses, waits)
        if received is not None:
            (lacked,) = set(Use) - set(uses)
            uses[lacked] = received
        tied = tying.combine(uses[Use.EMBEDDING], uses[Use.HEAD])
        for n, copy in enumerate(self.copies.values()):
            sums.replace(copy, tied if n == 0 else tied.clone())  # each copy owns its sum

    def _swap(self, uses: Mapping[Use, torch.Tensor], waits: failures.Waits) -> torch.Tensor | None:
        """Send this worker's uses to its receivers and receive the lacking use from its source
        (None when it holds both), each pair in rank order (module docstring)."""
        source = self.route.source
        received = None if source is None else torch.empty_like(next(iter(uses.values())))
        works: list[tuple[plan.WorkerId, dist.Work]] = []
        peers = {receiver for receiver, _ in self.route.sends}
        if source is not None:
            peers.add(source)
        for peer in sorted(peers, key=lambda w: self.ranks[w]):
            sends = [(dist.isend, uses[use]) for to, use in self.route.sends if to == peer]
            receives = [(dist.irecv, received)] if peer == source else []
            ordered = sends + receives if self.rank < self.ranks[peer] else receives + sends
            for post, tensor in ordered:
                assert tensor is not None, "a worker with a source has a receive buffer"
                works.append((peer, self._post(post, tensor, peer, waits)))
        for peer, work in works:
            waits.wait(work, peer)
        return received

    def _post(
        self, post: _PointToPoint, tensor: torch.Tensor, peer: plan.WorkerId, waits: failures.Waits
    ) -> dist.Work:
        rank = self.ranks[peer]
        return waits.post(peer, lambda: post(tensor, rank, tag=TAG))
