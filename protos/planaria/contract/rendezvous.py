"""Planaria's own keys in an epoch's rendezvous store, beside torch's, under the epoch's prefix.

A step that fails anywhere in an epoch must end every other worker's waits at once. The worker
whose step failed, or the controller when it declares a worker lost or hung, sets
`failure_keys`: FAILED_KEY (what a worker reads to know the epoch failed) and one wake key per
rank. Each worker's watcher blocks on its own wake key (one blocking store wait per worker and
epoch, no polling), so it wakes for a failure, or when its own worker leaves the epoch and sets
that key itself; FAILED_KEY then tells the two apart.

Before torch's rendezvous (`init_process_group`, which watches no flag and waits out its
timeout for a rank that never comes), every rank adds itself to ARRIVED_KEY and waits for
ALL_ARRIVED_KEY, which the last rank to come sets, and which the failure keys set too: an
epoch flagged failed while some rank still waits to form it (given up by the controller, a
member lost) releases that rank at once, and FAILED_KEY tells it why.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

FAILED_KEY = "planaria-step-failed"
ARRIVED_KEY = "planaria-arrived"  # a counter: the ranks that came to form the epoch
ALL_ARRIVED_KEY = "planaria-all-arrived"  # every rank came, or the epoch was flagged failed


def key_prefix(epoch: int) -> str:
    """The prefix of epoch `epoch`'s keys (its process groups' and these): no two epochs
    read each other's keys."""
    return f"epoch-{epoch}"


def wake_key(rank: int) -> str:
    """The key rank `rank`'s watcher waits for."""
    return f"planaria-wake-{rank}"


def failure_keys(world_size: int) -> tuple[str, ...]:
    """The keys that flag an epoch of `world_size` ranks failed, wake every watcher and
    release every rank still waiting to form it."""
    return (FAILED_KEY, ALL_ARRIVED_KEY, *(wake_key(r) for r in range(world_size)))


class Store(Protocol):
    """What `flag_failed` needs of a torch store (c10d.Store's `set`; its `multi_set`, one
    round trip for every key, is missing from torch's stubs)."""

    def set(self, key: str, value: str) -> None: ...


def flag_failed(store: Store, world_size: int, by: str) -> None:
    """Set the failure keys of an epoch of `world_size` ranks in `store` (prefixed with the
    epoch's key prefix) as `by`, in one request; nothing once the store is gone (torch's
    RuntimeError)."""
    keys = list(failure_keys(world_size))
    with contextlib.suppress(RuntimeError):
        getattr(store, "multi_set")(keys, [by] * len(keys))  # noqa: B009 (see Store)
