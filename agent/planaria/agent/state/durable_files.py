"""Durable private files: written afresh, fsync'ed, owner-only, with their checksum.

What a snapshot store and a persistent checkpoint both need of the file system: directories
made 0700 whatever the umask (issue #10), files created anew (unlink, never truncated in place,
so a reader holding the old file keeps its bytes) with mode 0600, written in batched writev
calls and fsync'ed, and directory renames made durable. Checksums are `algorithm:hexdigest`
with xxh3 (xxHash's XXH3, 64 bits: the snapshot default, about 9x zlib's crc32 here; see
docs/benchmarks.md), crc32 (the manifests' and older snapshots' checksum) or blake2b.

Snapshot stores rewrite their data files in place (`reuse=True`): on tmpfs the pages of a file
that already exists are written at memory speed, while a new file's pages are allocated and
zeroed on first touch (about 8x slower, measured on an H100 host; issue #16).

Not here: slots, manifests and what makes a snapshot complete (`snapshot_store`).

Errors: OSError from the file system, unchanged.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import xxhash

WRITEV_BATCH = 512  # chunks per writev: each system call hands the GIL over and back


class _Crc32:
    def __init__(self) -> None:
        self.value = 0

    def update(self, data: Any) -> None:
        self.value = zlib.crc32(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


def _blake2b() -> Any:
    return hashlib.blake2b(digest_size=16)


CHECKSUMS: dict[str, Callable[[], Any]] = {
    "xxh3": xxhash.xxh3_64,
    "crc32": _Crc32,
    "blake2b": _blake2b,
}


def checksum_of(algorithm: str, chunks: Iterable[Any]) -> str:
    """`algorithm:hexdigest` of the concatenated chunks (bytes-like)."""
    digest = CHECKSUMS[algorithm]()
    for chunk in chunks:
        digest.update(chunk)
    return f"{algorithm}:{digest.hexdigest()}"


def make_private_dir(path: Path) -> None:
    """Create `path` and any missing parents as owner-only (0700) directories whatever the
    umask (issue #10: snapshots are readable by the job's user alone); `path` itself is made
    0700 if it existed. Existing parents keep their mode (a shared base is not ours to close)."""
    missing = [path, *(parent for parent in path.parents if not parent.exists())]
    for directory in reversed(missing):
        # mkdir's mode is masked by the umask and `mkdir(parents=True)` ignores it for
        # parents: a job directory under umask 0 would be 0777, letting anyone swap its stores.
        directory.mkdir(mode=0o700, exist_ok=True)
        directory.chmod(0o700)


def write_private_file(
    path: Path, chunks: Iterable[Any], algorithm: str, *, reuse: bool = False
) -> str:
    """Write the chunks to `path` (0600), fsync; returns their checksum.

    By default an existing file is unlinked first rather than truncated, so a reader holding
    it open keeps the old bytes; with `reuse` an existing file is overwritten in place and cut
    to the new length (its pages need no first touch; the caller makes sure nobody reads it).
    Chunks go out in batches with one writev each: every system call hands the GIL to the
    training thread and back, so fewer calls disturb training less.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    if not reuse:
        path.unlink(missing_ok=True)
        flags |= os.O_EXCL
    digest = CHECKSUMS[algorithm]()
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)  # exactly 0600: os.open's mode is masked by the umask
        batch: list[memoryview] = []
        written = 0
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            digest.update(view)
            batch.append(view)
            written += len(view)
            if len(batch) == WRITEV_BATCH:
                _write_all(fd, batch)
                batch = []
        _write_all(fd, batch)
        if reuse:
            os.ftruncate(fd, written)  # a longer old file keeps no tail
        os.fsync(fd)
    finally:
        os.close(fd)
    return f"{algorithm}:{digest.hexdigest()}"


def _write_all(fd: int, views: list[memoryview]) -> None:
    """Write every byte of `views`, in order (writev, then plain writes after a short one)."""
    if not views:
        return
    written = os.writev(fd, views)
    for view in views:
        if written >= len(view):
            written -= len(view)
            continue
        view = view[written:]
        written = 0
        while view:
            view = view[os.write(fd, view) :]


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink in directory `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
