"""Epochs: what opens one, and the mechanics of opening it and watching it run.

`configs`: one `WorkerConfig` per worker of the plan. The epoch's process group is exactly the
plan's workers, ranked by worker id (`planaria.contract.configure_rules.ranks`: the agents
form their groups and judge every Configure by the same rules), under the key prefix "epoch-E"
of the backend's store (`planaria.contract.rendezvous.key_prefix`); the group's collectives
time out after the job's `step_timeout_s`. Each worker receives only the transfers it takes part in.

`Driver`: the current epoch (plan, number, resume step) and the two halves of opening the
next: `configure` (journal the epoch, then every Configure at once, each bounded; running agents
of a planned switch first, since they must accept before they pass the switch step) and
`commit` (wait, bounded, until every worker runs in the epoch). A `ports.Journal` records every
epoch before its Configures go out, so that a successor controller can adopt it
(`planaria.control.adoption`); a write is retried JOURNAL_ATTEMPTS times, and a failure is
logged only: the epoch opens anyway. Workers that refuse, or never run in time, are marked
faulty in the roster; a death on the way ends the wait early. Deciding what to open is the
controller's; this is only how.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from planaria.contract import configure_rules, rendezvous
from planaria.contract import plan as plans
from planaria.contract import profile as profiles
from planaria.control import connections, history, membership, planning, ports
from planaria.control import settings as job_settings
from planaria.control import status as statuses
from planaria.wire import messages

LOG = logging.getLogger(__name__)
JOURNAL_ATTEMPTS = 3  # a journal write is retried this often before the epoch opens anyway
JOURNAL_RETRY_S = 0.2
_RAN = (messages.AgentState.RUNNING, messages.AgentState.FINISHED)


def configs(
    *,
    epoch: int,
    plan: plans.Plan,
    transfers: Iterable[plans.LayerTransfer],
    resume_step: int,
    job: job_settings.JobSettings,
    store: ports.StoreAddress,
) -> dict[plans.WorkerId, messages.WorkerConfig]:
    """The Configure of every worker of `plan` for `epoch` (module docstring)."""
    taking_part = by_worker(transfers)
    ranked = configure_rules.ranks(plan.workers)
    return {
        worker: messages.WorkerConfig(
            epoch=epoch,
            worker=worker,
            plan=plan,
            resume_step=resume_step,
            rendezvous=messages.Rendezvous(
                store_host=store.host,
                store_port=store.port,
                key_prefix=rendezvous.key_prefix(epoch),
                rank=rank,
                world_size=len(ranked),
                backend=job.backend,
                timeout_s=job.step_timeout_s,
            ),
            transfers=tuple(taking_part.get(worker, ())),
            settings=job.training,
            stop_step=max(job.steps, resume_step),
        )
        for worker, rank in ranked.items()
    }


def by_worker(
    transfers: Iterable[plans.LayerTransfer],
) -> dict[plans.WorkerId, list[plans.LayerTransfer]]:
    """The copies each worker takes part in (as destination or a source), in the given order.

    One pass over the copies: time linear in their total size. Filtering every copy for every
    worker was quadratic: a scale-up at 1,024 x 8 (208,624 copies) took seconds per worker.
    A copy's destination is never one of its sources and its sources do not repeat
    (`LayerTransfer`), so no copy is listed twice for one worker.
    """
    found: dict[plans.WorkerId, list[plans.LayerTransfer]] = {}
    for transfer in transfers:
        found.setdefault(transfer.destination, []).append(transfer)
        for source in transfer.sources:
            found.setdefault(source, []).append(transfer)
    return found


@dataclass(frozen=True, slots=True, kw_only=True)
class Opened:
    """An epoch as it was opened: its number, plan, the kind of move that made the plan, and
    the step it resumes after."""

    epoch: int
    plan: plans.Plan
    kind: statuses.MoveKind
    resume_step: int


class Driver:
    """The current epoch and how the next one is opened (module docstring)."""

    def __init__(
        self,
        job: job_settings.JobSettings,
        *,
        store: ports.StoreAddress,
        fail_epoch: Callable[[str, int], None],
        clock: ports.Clock,
        roster: membership.Roster,
        lines: connections.Connections,
        record: history.History,
        journal: ports.Journal | None = None,
    ) -> None:
        self._job = job
        self._journal = journal
        self._store = store
        self._fail_epoch = fail_epoch
        self._clock = clock
        self._roster = roster
        self._lines = lines
        self._history = record
        self.plan: plans.Plan | None = None
        self.kind = statuses.MoveKind.INITIAL
        self.epoch = 0  # the epoch of `plan`: its heartbeats are the ones that count
        self.resume_step = 0
        self._opened = 0  # the latest epoch number given out (epochs only ever grow)
        self._previous: Opened | None = None  # the epoch before a planned switch
        self.planned = False  # the current epoch is a planned switch
        self.refused: set[plans.WorkerId] = set()  # who refused the last epoch's Configure

    @property
    def next_epoch(self) -> int:
        """The number the next epoch opened will have."""
        return self._opened + 1

    def beats(self) -> list[messages.Heartbeat]:
        """The current epoch's heartbeats of the plan's workers."""
        if self.plan is None:
            return []
        beats = (self._roster.beat(w, self.epoch) for w in self.plan.workers)
        return [b for b in beats if b is not None and b.epoch == self.epoch]

    async def next(self, timeout_s: float) -> None:
        """Wait (bounded) for news, take it in, and record the progress: of the previous
        epoch too while its workers train on towards a planned switch."""
        await self._lines.next(timeout_s)
        previous = self._previous
        if self._roster.switching and previous is not None:
            self._observe(previous.plan, previous.epoch, previous.resume_step)
        if self.plan is not None:
            self._observe(self.plan, self.epoch, self.resume_step)

    async def hear_everyone(self) -> None:
        """Take in what arrived, then wait (at most a heartbeat timeout) until every connected
        worker was heard within the timeout: after a long wait of the controller's own (a
        profile, a predecessor's exit) the roster must not read its queue's age as silence."""
        deadline = self._clock.monotonic() + self._job.heartbeat_timeout_s
        await self.next(0)
        while (now := self._clock.monotonic()) < deadline:
            connected = set(self._lines.agents) - set(self._roster.dead)
            fresh = {w for w in connected if not self._roster.silent(w, now)}
            if fresh == connected and connected <= set(self._roster.beats):
                return
            await self.next(min(self._job.heartbeat_interval_s, deadline - now))

    def _observe(self, plan: plans.Plan, epoch: int, resume_step: int) -> None:
        beats = (self._roster.beats.get(w) for w in plan.workers)
        self._history.observe(
            [b for b in beats if b is not None and b.epoch == epoch],
            epoch=epoch,
            resume_step=resume_step,
            live_workers=len(plan.workers),
            now=self._clock.monotonic(),
        )

    def current_step(self) -> int:
        """The newest step committed in the current epoch (0 before any)."""
        if self.plan is None:
            return 0
        return max(self._roster.committed(self.plan.workers, self.epoch), default=0)

    def step_s(self) -> float:
        return self._history.step_s(self.epoch, self.beats())

    def finished(self) -> bool:
        """Every worker of the plan finished the job's last step in this epoch, or in the older
        one it trains on towards a switch (`Roster.beat`): after a planned switch given up
        (`fall_back`) the epoch number is the switch's, the workers' heartbeats the old one's."""
        if self.plan is None:
            return False
        beats = (self._roster.beat(w, self.epoch) for w in self.plan.workers)
        done = [
            b
            for b in beats
            if b is not None
            and b.state is messages.AgentState.FINISHED
            and b.last_committed_step >= self._job.steps
        ]
        return len(done) == len(self.plan.workers)

    def abandon(self) -> None:
        """Flag the current epoch failed in the store (and the one before a planned switch,
        whose workers may not have reached it): every worker still waiting in a step of it
        stops at once (a worker declared lost or hung cannot be waited for)."""
        running = [] if self.plan is None else [(self.epoch, self.plan)]
        if self._previous is not None:
            running.append((self._previous.epoch, self._previous.plan))
        for epoch, plan in running:
            self._fail_epoch(rendezvous.key_prefix(epoch), len(plan.workers))

    def broken(self, now: float) -> bool:
        """Some worker of the plan is gone or failed in this epoch."""
        if self.plan is None:
            return False
        workers = self.plan.workers
        return bool(self._roster.gone(workers, now) or self._roster.failed_in(workers, self.epoch))

    def adopt(self, record: ports.EpochRecord, *, newest: int) -> None:
        """Take over `record`'s epoch, opened by an earlier controller, without a Configure:
        its workers' heartbeats count from now on. `newest` is the highest epoch any agent
        reports; the next epoch opened is above both, so no agent refuses it as stale."""
        self._previous = None
        self.planned = False
        self.plan, self.kind = record.plan, record.kind
        self.epoch, self.resume_step = record.epoch, record.resume_step
        self._opened = max(self._opened, record.epoch, newest)

    async def configure(
        self, move: planning.Move, resume_step: int, *, planned: bool, profile: profiles.Profile
    ) -> bool:
        """Make `move` epoch E+1 resuming after `resume_step`, journal it (`profile`: the
        planner's) and send its Configures; False when some worker refused or was unreachable
        (it is faulty or dead in the roster)."""
        if self._journal is not None:
            entry = ports.EpochRecord(
                epoch=self.next_epoch,
                plan=move.plan,
                kind=move.kind,
                resume_step=resume_step,
                profile=profile,
                transfers=move.transfers,
                planned=planned,
            )
            await self._record(self._journal, entry)
        running = set(self.plan.workers) if planned and self.plan is not None else set()
        self._previous = self._opened_now()
        self.planned = planned
        self._opened += 1
        self.epoch = self._opened
        sent = configs(
            epoch=self.epoch,
            plan=move.plan,
            transfers=move.transfers,
            resume_step=resume_step,
            job=self._job,
            store=self._store,
        )
        self._roster.switch(running & set(sent))
        self.plan, self.kind, self.resume_step = move.plan, move.kind, resume_step
        first = {w: c for w, c in sent.items() if w in running}
        then = {w: c for w, c in sent.items() if w not in running}
        refused = await self._configure_all(first) | await self._configure_all(then)
        self._roster.give_up(refused)
        self.refused = refused
        return not refused

    async def commit(self) -> bool:
        """Wait until every worker of the epoch runs in it, bounded by the time to reach the
        resume step plus the Configure and step timeouts; True when they all do. Workers not
        running by the bound are faulty; a death or failure on the way ends the wait. What
        queued while the controller was busy (the Configure round, the search ahead) is taken
        in first: a heartbeat not yet read is not silence."""
        assert self.plan is not None, "committing needs a plan"
        await self.next(0)
        workers, epoch = self.plan.workers, self.epoch
        current = max(self._roster.committed(workers, epoch), default=self.resume_step)
        ahead_s = max(0, self.resume_step - current) * self.step_s()
        deadline = self._clock.monotonic() + ahead_s + self._job.configure_timeout_s
        deadline += self._job.step_timeout_s
        while True:
            now = self._clock.monotonic()
            if self._roster.gone(workers, now) or self._roster.failed_in(workers, epoch):
                return False
            late = self.not_running()
            if not late:
                self._roster.switch(())
                return True
            if now >= deadline:
                LOG.warning("workers %s never ran in epoch %d", sorted(late), epoch)
                self._roster.give_up(late)
                return False
            await self.next(min(self._job.heartbeat_interval_s, deadline - now))

    def switch_missed(self) -> bool:
        """The current epoch is a planned switch that no worker made: none ran in it, none
        committed the switch step in the old one (their old group broke first). A worker
        that set the switch up but still waits for its group does not count."""
        if not self.planned or self.plan is None or self._previous is None:
            return False
        workers = {*self.plan.workers, *self._previous.plan.workers}
        beats = [b for w in workers if (b := self._roster.beats.get(w)) is not None]
        ran = any(b.epoch == self.epoch and b.state in _RAN for b in beats)
        reached = any(
            b.epoch < self.epoch and b.last_committed_step >= self.resume_step for b in beats
        )
        return not (ran or reached)

    def flag_switch(self) -> None:
        """Flag the current epoch, a planned switch about to be given up (before `fall_back`),
        failed: the workers that accepted it and wait to form it leave at once, rather than at
        their rendezvous timeout (`planaria.contract.rendezvous`)."""
        assert self.planned and self.plan is not None, "only a planned switch is given up"
        self._fail_epoch(rendezvous.key_prefix(self.epoch), len(self.plan.workers))

    def fall_back(self) -> plans.Plan:
        """Make the plan before a missed switch current again: it is what the workers hold.
        The epoch number stays; the previous plan's workers' heartbeats count whether they
        are of the old epoch or of the switch's (an agent may set up the switch it accepted
        after its old group broke, short of the switch step)."""
        previous = self._previous
        assert self.planned and previous is not None, "only a planned switch falls back"
        self.plan, self.kind, self.planned = previous.plan, previous.kind, False
        self.resume_step = previous.resume_step
        self._roster.switch(previous.plan.workers)
        return previous.plan

    def _opened_now(self) -> Opened | None:
        if self.plan is None:
            return None
        return Opened(
            epoch=self.epoch, plan=self.plan, kind=self.kind, resume_step=self.resume_step
        )

    async def _record(self, journal: ports.Journal, entry: ports.EpochRecord) -> None:
        for attempt in range(1, JOURNAL_ATTEMPTS + 1):
            try:
                await journal.record(entry)
                return
            except Exception as exc:  # an adapter's I/O: the job goes on (module docstring)
                LOG.warning("epoch %d not journalled (try %d): %s", entry.epoch, attempt, exc)
            await self._clock.sleep(JOURNAL_RETRY_S)

    async def _configure_all(
        self, sent: dict[plans.WorkerId, messages.WorkerConfig]
    ) -> set[plans.WorkerId]:
        answers = await asyncio.gather(*(self._configure(c) for c in sent.values()))
        return {w for w, accepted in zip(sent, answers, strict=True) if not accepted}

    async def _configure(self, config: messages.WorkerConfig) -> bool:
        agent = self._lines.agents.get(config.worker)
        if agent is None:
            return False
        try:
            ack = await connections.bounded(
                self._clock, agent.configure(config), self._job.configure_timeout_s
            )
        except (ports.AgentUnreachable, connections.Unbounded) as exc:
            LOG.warning("worker %d: Configure of epoch %d: %s", config.worker, config.epoch, exc)
            self._roster.lost(config.worker, self._clock.monotonic())
            return False
        if not ack.accepted:
            LOG.warning("worker %d refused epoch %d: %s", config.worker, config.epoch, ack.reason)
        return ack.accepted

    def not_running(self) -> set[plans.WorkerId]:
        """The workers of the current plan not (yet) training in the current epoch."""
        if self.plan is None:
            return set()
        return {w for w in self.plan.workers if not self._running_in(w, self.epoch)}

    def _running_in(self, worker: plans.WorkerId, epoch: int) -> bool:
        beat = self._roster.beat(worker, epoch)
        return beat is not None and beat.epoch == epoch and beat.state in _RAN
