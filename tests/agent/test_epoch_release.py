"""Releasing an epoch's blocked waits (issue #18 item 1): the transport of an epoch
(`groups.Transport`) and the watcher (`planaria.agent.runtime.epoch_watch`), in this process.

Covers: `Transport.opened` records the connected TCP sockets opened since a snapshot of the
process's sockets, not listening ones, not ones accepted on a port that already listened (the
agent's gRPC server), not ones open before; `shut` ends a blocked receive at both ends at once,
counts only what it shut, is idempotent, and leaves a descriptor whose number now names another
socket alone; an NCCL epoch's release shuts its sockets (its gloo side group's) and aborts
its communicators. The watcher releases once when the epoch's failure keys are set (by another
worker or the controller: `rendezvous.flag_failed`), never after `stop`, and ends without
releasing when the store goes away; `stop` returns once its thread has ended. The pipeline
jobs that rely on both are in tests/e2e/test_pipeline_release.py.
"""

from __future__ import annotations

import datetime
import socket
import threading
from collections.abc import Iterator

import pytest
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from planaria.agent.execution import groups
from planaria.agent.runtime import epoch_watch
from planaria.contract import rendezvous
from planaria.wire import messages

JOIN_S = 30.0  # generous bound for a thread that should end promptly (never reached when right)


def _listener() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


def _connected(server: socket.socket) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    return client, accepted


def test_opened_records_only_the_new_connections_of_the_epoch() -> None:
    grpc = _listener()  # listening before the epoch, like the agent's gRPC server
    old_client, old_accepted = _connected(grpc)
    before = groups._sockets()
    listening = groups._listening_ports(before)
    assert grpc.getsockname()[1] in listening

    gloo = _listener()  # opened by the epoch, like gloo's listener
    mine, theirs = _connected(gloo)
    late_client, late_accepted = _connected(grpc)  # a gRPC connection during the epoch's set-up
    transport = groups.Transport.opened(before, listening)

    recorded = set(transport.sockets.values())
    assert mine.fileno() in recorded and theirs.fileno() in recorded
    assert late_client.fileno() in recorded  # (it dialled out from an ephemeral port)
    for excluded in (gloo, grpc, old_client, old_accepted, late_accepted):
        assert excluded.fileno() not in recorded
    for s in (grpc, old_client, old_accepted, gloo, mine, theirs, late_client, late_accepted):
        s.close()


def test_shut_ends_a_blocked_receive_at_both_ends() -> None:
    server = _listener()
    before = groups._sockets()
    mine, theirs = _connected(server)
    server.close()
    transport = groups.Transport.opened(before, set())
    received: list[bytes] = []
    blocked = threading.Thread(target=lambda: received.append(mine.recv(1)))
    blocked.start()
    assert transport.shut() == 2
    blocked.join(JOIN_S)
    assert not blocked.is_alive() and received == [b""]  # ended, not by data
    assert theirs.recv(1) == b""
    assert transport.shut() == 0  # nothing left to shut
    mine.close()
    theirs.close()


def test_shut_leaves_a_reused_descriptor_alone() -> None:
    server = _listener()
    before = groups._sockets()
    mine, theirs = _connected(server)
    transport = groups.Transport.opened(before, set())
    number = mine.fileno()
    mine.close()
    other, other_peer = _connected(server)  # may take the closed socket's number
    transport.sockets = {inode: fd for inode, fd in transport.sockets.items() if fd == number}
    assert len(transport.sockets) == 1
    transport.shut()
    other_peer.sendall(b"x")
    assert other.recv(1) == b"x"  # still connected
    for s in (server, theirs, other, other_peer):
        s.close()


class _Epoch:
    """What the watcher uses of an epoch: its number, rank and `release`."""

    def __init__(self, rank: int = 1) -> None:
        self.number, self.rank, self.world_size = 3, rank, 2
        self.released = threading.Event()
        self.releases = 0

    def release(self) -> None:
        self.releases += 1
        self.released.set()


@pytest.fixture
def server() -> Iterator[c10d.TCPStore]:
    yield c10d.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=10), False)


def _client(server: c10d.TCPStore) -> c10d.Store:
    return c10d.TCPStore("127.0.0.1", server.port, None, False, datetime.timedelta(seconds=10))


def _watch(server: c10d.TCPStore, epoch: _Epoch) -> epoch_watch.Watcher:
    own = c10d.PrefixStore(rendezvous.key_prefix(3), _client(server))
    return epoch_watch.Watcher(lambda: _client(server), rendezvous.key_prefix(3), epoch, own)  # type: ignore[arg-type]


def test_the_watcher_releases_once_when_the_epoch_is_flagged(server: c10d.TCPStore) -> None:
    epoch = _Epoch()
    watcher = _watch(server, epoch)
    flagger = c10d.PrefixStore(rendezvous.key_prefix(3), _client(server))
    rendezvous.flag_failed(flagger, 2, "controller")
    assert epoch.released.wait(JOIN_S)
    watcher._thread.join(JOIN_S)
    assert watcher.failed.is_set() and epoch.releases == 1
    watcher.stop()  # after the release: nothing more happens
    assert epoch.releases == 1


def test_a_stopped_watcher_never_releases(server: c10d.TCPStore) -> None:
    epoch = _Epoch()
    watcher = _watch(server, epoch)
    watcher.stop()
    # stop returns once the thread has ended: a daemon thread still inside the store's wait
    # when the agent exits aborts the process (epoch_watch's docstring)
    assert not watcher._thread.is_alive()
    rendezvous.flag_failed(c10d.PrefixStore(rendezvous.key_prefix(3), _client(server)), 2, "x")
    assert not watcher.failed.is_set() and epoch.releases == 0


def test_another_epochs_flag_does_not_release(server: c10d.TCPStore) -> None:
    epoch = _Epoch()
    watcher = _watch(server, epoch)
    rendezvous.flag_failed(c10d.PrefixStore(rendezvous.key_prefix(4), _client(server)), 2, "x")
    watcher.stop()
    watcher._thread.join(JOIN_S)
    assert epoch.releases == 0


def test_a_vanished_store_ends_the_watcher_without_releasing() -> None:
    server = c10d.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=10), False)
    epoch = _Epoch()
    connected = threading.Event()
    client = _client(server)

    def connect() -> c10d.Store:
        connected.set()
        return client

    own = c10d.PrefixStore(rendezvous.key_prefix(3), _client(server))
    watcher = epoch_watch.Watcher(connect, rendezvous.key_prefix(3), epoch, own)  # type: ignore[arg-type]
    assert connected.wait(JOIN_S)
    del server  # the controller's store goes away
    watcher._thread.join(JOIN_S)
    assert not watcher._thread.is_alive() and epoch.releases == 0


def test_an_nccl_epoch_is_released_by_aborting_its_communicators(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`release` shuts down the sockets recorded for an NCCL epoch (those of its gloo side
    group, `groups.Epoch.host`, only) and aborts every communicator (torch's
    `_abort_process_group`, safe from another thread); an abort that fails is swallowed: the
    epoch is being given up either way. (Only the call is checked here: no GPU in CI; the
    side group's blocked waits are tests/agent/test_host_group.py's.)"""
    calls: list[str] = []
    server = _listener()
    before = groups._sockets()
    mine, theirs = _connected(server)
    transport = groups.Transport.opened(before, set())

    def abort() -> None:
        calls.append("abort")
        raise RuntimeError("already aborted")

    monkeypatch.setattr(dist.distributed_c10d, "_abort_process_group", abort)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    epoch = groups.Epoch(
        number=1,
        rank=0,
        world_size=2,
        backend=messages.Backend.NCCL,
        timeout_s=1.0,
        world=None,  # type: ignore[arg-type]
        subgroups={},
        transport=transport,
    )
    epoch.release()
    assert calls == ["abort"]
    assert not transport.sockets and theirs.recv(1) == b""  # the side group's: shut down
    for s in (server, mine, theirs):
        s.close()
