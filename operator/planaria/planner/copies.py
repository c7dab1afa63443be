"""E's whole step of a plan made of copies of a few pipelines, without building the plan.

The fresh-plan search (`sim.fresh`) estimates whole layouts of up to ~1,000 pipelines of one
or two depths on one-GPU nodes: built as a `plan.Plan` and composed (`screening.Estimates.
whole`: each pipeline's run looked up, then `composition.step_s` over every worker, with
`schedule.all_reductions`' buckets and colouring over ~1,000-worker groups), each such estimate
walked every worker several times. Here a plan is given as its kinds of pipelines, each a split
(layers per stage), its run alone (`composition.PipelineRun`) and how many copies of it the
plan holds, and its step is computed per class of stages, with the same floats.

Why the numbers are those of `composition.step_s` on the built plan, bit for bit, when every
node has one GPU (so every stage one worker, and no worker appears twice in a plan):

- A bucket (a maximal run of layers with the same holders, `schedule.all_reductions`) ends
  exactly at the cuts of the splits present: a layer after a cut of some pipeline has another
  holder there, and distinct stages have distinct workers. Its group holds stage r_k of every
  copy of kind k (r_k the stage of kind k's split holding the bucket), so it is the union of
  whole classes (k, r_k), and it has one worker per pipeline.
- Every worker of a class reaches its tail at its kind's arrival, and an all-reduce sets all
  its members' clocks to one value, so all workers of a class keep one clock: an all-reduce's
  start (a maximum: exact whatever the order and repetition of its terms) is the largest clock
  of its classes.
- Two groups share a worker exactly when they share a class, so the conflict graph, Welsh-
  Powell's rounds and the order every member runs the all-reduces, (round, first layer), are
  the schedule's.
- The links: a group of two or more one-GPU nodes, and the commit barrier over every worker,
  use the inter-node link (`estimator.link_among`); each all-reduce's cost, the barrier and the
  optimizer steps are `estimator`'s expressions on the same operands.

A plan of one pipeline is that pipeline's run (as `screening.Estimates` composes it).

Nodes of several GPUs (`Nodes`: the pipelines on consecutive workers 0, 1, 2, ..., as the
fresh-plan search lays them out): every stage is still one worker and no worker appears twice,
so the buckets, classes and rounds are as above, provided a kind also fixes its first worker's
GPU within a node (the hops of its run alone). Two things read the nodes: a bucket's group is
on one node (and its all-reduce uses the intra-node link) exactly when its first and last
holders are, since every worker of a pipeline comes before every worker of the next; the commit
barrier is, when the plan's last worker is on node 0.

Not here: the runs of the kinds (`composition.run_alone`), tensor-parallel stages, reroutes, or
pipelines laid out elsewhere than on consecutive workers (`screening.Estimates.whole`).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from planaria.contract import colouring, profile
from planaria.planner import composition, estimator


@dataclass(frozen=True, slots=True, kw_only=True)
class Copies:
    """`count` pipelines of one-worker stages of `split` layers each (in order, from layer 0),
    each run alone as `run`."""

    split: tuple[int, ...]
    run: composition.PipelineRun
    count: int

    def __post_init__(self) -> None:
        if (
            self.count < 1
            or min(self.split, default=0) < 1
            or len(self.run.arrival_s) != len(self.split)
        ):
            raise ValueError(
                f"{self.count} copies of split {self.split} run over {len(self.run.arrival_s)} "
                "stages; give one copy or more, and the run of that split"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class Nodes:
    """Where the copies lie on nodes of `gpus_per_node` GPUs: on workers 0 to `num_workers` - 1,
    each pipeline on consecutive workers; `first` and `last` index the kinds of the first and
    the last pipeline in worker order (module docstring). A kind's copies must share their
    first worker's GPU within a node, as their run says."""

    gpus_per_node: int
    num_workers: int
    first: int
    last: int


def whole(
    kinds: Sequence[Copies], prof: profile.Profile, nodes: Nodes | None = None
) -> tuple[float, int]:
    """The step and peak bytes of a plan holding `kinds`' copies, on one-GPU nodes (`nodes`
    None) or laid out as `nodes` says (module docstring): `screening.Estimates.whole`'s numbers
    for any such plan, bit for bit. Raises ValueError when a split does not hold the profile's
    layers or `nodes` does not match the kinds."""
    if any(sum(kind.split) != prof.num_layers for kind in kinds) or not kinds:
        raise ValueError(f"the splits must each hold the profile's {prof.num_layers} layers")
    num_workers = sum(len(kind.split) * kind.count for kind in kinds)
    if nodes is not None and (
        nodes.num_workers != num_workers
        or nodes.gpus_per_node < 1
        or not (0 <= nodes.first < len(kinds) and 0 <= nodes.last < len(kinds))
    ):
        raise ValueError(f"{nodes} does not lay out the {num_workers} workers of the kinds")
    peak = max([0, *(kind.run.peak_bytes for kind in kinds)])
    num_pipelines = sum(kind.count for kind in kinds)
    if num_pipelines == 1:
        return kinds[0].run.step_s, peak
    clock = [t for kind in kinds for t in kind.run.arrival_s]  # per class (kind, stage)
    for start, stop, group in _ordered_reductions(kinds):
        began = max(map(clock.__getitem__, group))
        # `estimator.allreduce_s`: the bytes per GPU of the narrowest member (1), DP members
        gradient = sum(prof.layers[i].gradient_bytes for i in range(start, stop))
        link = _link(kinds, prof, nodes, start)
        reduce_s = link.allreduce_s(gradient / 1, num_pipelines)
        for member in group:
            clock[member] = began + reduce_s
    on_one = nodes is not None and num_workers <= nodes.gpus_per_node
    barrier = estimator.barrier_s(prof.intra_node if on_one else prof.inter_node, num_workers)
    passed = max(clock) + barrier
    ranges = {r for kind in kinds for r in itertools.pairwise(_cuts(kind.split))}
    ends = [passed + estimator.optimizer_s(prof, range(a, b), 1) for a, b in ranges]
    return max(ends), peak


def _link(
    kinds: Sequence[Copies], prof: profile.Profile, nodes: Nodes | None, layer: int
) -> profile.LinkProfile:
    """The link of the all-reduce of the bucket that starts at `layer` (`estimator.link_among`):
    intra-node when its first holder (in the first pipeline, from worker 0) and its last (in the
    last pipeline, which ends at the last worker) share a node."""
    if nodes is None:
        return prof.inter_node
    split = kinds[nodes.last].split
    lowest = bisect.bisect_right(_cuts(kinds[nodes.first].split), layer) - 1
    highest = nodes.num_workers - len(split) + bisect.bisect_right(_cuts(split), layer) - 1
    same = lowest // nodes.gpus_per_node == highest // nodes.gpus_per_node
    return prof.intra_node if same else prof.inter_node


def _ordered_reductions(kinds: Sequence[Copies]) -> list[tuple[int, int, tuple[int, ...]]]:
    """Each bucket's (first layer, stop, classes of its group), in the order its members run
    them: (Welsh-Powell round, first layer)."""
    cuts = [_cuts(kind.split) for kind in kinds]
    firsts = list(itertools.accumulate((len(kind.split) for kind in kinds), initial=0))[:-1]
    buckets = list(itertools.pairwise(sorted({c for mine in cuts for c in mine})))
    # the class holding bucket [a, ...) in kind k: its first class plus the stage holding a
    pairs = list(zip(firsts, cuts, strict=True))
    groups = [
        tuple(first + bisect.bisect_right(mine, a) - 1 for first, mine in pairs) for a, _ in buckets
    ]
    rounds = colouring.welsh_powell(colouring.conflict_graph(groups))
    order = sorted(range(len(buckets)), key=lambda i: (rounds[i], buckets[i][0]))
    return [(*buckets[i], groups[i]) for i in order]


def _cuts(split: tuple[int, ...]) -> list[int]:
    return list(itertools.accumulate(split, initial=0))
