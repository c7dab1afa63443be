"""One worker's host-memory snapshot store: raw files, JSON manifests, two slots (REFT §4.4).

A store is a directory (default /dev/shm/planaria/<job>/<worker>/; in a pod an emptyDir with
medium Memory) that outlives the agent process, so a restarted agent finds its snapshots again.
It has two slots, `slot-0` and `slot-1`: one holds the latest complete snapshot, the other the
ongoing one (REFT keeps "one completed copy and one ongoing snapshot").

    slot-1/layer-3.shard      raw bytes of this member's shard of layer 3's flattened state
    slot-1/layer-3.copy       a peer's shard (COPY, RECOMPUTE) ...
    slot-1/layer-3.parity     ... or this member's XOR parity (XOR)
    slot-1/manifest.json      written last, to a temp name, then renamed: the commit point

Writing a snapshot (`begin` -> `write_file`... -> `commit`): the target slot's manifest is
removed first, then every file is written and fsync'ed, files the new manifest does not name
are removed, then the manifest is written and atomically renamed. A snapshot is complete
exactly when its manifest exists. A crash or SIGKILL at any point leaves the other slot's
snapshot untouched and loadable.

Data files are pre-faulted memory: a slot's files are rewritten in place, so after the first
two snapshots every write lands on pages tmpfs already holds (a new file's pages are allocated
and zeroed on first touch, several times slower). While a reader of this store has the target
slot's files open (`open_snapshot`: a peer being served, a checkpoint being copied), that
slot's files are unlinked and created afresh instead, so the reader keeps its bytes. A reader
in another process is not tracked: if it reads the older slot while it is being rewritten (it
never does in the protocol: peers read during epoch set-up, when no writer runs), the torn file
fails its checksum and counts as lost (SnapshotCorrupt), never as wrong bytes.

Readers trust only manifests and verify every file: its length and checksum, named in the
manifest as `algorithm:hexdigest` (xxh3 by default, about 9x crc32's speed here; crc32, the
default of older snapshots, and blake2b stay readable; docs/benchmarks.md). The manifest
itself carries a crc32 of its body. Nothing is pickled: raw bytes and JSON only. Files are
mode 0600 and directories 0700.

Not here: what goes into the files (`snapshots`), parity arithmetic (`parity`), writing one
file durably (`durable_files`).

Errors (none is a user error, so none is a ValueError, except the configuration error):

    SnapshotError
    ├── SnapshotMissing       no complete snapshot of that step or layer here
    ├── SnapshotCorrupt       a file or manifest fails its length or checksum check
    ├── SnapshotTimeout       a background snapshot did not finish in time
    ├── SnapshotWriteError    writing a snapshot failed (the cause is chained)
    └── SnapshotConfigError (ValueError)   a bad job name, interval, mode or checksum name

Recovery treats Missing and Corrupt alike: this tier cannot serve, go to the next one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from planaria.agent.state import durable_files, manifests, parity
from planaria.wire import messages

LOG = logging.getLogger(__name__)

DEFAULT_BASE = Path("/dev/shm/planaria")
SLOTS = ("slot-0", "slot-1")
DEFAULT_CHECKSUM = "xxh3"
MANIFEST = "manifest.json"
# Buffers per writev call (well under IOV_MAX, 1024 on Linux).
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class SnapshotError(Exception):
    """Base of the errors snapshot storage raises on purpose."""


class SnapshotMissing(SnapshotError):
    """No complete snapshot of the step (or layer, or member) asked for is available."""


class SnapshotCorrupt(SnapshotError):
    """A snapshot file or manifest fails its length or checksum check."""


class SnapshotTimeout(SnapshotError):
    """A background snapshot did not finish within the time given."""


class SnapshotWriteError(SnapshotError):
    """Writing a snapshot failed; the underlying error is chained."""


class SnapshotConfigError(SnapshotError, ValueError):
    """A snapshot setting out of range; the message names it and the fix."""


def check_checksum_name(algorithm: str) -> None:
    if algorithm not in durable_files.CHECKSUMS:
        raise SnapshotConfigError(
            f"checksum {algorithm!r} is not supported; use one of {sorted(durable_files.CHECKSUMS)}"
        )


# --- paths ----------------------------------------------------------------------------------


def check_name(what: str, name: str) -> None:
    """A job name becomes a directory: letters, digits, '.', '_', '-', not starting with '.'."""
    if not _NAME.match(name):
        raise SnapshotConfigError(
            f"{what} {name!r} cannot name a directory; use 1-128 letters, digits, '.', '_' or "
            "'-', starting with a letter or digit"
        )


def store_root(job: str, worker: int, base: Path = DEFAULT_BASE) -> Path:
    """Where worker `worker` of job `job` keeps its snapshots: base/<job>/<worker>."""
    check_name("job", job)
    if worker < 0:
        raise SnapshotConfigError(f"worker {worker} must be >= 0")
    return base / job / str(worker)


def remove_job(job: str, base: Path = DEFAULT_BASE) -> None:
    """Delete every snapshot of job `job` under `base` (all workers); no-op when none."""
    check_name("job", job)
    shutil.rmtree(base / job, ignore_errors=True)


def commit_manifest(directory: Path, manifest: manifests.Manifest) -> bytes:
    """Write the manifest to a temp name, fsync, rename over manifest.json: the commit.
    Returns the bytes written."""
    temp = directory / (MANIFEST + ".tmp")
    raw = manifests.encode(manifest)
    durable_files.write_private_file(temp, [raw], "crc32")
    os.replace(temp, directory / MANIFEST)
    durable_files.fsync_dir(directory)
    return raw


def read_manifest(directory: Path) -> manifests.Manifest:
    """The manifest in `directory`; SnapshotMissing when absent, SnapshotCorrupt when bad."""
    return decode_manifest(read_manifest_bytes(directory), directory)


def read_manifest_bytes(directory: Path) -> bytes:
    try:
        return (directory / MANIFEST).read_bytes()
    except FileNotFoundError as exc:
        raise SnapshotMissing(f"no complete snapshot in {directory}") from exc


def decode_manifest(raw: bytes, directory: Path) -> manifests.Manifest:
    try:
        return manifests.decode(raw)
    except manifests.ManifestError as exc:
        raise SnapshotCorrupt(f"{directory / MANIFEST}: {exc}") from exc


def read_verified(handle: Any, stored: manifests.StoredFile, where: str) -> parity.Bytes:
    """All of an open file's bytes, checked against the manifest's length and checksum. The
    file's size is compared first, so a manifest claiming a huge file allocates nothing."""
    expected = stored.stop - stored.start
    size = os.fstat(handle.fileno()).st_size
    if size != expected:
        raise SnapshotCorrupt(f"{where}: {size} bytes but the manifest says {expected}")
    out = np.empty(expected + 1, dtype=np.uint8)  # one spare byte reveals an over-long file
    got = handle.readinto(out.data)
    if got != expected:
        raise SnapshotCorrupt(f"{where}: {got} bytes but the manifest says {expected}")
    return verify(out[:expected], stored, where)


def verify(data: parity.Bytes, stored: manifests.StoredFile, where: str) -> parity.Bytes:
    """`data` itself when it has the length and checksum the manifest names for `stored`
    (read here or received from a peer); SnapshotCorrupt otherwise."""
    expected = stored.stop - stored.start
    if data.size != expected:
        raise SnapshotCorrupt(f"{where}: {data.size} bytes but the manifest says {expected}")
    algorithm = stored.checksum.split(":", 1)[0]
    known = algorithm in durable_files.CHECKSUMS
    if not known or durable_files.checksum_of(algorithm, [data]) != stored.checksum:
        raise SnapshotCorrupt(f"{where}: checksum mismatch (the file was damaged)")
    return data


def digest(manifest: manifests.Manifest) -> str:
    """xxh3 of the file checksums `manifest` names, in its order: equal for the same bytes
    (the heartbeat's `HeldSnapshot.digest`; cheap, as no file is read)."""
    listed = "\n".join(f"{f.file}={f.checksum}" for e in manifest.layers for f in e.files)
    return durable_files.checksum_of("xxh3", [listed.encode()])


def member_digest(entry: manifests.LayerEntry) -> str:
    """xxh3 of one member's file names and checksums: the same at the member's holder and at
    its mirror, which keep the same files (`mirroring`)."""
    listed = "\n".join(f"{f.file}={f.checksum}" for f in entry.files)
    return durable_files.checksum_of("xxh3", [listed.encode()])


def member_digests(manifest: manifests.Manifest) -> tuple[messages.MemberDigest, ...]:
    """The heartbeat's `HeldSnapshot.members` for `manifest`: one digest per entry."""
    return tuple(
        messages.MemberDigest(layer=e.layer, member=e.member, digest=member_digest(e))
        for e in manifest.layers
    )


# --- the store ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _Slot:
    path: Path
    manifest: manifests.Manifest | None


class SnapshotStore:
    """A worker's two-slot snapshot directory. Thread-safe for one writer plus readers."""

    def __init__(self, root: Path, *, checksum: str = DEFAULT_CHECKSUM) -> None:
        check_checksum_name(checksum)
        self.root = root
        self.checksum = checksum
        self._lock = threading.Lock()
        self._readers: dict[str, int] = {}  # slot name -> open_snapshot readers now
        self._decoded: dict[str, tuple[bytes, manifests.Manifest]] = {}
        durable_files.make_private_dir(root)
        for slot in SLOTS:
            durable_files.make_private_dir(root / slot)

    # -- writing

    def begin(self, step: int) -> Path:
        """Prepare a slot for the snapshot of `step` and return its directory.

        Snapshots of steps >= `step` are dropped (a resumed run overwrites its future); the
        target is the slot not holding the latest remaining complete snapshot, emptied first.
        """
        with self._lock:
            slots = self._slots()
            for slot in slots:
                if slot.manifest is not None and slot.manifest.step >= step:
                    self._invalidate(slot.path, keep_files=not self._readers.get(slot.path.name))
            slots = self._slots()
            target = min(slots, key=lambda s: -1 if s.manifest is None else s.manifest.step)
            self._invalidate(target.path, keep_files=not self._readers.get(target.path.name))
            return target.path

    def write_file(self, directory: Path, name: str, chunks: Iterable[Any]) -> str:
        """Write one data file of the ongoing snapshot (in place when it exists: `begin`
        removed it if anyone here reads it); returns its checksum."""
        path = directory / name
        return durable_files.write_private_file(path, chunks, self.checksum, reuse=True)

    def commit(self, directory: Path, manifest: manifests.Manifest) -> None:
        """Make the snapshot in `directory` complete (see the module docstring)."""
        named = {*manifest.file_names(), MANIFEST}
        for path in directory.iterdir():
            if path.name not in named:  # a layer this snapshot no longer holds
                path.unlink()
        raw = commit_manifest(directory, manifest)
        self._decoded[directory.name] = (raw, manifest)

    def _invalidate(self, directory: Path, *, keep_files: bool) -> None:
        """Take the slot's snapshot away (its manifest), and its files unless `keep_files`
        (then the next snapshot rewrites them in place: their pages stay faulted in)."""
        (directory / MANIFEST).unlink(missing_ok=True)
        durable_files.fsync_dir(directory)
        for path in directory.iterdir():
            if not keep_files or path.name.endswith(".tmp"):
                path.unlink()

    # -- reading

    def complete_manifests(self) -> tuple[manifests.Manifest, ...]:
        """The complete snapshots held here, newest first (unreadable manifests are skipped)."""
        found = [s.manifest for s in self._slots() if s.manifest is not None]
        return tuple(sorted(found, key=lambda m: -m.step))

    def latest(self) -> manifests.Manifest:
        """The newest complete snapshot's manifest; SnapshotMissing when there is none."""
        found = self.complete_manifests()
        if not found:
            raise SnapshotMissing(f"no complete snapshot in {self.root}")
        return found[0]

    def manifest(self, step: int) -> manifests.Manifest:
        """The manifest of the complete snapshot of `step`; SnapshotMissing when absent."""
        for found in self.complete_manifests():
            if found.step == step:
                return found
        held = [m.step for m in self.complete_manifests()]
        raise SnapshotMissing(f"{self.root} holds no snapshot of step {step} (it has {held})")

    @contextlib.contextmanager
    def open_snapshot(self, step: int) -> Iterator[OpenSnapshot]:
        """Open every file of the snapshot of `step` at once, under the lock, so a snapshot
        written meanwhile (which unlinks, never overwrites) cannot change what is read."""
        with self._lock:
            slot = self._slot_of(step)
            assert slot.manifest is not None
            handles = {}
            try:
                for name in slot.manifest.file_names():
                    handles[name] = open(slot.path / name, "rb")  # noqa: SIM115 (closed below)
            except FileNotFoundError as exc:
                for handle in handles.values():
                    handle.close()
                raise SnapshotCorrupt(f"{slot.path}: a file named by the manifest is gone") from exc
            name = slot.path.name
            self._readers[name] = self._readers.get(name, 0) + 1  # begin() keeps off its files
        try:
            yield OpenSnapshot(manifest=slot.manifest, handles=handles, where=str(slot.path))
        finally:
            for handle in handles.values():
                handle.close()
            with self._lock:
                self._readers[name] -= 1

    def read_layer(self, step: int, layer: int) -> dict[str, parity.Bytes]:
        """The verified files of `layer` in the snapshot of `step`, by file name."""
        with self.open_snapshot(step) as snapshot:
            entry = snapshot.manifest.layer(layer)
            return {f.file: snapshot.read(f) for f in entry.files}

    def state(
        self, *, in_progress: bool = False, at_most: int | None = None
    ) -> messages.SnapshotState:
        """What the heartbeat reports: the latest complete step (at or before `at_most` when
        given) and the bytes it holds here, and every complete snapshot held (`held`, with
        `digest`s), whatever `at_most` says: what this store can serve its peers."""
        complete = self.complete_manifests()
        held = tuple(
            messages.HeldSnapshot(step=m.step, digest=digest(m), members=member_digests(m))
            for m in complete
        )
        found = [m for m in complete if at_most is None or m.step <= at_most]
        if not found:
            return messages.SnapshotState(in_progress=in_progress, held=held)
        latest = found[0]
        return messages.SnapshotState(
            latest_step=latest.step,
            held_bytes=latest.held_bytes,
            in_progress=in_progress,
            held=held,
        )

    def remove(self) -> None:
        """Delete this store's directory and everything in it."""
        with self._lock:
            shutil.rmtree(self.root, ignore_errors=True)

    def _slot_of(self, step: int) -> _Slot:
        for slot in self._slots():
            if slot.manifest is not None and slot.manifest.step == step:
                return slot
        raise SnapshotMissing(f"{self.root} holds no complete snapshot of step {step}")

    def _slots(self) -> list[_Slot]:
        return [_Slot(path=self.root / name, manifest=self._try_manifest(name)) for name in SLOTS]

    def _try_manifest(self, name: str) -> manifests.Manifest | None:
        """The slot's manifest as on disk now; decoding is skipped when the bytes are the
        ones decoded last time (decoding a large manifest costs milliseconds per snapshot)."""
        try:
            raw = read_manifest_bytes(self.root / name)
            cached = self._decoded.get(name)
            if cached is not None and cached[0] == raw:
                return cached[1]
            manifest = decode_manifest(raw, self.root / name)
        except SnapshotMissing:
            return None
        except SnapshotCorrupt as exc:
            LOG.warning("ignoring snapshot slot: %s", exc)
            return None
        self._decoded[name] = (raw, manifest)
        return manifest


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenSnapshot:
    """A complete snapshot whose files are all open (see `SnapshotStore.open_snapshot`)."""

    manifest: manifests.Manifest
    handles: dict[str, Any]
    where: str

    def read(self, stored: manifests.StoredFile) -> parity.Bytes:
        """The verified bytes of one file of this snapshot (SnapshotCorrupt when damaged)."""
        handle = self.handles[stored.file]
        handle.seek(0)
        return read_verified(handle, stored, f"{self.where}/{stored.file}")

    def read_unverified(self, stored: manifests.StoredFile) -> parity.Bytes:
        """Exactly as many bytes as the manifest names for `stored`, as the file holds them
        (zeros past a short file's end), unchecked: what a peer is sent, for the peer to
        verify on arrival (`verify`), so damage here is caught where the bytes are used."""
        out = np.zeros(stored.stop - stored.start, dtype=np.uint8)
        handle = self.handles[stored.file]
        handle.seek(0)
        handle.readinto(out.data)
        return out
