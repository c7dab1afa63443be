"""Durable private files: written afresh, fsync'ed, owner-only, with their checksum.

What a snapshot store and a persistent checkpoint both need of the file system: directories
made 0700 whatever the umask (issue #10), files created anew (unlink, never truncated in place,
so a reader holding the old file keeps its bytes) with mode 0600, written in batched writev
calls and fsync'ed, and directory renames made durable. Checksums are `algorithm:hexdigest`
with crc32 (the default: about twice blake2b's speed here) or blake2b.

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


CHECKSUMS: dict[str, Callable[[], Any]] = {"crc32": _Crc32, "blake2b": _blake2b}


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


def write_private_file(path: Path, chunks: Iterable[Any], algorithm: str) -> str:
    """Create `path` afresh (0600), write the chunks, fsync; returns their checksum.

    An existing file is unlinked first rather than truncated, so a reader holding it open
    keeps the old bytes. Chunks go out in batches with one writev each: every system call
    hands the GIL to the training thread and back, so fewer calls disturb training less.
    """
    path.unlink(missing_ok=True)
    digest = CHECKSUMS[algorithm]()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # exactly 0600: os.open's mode is masked by the umask
        batch: list[memoryview] = []
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            digest.update(view)
            batch.append(view)
            if len(batch) == WRITEV_BATCH:
                _write_all(fd, batch)
                batch = []
        _write_all(fd, batch)
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
