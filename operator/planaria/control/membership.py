"""Who is alive and what each agent last said: the controller's view of its workers.

`Roster` absorbs what arrives on the controller's queue (heartbeats, broken Watch streams,
backend events) and answers the questions the controller's passes ask: which workers are dead
or silent, which heartbeat of a worker counts for an epoch, where the epoch's steps are.

A worker is *dead* from a DIED event or a broken Watch stream until a JOINED event for it;
*faulty* when the controller gave up on it (refused or never finished a Configure, past a
bound) until it joins again; *silent* when no heartbeat came for the job's heartbeat timeout.
Watch items carry the connection's generation, so a stale stream's end after a re-join is
ignored. Every change to the view goes through a method of `Roster` (the connections, the epoch
driver and the controller's concerns ask it; none of them writes its fields).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from planaria.contract import plan as plans
from planaria.control import ports
from planaria.wire import messages


@dataclass(frozen=True, slots=True, kw_only=True)
class Beat:
    """A heartbeat from connection `generation` of `worker`'s agent."""

    worker: plans.WorkerId
    generation: int
    heartbeat: messages.Heartbeat


@dataclass(frozen=True, slots=True, kw_only=True)
class Lost:
    """The Watch stream of connection `generation` broke or ended."""

    worker: plans.WorkerId
    generation: int
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """A backend event."""

    event: ports.WorkerEvent


Item = Beat | Lost | Event

# A worker that latched one of these is itself broken, not a survivor of a peer's death.
OWN_FAULTS = frozenset(
    {
        messages.ErrorKind.INTERNAL,
        messages.ErrorKind.INVALID_CONFIG,
        messages.ErrorKind.OUT_OF_MEMORY,
        messages.ErrorKind.INVALID_DATA,
    }
)
# These are the job's, not the worker's: its settings, plan or data, the same whichever worker
# tries, so no recovery can avoid them and the job fails (docs/controller.md).
PERMANENT = frozenset({messages.ErrorKind.INVALID_CONFIG, messages.ErrorKind.INVALID_DATA})
SETTLED = frozenset(
    {messages.AgentState.FAILED, messages.AgentState.FINISHED, messages.AgentState.PAUSED}
)
SETTING_UP = frozenset({messages.AgentState.CONFIGURING, messages.AgentState.TRANSFERRING})


@dataclass(slots=True, kw_only=True)
class Roster:
    """The controller's mutable view of its workers (module docstring)."""

    heartbeat_timeout_s: float
    beats: dict[plans.WorkerId, messages.Heartbeat] = field(default_factory=dict)
    beat_at: dict[plans.WorkerId, float] = field(default_factory=dict)
    generation: dict[plans.WorkerId, int] = field(default_factory=dict)
    dead: dict[plans.WorkerId, float] = field(default_factory=dict)  # worker -> noticed at
    faulty: set[plans.WorkerId] = field(default_factory=set)
    joined: list[plans.WorkerId] = field(default_factory=list)
    notices: set[plans.WorkerId] = field(default_factory=set)
    switching: set[plans.WorkerId] = field(default_factory=set)
    # Live workers a recovery counted failed only because they had not stopped in time (a
    # set-up still blocked on the epoch before, on a loaded machine): returns once stopped.
    slow: set[plans.WorkerId] = field(default_factory=set)
    was_live: set[plans.WorkerId] = field(default_factory=set)  # live at the last `returned`
    # worker -> the epoch of a planned switch it accepted that was given up: it sets that
    # epoch up alone until its rendezvous times out (`setting_up`)
    abandoned: dict[plans.WorkerId, int] = field(default_factory=dict)

    def connected(self, worker: plans.WorkerId, now: float) -> int:
        """A (re)connected agent: alive, its silence counted from now; its new generation."""
        self.generation[worker] = self.generation.get(worker, 0) + 1
        self.dead.pop(worker, None)
        self.faulty.discard(worker)
        self.notices.discard(worker)
        self.abandoned.pop(worker, None)
        self.beats.pop(worker, None)
        self.beat_at[worker] = now
        return self.generation[worker]

    def absorb(self, item: Item, now: float) -> None:
        """Take one queue item into the view."""
        if isinstance(item, Event):
            self._event(item.event, now)
        elif item.generation != self.generation.get(item.worker):
            return  # a stale connection's report
        elif isinstance(item, Beat):
            self.beats[item.worker] = item.heartbeat
            self.beat_at[item.worker] = now
        else:
            self.dead.setdefault(item.worker, now)

    def _event(self, event: ports.WorkerEvent, now: float) -> None:
        if event.kind is ports.EventKind.DIED:
            self.dead.setdefault(event.worker, now)
        elif event.kind is ports.EventKind.PREEMPTION_NOTICE:
            self.notices.add(event.worker)
        elif event.worker not in self.joined:
            self.joined.append(event.worker)

    def lost(self, worker: plans.WorkerId, now: float) -> None:
        """`worker` cannot be reached (a failed connect or Configure): dead from `now`."""
        self.dead.setdefault(worker, now)

    def give_up(self, workers: Iterable[plans.WorkerId]) -> None:
        """The controller gave up on `workers` (a refused or unanswered Configure, not running
        in time): faulty until they join again."""
        self.faulty |= set(workers)

    def excuse(self, workers: Iterable[plans.WorkerId]) -> None:
        """`workers` were given up on for no fault of theirs (a planned switch that came too
        late for them): no longer faulty."""
        self.faulty -= set(workers)

    def switch(self, workers: Iterable[plans.WorkerId]) -> None:
        """`workers` train on in an older epoch towards a planned switch (empty: none do)."""
        self.switching = set(workers)

    def take_joined(self) -> list[plans.WorkerId]:
        """The workers that joined since the last call, in order."""
        joined, self.joined = self.joined, []
        return joined

    def take_notices(self, workers: Iterable[plans.WorkerId]) -> set[plans.WorkerId]:
        """The preemption notices of `workers`, now handled."""
        noticed = self.notices & set(workers)
        self.notices -= noticed
        return noticed

    def notice(self, workers: Iterable[plans.WorkerId]) -> None:
        """Preemption notices of `workers` to handle (again) at the next pass."""
        self.notices |= set(workers)

    def mark_slow(self, late: Iterable[plans.WorkerId], now: float) -> None:
        """Of the workers a recovery counted failed for not stopping in time, the live ones
        are only slow: they return once their heartbeat shows them stopped (`returned`)."""
        self.slow = set(late) - self.gone(late, now)

    def returned(self, now: float, held: Iterable[plans.WorkerId] = ()) -> set[plans.WorkerId]:
        """Workers live now but not at the previous call (heard again after a silence), and
        slow workers now stopped; of them, those not `held` (by the running plan)."""
        live = self.live(now)
        stopped = {
            w
            for w in self.slow & live
            if (b := self.beats.get(w)) is not None and b.state in SETTLED
        }
        self.slow -= stopped
        returned = (live - self.was_live) | stopped
        self.was_live = live
        return returned - set(held)

    def arrive_again(self, workers: Iterable[plans.WorkerId]) -> None:
        """`workers` were taken in by a planned switch that was never made (the plan before it
        is back): those live at the next `returned` arrive again, so a scale-up is tried anew."""
        self.was_live -= set(workers)

    def abandon(self, workers: Iterable[plans.WorkerId], epoch: int) -> None:
        """`workers` accepted the Configure of `epoch`, a planned switch then given up: each
        sets it up until its rendezvous times out (`setting_up`)."""
        self.abandoned.update(dict.fromkeys(workers, epoch))

    def setting_up(self, workers: Iterable[plans.WorkerId], before: int) -> set[plans.WorkerId]:
        """Those of `workers` still setting up an epoch older than `before`: their heartbeat
        says CONFIGURING or TRANSFERRING there, or they accepted an abandoned switch and have
        not reported it yet. An agent takes a newer Configure up only once that set-up ends,
        and a set-up whose peers never come ends at its rendezvous timeout (torch's
        `init_process_group` watches no failure flag)."""
        busy = set()
        for w in workers:
            beat, epoch = self.beats.get(w), self.abandoned.get(w)
            if epoch is not None and (beat is None or beat.epoch < epoch):
                busy.add(w)  # its heartbeat lags the Configure it accepted
            elif beat is not None and beat.epoch < before and beat.state in SETTING_UP:
                busy.add(w)
            else:
                self.abandoned.pop(w, None)
        return busy

    def live(self, now: float) -> set[plans.WorkerId]:
        """Connected workers neither dead, faulty nor silent."""
        return {
            w
            for w in self.generation
            if w not in self.dead and w not in self.faulty and not self.silent(w, now)
        }

    def silent(self, worker: plans.WorkerId, now: float) -> bool:
        return now - self.beat_at.get(worker, now) > self.heartbeat_timeout_s

    def gone(self, workers: Iterable[plans.WorkerId], now: float) -> set[plans.WorkerId]:
        """Those of `workers` that are dead, faulty or silent."""
        return {w for w in workers if w in self.dead or w in self.faulty or self.silent(w, now)}

    def beat(self, worker: plans.WorkerId, epoch: int) -> messages.Heartbeat | None:
        """`worker`'s heartbeat as it counts for `epoch`: one of that epoch, or of an earlier
        one while the worker runs on towards a planned switch; older ones are stale."""
        beat = self.beats.get(worker)
        if beat is None or beat.epoch > epoch:
            return None
        if beat.epoch == epoch or worker in self.switching:
            return beat
        return None

    def failed_in(self, workers: Collection[plans.WorkerId], epoch: int) -> set[plans.WorkerId]:
        """Those of `workers` whose heartbeat for `epoch` reports FAILED."""
        return {
            w
            for w in workers
            if (b := self.beat(w, epoch)) is not None and b.state is messages.AgentState.FAILED
        }

    def latched(self, workers: Iterable[plans.WorkerId], epoch: int) -> set[messages.ErrorKind]:
        """The kinds of errors `workers` latched in `epoch`."""
        beats = (self.beat(w, epoch) for w in workers)
        return {e.kind for b in beats if b is not None for e in b.errors}

    def errors(
        self, workers: Iterable[plans.WorkerId], epoch: int, kinds: Collection[messages.ErrorKind]
    ) -> list[tuple[plans.WorkerId, messages.LatchedError]]:
        """The errors of `kinds` that `workers` latched in `epoch`, by worker id."""
        return [
            (w, e)
            for w in sorted(workers)
            if (b := self.beat(w, epoch)) is not None
            for e in b.errors
            if e.kind in kinds
        ]

    def own_faults(self, workers: Iterable[plans.WorkerId], epoch: int) -> set[plans.WorkerId]:
        """Workers that latched an error of their own (not a lost peer) in `epoch`."""
        return {
            w
            for w in workers
            if (b := self.beat(w, epoch)) is not None
            and any(e.kind in OWN_FAULTS for e in b.errors)
        }

    def committed(self, workers: Iterable[plans.WorkerId], epoch: int) -> list[int]:
        """The last committed steps of `workers` that reported for `epoch`."""
        beats = (self.beat(w, epoch) for w in workers)
        return [b.last_committed_step for b in beats if b is not None]

    def checkpoint_step(self, workers: Iterable[plans.WorkerId]) -> int | None:
        """The newest persistent checkpoint any of `workers` reported complete (None when none
        did). An agent reports the newest step every member of its plan wrote a part of, and
        keeps its parts from that step on (`planaria.agent.state.checkpoints`), so the newest
        report, even a dead worker's last, names a step that loads; the oldest could be pruned."""
        steps = [b.checkpoint_step for w in workers if (b := self.beats.get(w)) is not None]
        return max((s for s in steps if s is not None), default=None)

    def snapshot_interval(self, workers: Iterable[plans.WorkerId]) -> float | None:
        """The widest achieved snapshot interval (mean steps between the snapshots begun this
        epoch) any of `workers` reports: the job's, since a snapshot needs every worker's part.
        None while none has begun two yet."""
        intervals = [
            b.snapshot.achieved_interval_steps for w in workers if (b := self.beats.get(w))
        ]
        return max((i for i in intervals if i > 0), default=None)

    def snapshot_step(
        self, workers: Iterable[plans.WorkerId], at_most: int | None = None
    ) -> int | None:
        """The newest host-memory snapshot step, at or before `at_most` when given, that every
        one of `workers` reports holding complete in its store (`SnapshotState.held`, issue
        #20); None when they share none or one has not reported. Reports that list nothing
        held (agents from before `held`) give the oldest of the latest steps, as before."""
        beats = [self.beats.get(w) for w in workers]
        if not beats or any(b is None for b in beats):
            return None
        snaps = [b.snapshot for b in beats if b is not None]
        if not all(s.held for s in snaps):
            latest = [s.latest_step for s in snaps]
            oldest = None if None in latest else min(s for s in latest if s is not None)
            return oldest if oldest is None or at_most is None or oldest <= at_most else None
        common = set.intersection(*({h.step for h in s.held} for s in snaps))
        return max((s for s in common if at_most is None or s <= at_most), default=None)

    def digest_conflicts(
        self, workers: Iterable[plans.WorkerId], step: int
    ) -> dict[tuple[int, int], dict[str, tuple[plans.WorkerId, ...]]]:
        """(layer, member) -> digest -> the workers reporting it, for every member of the
        snapshot of `step` that two of `workers` report with different digests. A member's
        holder and its mirror keep the same files (issue #20), so their digests must agree;
        a disagreement means one copy is not what was snapshotted."""
        seen: dict[tuple[int, int], dict[str, list[plans.WorkerId]]] = {}
        for worker in sorted(workers):
            beat = self.beats.get(worker)
            held = [h for h in beat.snapshot.held if h.step == step] if beat is not None else []
            for member in held[0].members if held else ():
                key = (member.layer, member.member)
                seen.setdefault(key, {}).setdefault(member.digest, []).append(worker)
        return {
            key: {d: tuple(ws) for d, ws in sorted(digests.items())}
            for key, digests in sorted(seen.items())
            if len(digests) > 1
        }
