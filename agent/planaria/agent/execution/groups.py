"""Process groups of one epoch: the world of the epoch's workers and its all-reduce subgroups.

An epoch is one configuration of the job: a fixed set of workers running one plan. Its groups
are formed from the rendezvous store the controller hosts (never a worker: it would take the
store down with it when it dies), under the key prefix `epoch-N`, so no two epochs read each
other's keys. `leave_epoch` tears them down, and the same process can then form the next epoch
with another rank and world size without restarting (about 20 ms for two gloo ranks here).

Ranks: a worker's rank in an epoch is its position among the schedule's workers sorted by id
(`worker_ranks`, by `planaria.contract.configure_rules.ranks`, the rule the controller hands
ranks out by); the executor checks it. The `epoch-N` key prefix is
`planaria.contract.rendezvous.key_prefix`, the one the controller sends.

Subgroups: torch requires `new_group` to be called on every rank of the world, members or not,
in the same order. `form_epoch` therefore creates every subgroup of the epoch at once, from one
sorted list (`subgroup_ranks`: the distinct all-reduce groups of the schedule), so no rank can
create them in another order. A subgroup that spans the whole world is the world group itself.

The host group (`Epoch.host`): snapshot mirrors and the restore's peer exchange move
host-memory bytes (uint8 CPU tensors), which an NCCL group cannot carry. An NCCL epoch therefore
also forms a gloo side group over the same ranks, through the same store (torch's `new_group`
puts its keys under the epoch's prefix and its own group name), with the same timeout, created
after the subgroups so every rank creates them in the same order. A gloo epoch's world group
already carries host bytes: no second group, unless `form_epoch(side_group=True)` asks for one
(how the CPU tests run the NCCL epochs' path: mirrors and exchange over a side group, released
with the epoch).

Teardown: gloo groups are destroyed; NCCL communicators are aborted first (torch's
`_abort_process_group`, which aborts and forgets every group of the process, the gloo side
group included), because a plain destroy may wait for a collective that a dead peer will never
finish. CI exercises gloo only (the NCCL release path over gloo groups included); a one-rank
NCCL epoch with its side group runs in tests/agent/test_host_group.py where CUDA is available.

Releasing blocked waits (`Epoch.release`): a wait on a peer that hangs, or on a live peer that
is itself blocked, ends only at the epoch's timeout in gloo: its point-to-point works complete
only inside a blocking wait(), ProcessGroupGloo.abort() does not end one, a destroyed group
joins its worker threads (so it blocks on a collective in flight), and a group whose works are
still referenced keeps its connections open. What does end them is the transport: `form_epoch`
records the connected sockets the epoch's gloo groups opened (`Transport`, from /proc/self/fd
before and after forming; listening sockets and connections to ports that were already
listening, i.e. the agent's gRPC server, are left out), and `release` shuts them down. Every
pending wait of this process on the epoch then fails at once ("Connection closed by peer"), and
so does every peer's wait on this process: one release reaches every worker of the epoch that
shares a group with it. For NCCL, `release` shuts down the side group's sockets (the only
ones recorded: those opened while it formed, NCCL's own connections left to NCCL) and then
aborts the communicators.

Only one epoch can be formed in a process at a time: torch keeps the world group process-wide.

Errors:

    GroupsError
    ├── EpochInputError (ValueError)   a rank, size, epoch number or subgroup out of range,
    │                                  or an epoch formed while another is still formed
    └── EpochFormationError            the rendezvous did not complete (a member never came)
        └── EpochGivenUpError          the epoch was flagged failed before every rank came
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch.distributed as dist

# torch's stubs do not re-export the store classes from torch.distributed; these are the same.
from torch._C import _distributed_c10d as c10d

from planaria.contract import configure_rules, instructions, plan, rendezvous, schedule
from planaria.wire import messages

RankSet = tuple[int, ...]


class GroupsError(Exception):
    """Base of the errors this module raises on purpose."""


class EpochInputError(GroupsError, ValueError):
    """Arguments that cannot form an epoch; the message names the argument and the fix."""


class EpochFormationError(GroupsError):
    """Joining the epoch's groups failed, typically because a member never arrived in time."""


class EpochGivenUpError(EpochFormationError):
    """The epoch was flagged failed (`planaria.contract.rendezvous`) while this rank waited
    for the others to form it: a member failed or left, or the controller gave it up."""


FD_DIR = "/proc/self/fd"  # Linux: where a process's open descriptors are listed


def _sockets() -> dict[int, int]:
    """This process's open sockets, inode -> descriptor ({} without /proc)."""
    found: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir(FD_DIR):
            with contextlib.suppress(OSError):
                target = os.readlink(f"{FD_DIR}/{name}")
                if target.startswith("socket:["):
                    found[int(target[len("socket:[") : -1])] = int(name)
    return found


@contextlib.contextmanager
def _borrowed(fd: int, inode: int) -> Iterator[socket.socket | None]:
    """A duplicate of descriptor `fd` as a socket, None when it no longer is socket `inode`
    (closed, or its number reused)."""
    try:
        if os.readlink(f"{FD_DIR}/{fd}") != f"socket:[{inode}]":
            yield None
            return
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        yield None
        return
    with sock:
        yield sock


def _listening_ports(sockets: Mapping[int, int]) -> set[int]:
    ports = set()
    for inode, fd in sockets.items():
        with _borrowed(fd, inode) as sock, contextlib.suppress(OSError):
            if sock is not None and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                ports.add(sock.getsockname()[1])
    return ports


@dataclass(slots=True, eq=False)
class Transport:
    """The connected sockets an epoch's gloo groups opened in this process, inode -> descriptor
    (module docstring, "Releasing blocked waits"). `shut` is safe from any thread, more than
    once, and never touches a descriptor that no longer is the socket recorded."""

    sockets: dict[int, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def opened(cls, before: Mapping[int, int], listening: set[int]) -> Transport:
        """The connected sockets opened since `before` (this process's sockets then), less
        listening ones and connections accepted on a port of `listening`."""
        mine = {}
        for inode, fd in _sockets().items():
            if inode in before:
                continue
            with _borrowed(fd, inode) as sock, contextlib.suppress(OSError):
                if sock is None or sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    continue  # (shutting gloo's listener down would abort the process)
                inet = sock.family in (socket.AF_INET, socket.AF_INET6)
                if inet and sock.getsockname()[1] not in listening:
                    mine[inode] = fd
        return cls(sockets=mine)

    def shut(self) -> int:
        """Shut every recorded socket down (both directions); how many were still open."""
        with self._lock:
            sockets, self.sockets = self.sockets, {}
        shut = 0
        for inode, fd in sockets.items():
            with _borrowed(fd, inode) as sock, contextlib.suppress(OSError):
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
                    shut += 1
        return shut


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Epoch:
    """The formed process groups of epoch `number`, seen from rank `rank`.

    `subgroups` maps every subgroup's sorted ranks to its group (the world's ranks map to the
    world group). On a rank outside a subgroup its entry is torch's non-member placeholder.
    `side` is the gloo side group over every rank (module docstring, "The host group"): always
    on NCCL, on gloo only when asked for; `host` is the group host bytes travel on.
    """

    number: int
    rank: int
    world_size: int
    backend: messages.Backend
    timeout_s: float
    world: dist.ProcessGroup
    subgroups: Mapping[RankSet, dist.ProcessGroup]
    transport: Transport = field(default_factory=Transport)
    side: dist.ProcessGroup | None = None

    def release(self) -> None:
        """End every pending wait on this epoch's groups, here and at its peers, at once
        (module docstring); from any thread. The epoch is unusable afterwards: leave it."""
        self.transport.shut()  # gloo's sockets: every group's on gloo, the side group's on NCCL
        if self.backend is messages.Backend.NCCL and dist.is_initialized():
            # (torch raises when another thread aborted or left first: nothing left to abort)
            with contextlib.suppress(RuntimeError, ValueError, AssertionError):
                dist.distributed_c10d._abort_process_group()

    @property
    def host(self) -> dist.ProcessGroup:
        """The gloo group that carries host-memory bytes between every rank (ranks as in the
        world): the side group where one was formed, else a gloo world. GroupsError for an
        NCCL epoch without a side group (not one `form_epoch` formed)."""
        if self.side is not None:
            return self.side
        if self.backend is not messages.Backend.GLOO:
            raise GroupsError(
                f"epoch {self.number} is {self.backend} and has no gloo side group for host "
                "bytes; form it with groups.form_epoch"
            )
        return self.world

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout_s)

    def group(self, ranks: RankSet) -> dist.ProcessGroup:
        """The group of exactly these ranks; GroupsError when it was not formed."""
        if ranks == tuple(range(self.world_size)):
            return self.world
        try:
            return self.subgroups[ranks]
        except KeyError:
            raise GroupsError(
                f"epoch {self.number} has no subgroup of ranks {list(ranks)}; form the epoch "
                "with every all-reduce group of its schedule"
            ) from None


def worker_ranks(sched: schedule.Schedule) -> dict[plan.WorkerId, int]:
    """Rank of each worker of `sched` in its epoch: its position in worker-id order."""
    return configure_rules.ranks(stream.worker for stream in sched.streams)


def subgroup_ranks(sched: schedule.Schedule) -> tuple[RankSet, ...]:
    """The distinct all-reduce groups of `sched` as sorted rank tuples, in sorted order."""
    ranks = worker_ranks(sched)
    found = {
        tuple(sorted(ranks[w] for w in op.group))
        for stream in sched.streams
        for op in stream.instructions
        if isinstance(op, instructions.AllReduce)
    }
    return tuple(sorted(found))


def form_epoch(
    store: c10d.Store,
    epoch: int,
    rank: int,
    world_size: int,
    backend: messages.Backend,
    timeout_s: float,
    *,
    subgroups: Iterable[RankSet] = (),
    side_group: bool = False,
) -> Epoch:
    """Join epoch `epoch` as `rank` of `world_size` through `store`, and form its subgroups
    and, on NCCL (or with `side_group`, on gloo too), its gloo side group for host bytes.

    Every rank must pass the same `subgroups` and `side_group`. Blocks until every rank has
    joined (at most `timeout_s` per group), or until the epoch is flagged failed
    (`planaria.contract.rendezvous`). Raises EpochInputError for arguments out of range
    or when this process is still in an epoch, EpochFormationError when the rendezvous fails.
    """
    _check_epoch(epoch, rank, world_size, timeout_s)
    wanted = sorted(set(_checked_subgroups(subgroups, world_size)))
    timeout = datetime.timedelta(seconds=timeout_s)
    nccl = backend is messages.Backend.NCCL
    before = _sockets()
    side_before = before
    if not dist.is_initialized():
        # torch names a world group after a process-wide counter, and the name is part of every
        # rendezvous key ("epoch-E/<count>/..."). Destroying the world resets it, but a failed
        # init_process_group (a member that never came) leaves it advanced: this process would
        # then wait under other keys than a peer that never failed, in every epoch after.
        dist.distributed_c10d._world.group_count = 0
    prefixed = c10d.PrefixStore(rendezvous.key_prefix(epoch), store)
    try:
        _arrive(prefixed, epoch, world_size, timeout)
        dist.init_process_group(
            str(backend),
            store=prefixed,
            rank=rank,
            world_size=world_size,
            timeout=timeout,
        )
        world = dist.group.WORLD
        assert world is not None, "init_process_group sets the world group"
        formed = {ranks: _subgroup(ranks, world, world_size, timeout) for ranks in wanted}
        side = None
        if nccl or side_group:
            side_before = _sockets() if nccl else before  # on NCCL: only the side group's
            side = _side_group(world_size, timeout)
    except RuntimeError as exc:  # torch.distributed's errors (DistError) are RuntimeErrors
        _leave_quietly(nccl)
        failed = EpochGivenUpError if isinstance(exc, _GivenUp) else EpochFormationError
        raise failed(
            f"rank {rank} could not form epoch {epoch} of {world_size} ranks: {exc}"
        ) from exc
    # gloo's connections: every group's on gloo; on NCCL the side group's only (NCCL's own,
    # if it opened any, are NCCL's business: aborting the communicators ends them)
    transport = Transport.opened(side_before, _listening_ports(before))
    return Epoch(
        number=epoch,
        rank=rank,
        world_size=world_size,
        backend=backend,
        timeout_s=timeout_s,
        world=world,
        subgroups=formed,
        transport=transport,
        side=side,
    )


def leave_epoch(epoch: Epoch) -> None:
    """Tear down `epoch`'s groups (abort NCCL communicators first) so another can be formed.

    Safe after a failed step: gloo groups with a dead peer are destroyed at once.
    """
    if not dist.is_initialized():
        return
    if epoch.backend is messages.Backend.NCCL:
        # Private but the documented way to abort every NCCL communicator at once (torch's own
        # fault-tolerance tests use it); after it the process holds no groups at all.
        dist.distributed_c10d._abort_process_group()
        return
    dist.destroy_process_group()


def _subgroup(
    ranks: RankSet, world: dist.ProcessGroup, world_size: int, timeout: datetime.timedelta
) -> dist.ProcessGroup:
    if ranks == tuple(range(world_size)):
        return world
    group: dist.ProcessGroup = dist.new_group(list(ranks), timeout=timeout)
    return group


def _side_group(world_size: int, timeout: datetime.timedelta) -> dist.ProcessGroup:
    """The gloo group over every rank for host bytes (module docstring, "The host group")."""
    group: dist.ProcessGroup = dist.new_group(
        list(range(world_size)), timeout=timeout, backend="gloo"
    )
    return group


def _checked_subgroups(subgroups: Iterable[RankSet], world_size: int) -> list[RankSet]:
    checked = []
    for ranks in subgroups:
        if len(ranks) < 2 or list(ranks) != sorted(set(ranks)):
            raise EpochInputError(
                f"subgroup {list(ranks)} must list two or more distinct ranks in order"
            )
        if ranks[0] < 0 or ranks[-1] >= world_size:
            raise EpochInputError(f"subgroup {list(ranks)} names ranks outside 0..{world_size - 1}")
        checked.append(tuple(ranks))
    return checked


def _check_epoch(epoch: int, rank: int, world_size: int, timeout_s: float) -> None:
    if epoch < 1:
        raise EpochInputError(f"epoch numbers start at 1 (got {epoch})")
    if world_size < 1 or not 0 <= rank < world_size:
        raise EpochInputError(
            f"rank {rank} of world size {world_size}: need world size >= 1 and rank in "
            "0..world size - 1"
        )
    if not timeout_s > 0:
        raise EpochInputError(f"timeout_s must be > 0 (got {timeout_s})")
    if dist.is_initialized():
        raise EpochInputError(
            f"cannot form epoch {epoch}: this process is still in an epoch; leave it first"
        )


class _GivenUp(RuntimeError):
    """The epoch was flagged failed before every rank came to form it."""


def _arrive(store: c10d.Store, epoch: int, world_size: int, timeout: datetime.timedelta) -> None:
    """Wait (at most `timeout`) until every rank came to form the epoch, before torch's own
    rendezvous, which no failure flag ends (`planaria.contract.rendezvous`); _GivenUp when the
    epoch was flagged failed first."""
    if store.add(rendezvous.ARRIVED_KEY, 1) >= world_size:
        store.set(rendezvous.ALL_ARRIVED_KEY, "all")
    store.wait([rendezvous.ALL_ARRIVED_KEY], timeout)
    if store.check([rendezvous.FAILED_KEY]):
        raise _GivenUp(f"epoch {epoch} was given up before every rank came")


def _leave_quietly(nccl: bool) -> None:
    """Undo a half-formed epoch so the caller can try the next one (NCCL: abort, as
    `leave_epoch` does, since a destroy may wait on a communicator a missing peer blocks)."""
    if not dist.is_initialized():
        return
    if nccl:
        dist.distributed_c10d._abort_process_group()
        return
    dist.destroy_process_group()


def ranks_of(workers: Sequence[plan.WorkerId], ranks: Mapping[plan.WorkerId, int]) -> RankSet:
    """The sorted ranks of `workers` (e.g. an AllReduce's group)."""
    return tuple(sorted(ranks[w] for w in workers))
