"""What the snapshot writer hands to, and takes from, the mirrors of its sharding groups.

Every member of a layer's sharding group also has its files kept by a mirror, a worker on
another node that does not hold the layer (`planaria.contract.snapshot_placement`), so that
losing every replica of a layer does not lose its snapshot. At each snapshot the writer passes
the files it wrote (`MemberFiles`: the layer entry, with their checksums, and their bytes) to a
`Mirroring`, which sends each to its mirror and returns the members this worker mirrors,
verified against the sender's checksums. The writer stores those byte for byte in the same
snapshot (same entry, same file names and checksums), so the two copies of a member are
interchangeable to every reader (`snapshots.rebuild_layer` takes either).

The transport lives in `planaria.agent.recovery.snapshot_mirrors` (the epoch's process group);
this module only declares the contract, so that the state layer needs no process group.

Errors: MirrorError when the exchange itself fails (a peer died); a damaged or malformed
member is left out by the transport (logged), never raised.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from planaria.agent.state import manifests, parity


class MirrorError(Exception):
    """Sending to or receiving from a mirror failed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberFiles:
    """One member's files of one layer: its manifest entry and each file's bytes, as chunks, in
    the entry's file order."""

    entry: manifests.LayerEntry
    chunks: tuple[tuple[parity.Bytes, ...], ...]


class Mirroring(Protocol):
    """Swaps one snapshot's member files with the mirrors (module docstring)."""

    def swap(self, *, step: int, epoch: int, mine: Sequence[MemberFiles]) -> list[MemberFiles]:
        """Send each of `mine` to its member's mirror; the verified members this worker
        mirrors (each as one chunk per file). MirrorError when a transfer fails."""
        ...


def is_mirrored(manifest: manifests.Manifest, entry: manifests.LayerEntry) -> bool:
    """Whether `entry` of `manifest` is another worker's member kept here as its mirror."""
    return entry.group[entry.member] != manifest.worker
