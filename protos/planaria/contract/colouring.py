"""Rounds of asymmetric all-reduce by greedy graph colouring (Odyssey §IV-B).

With heterogeneous pipelines the layers of one stage are held by different sets of workers in the
other pipelines, so gradient synchronisation is layer-granular (Oobleck §6.1) and a worker takes
part in several all-reduce groups. Collectives on groups that share a worker must run one after
the other on that worker; collectives on disjoint groups can run at the same time. Odyssey models
this as a graph: a vertex per all-reduce (a bucket of layers with one group), an edge where two
groups share a device; a proper colouring is a partition into rounds whose collectives may run
concurrently, and fewer colours mean fewer serial rounds. Odyssey colours greedily in O(L^2);
we use Welsh-Powell (largest degree first), which is exact on the symmetric case (no edges, one
round) and never worse than the number of colours a degree bound allows (max degree + 1).

Not here: which layers form a bucket and who is in its group (`planaria.contract.schedule`), the
cost of a round (`planaria.planner.estimator`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


def conflict_graph(groups: Sequence[Collection[int]]) -> tuple[frozenset[int], ...]:
    """Adjacency of the all-reduce conflict graph: vertex i and j are joined when their groups
    (worker ids) share a worker. Vertex numbers are indices into `groups`."""
    members = [frozenset(group) for group in groups]
    neighbours: list[set[int]] = [set() for _ in members]
    for i, group in enumerate(members):
        for j in range(i + 1, len(members)):
            if not group.isdisjoint(members[j]):
                neighbours[i].add(j)
                neighbours[j].add(i)
    return tuple(frozenset(n) for n in neighbours)


def welsh_powell(adjacency: Sequence[Collection[int]]) -> tuple[int, ...]:
    """A proper colouring: colour[i] for every vertex, colours numbered 0, 1, ... densely.

    Vertices are visited by decreasing degree (ties: lower index first) and each takes the
    smallest colour none of its already coloured neighbours has. Deterministic; O(V^2 + E).
    """
    order = sorted(range(len(adjacency)), key=lambda v: (-len(adjacency[v]), v))
    colours: dict[int, int] = {}
    for vertex in order:
        taken = {colours[n] for n in adjacency[vertex] if n in colours}
        colours[vertex] = next(c for c in range(len(adjacency) + 1) if c not in taken)
    return tuple(colours[v] for v in range(len(adjacency)))


def is_proper(adjacency: Sequence[Collection[int]], colours: Sequence[int]) -> bool:
    """True when no edge joins two vertices of the same colour."""
    return all(colours[v] != colours[n] for v, ns in enumerate(adjacency) for n in ns)


def num_colours(colours: Sequence[int]) -> int:
    """How many distinct colours (rounds) a colouring uses; 0 for no vertices."""
    return len(set(colours))
