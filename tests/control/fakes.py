"""In-memory implementations of the controller's ports, for its tests: a cluster of fake agents
that keep the agents' protocol (interfaces: Configure rules, lockstep steps with a commit
barrier, recovery tiers, snapshots and checkpoints) on the controller's clock.

The clock is the shipped `clock.RealClock`; the tests run it on looptime's virtual-time loop
(`scenarios` module docstring), so the simulated seconds cost no real time.

    FakeCluster   a `ports.Backend`: starts FakeAgents, hosts a (pretend) store, reports events;
                  steps every epoch's group every `step_s` simulated seconds; the test injects
                  deaths (`kill`), hangs, latched errors (in a step, or at every set-up
                  of a worker: `setup_errors`), preemption notices and joins; with
                  `report_held`, the agents list their held snapshots with one digest per
                  member (holder's and mirror's copies alike) and `damage` makes one copy
                  report another digest.
    FakeAgent     a `ports.Agent`: Watch heartbeats every interval, Configure judged by the
                  contract's rules (`planaria.contract.configure_rules`), as the real agent's
                  runtime does; tests/contract runs one suite against both. A Configure that
                  comes during a set-up is held until the set-up ends, whose rendezvous waits
                  (up to the epoch's timeout) for peers that never set the epoch up; `join`'s
                  `cold_s` makes a fresh agent's first set-up longer.

The cluster records what a test checks: every Configure sent per epoch (ranks), and every
lockstep violation (members of a group at different steps).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from planaria.contract import configure_rules, profile, rendezvous, snapshot_placement
from planaria.contract import plan as plans
from planaria.control import ports
from planaria.planner import transfers
from planaria.wire import messages

RUNNING = messages.AgentState.RUNNING
CONFIGURING = messages.AgentState.CONFIGURING
FAILED = messages.AgentState.FAILED


@dataclass(slots=True, kw_only=True)
class FakeAgent:
    """One worker's agent in the fake cluster (module docstring)."""

    cluster: FakeCluster
    id: plans.WorkerId
    alive: bool = True
    hung: bool = False
    stalls: bool = False  # Configure never answers (a wedged RPC)
    slow_until: float | None = None  # until then it does not notice a lost peer (`slow`)
    set_up_at: float = 0.0  # its set-up ends then (`FakeCluster.setup_s`)
    cold_s: float = 0.0  # its first set-up takes this much longer (`FakeCluster.join`)
    set_up_epochs: set[int] = field(default_factory=set)  # the epochs it began to set up
    device: str = "cpu"  # what it runs on (the rules refuse settings for another device)
    profiling: bool = False  # a Profile is being measured
    epoch: int = 0
    state: messages.AgentState = messages.AgentState.IDLE
    step: int = 0
    held: frozenset[int] = frozenset()
    config: messages.WorkerConfig | None = None
    pending: messages.WorkerConfig | None = None
    errors: tuple[messages.LatchedError, ...] = ()
    setup: messages.EpochSetup | None = None
    waiting_since: float | None = None
    checkpoint_step: int | None = None
    received: list[messages.WorkerConfig] = field(default_factory=list)
    beats: int = 0  # heartbeats the controller's Watch took from it
    # what it held before its latest set-up, (layers, step): a failed set-up keeps it
    before_set_up: tuple[frozenset[int], int] = (frozenset(), 0)

    @property
    def worker(self) -> plans.WorkerId:
        return self.id

    # -- the Agent port --------------------------------------------------------------------

    async def configure(self, config: messages.WorkerConfig) -> messages.Acknowledgement:
        self._reachable()
        if self.stalls:
            await asyncio.Event().wait()  # forever: only the caller's bound ends it
        await self.cluster.clock.sleep(self.cluster.configure_delay_s)
        self.received.append(config)
        self.cluster.sent.setdefault(config.epoch, []).append(config)
        verdict = configure_rules.judge(offer(config), self.receiver())
        if not verdict.accepted:
            return refuse(verdict.reason)
        if verdict.timing is configure_rules.Timing.AT_STEP:
            self.pending = config  # taken up at its resume step (`FakeCluster._commit`)
        elif self.state is CONFIGURING:
            # the runtime's one thread is in the set-up under way (its rendezvous waits up to
            # the epoch's timeout): this one is taken up once that set-up ends
            self.pending = config
        else:
            self.cluster.set_up(self, config)
        return messages.Acknowledgement(accepted=True)

    def receiver(self) -> configure_rules.Receiver:
        """This agent as the contract's rules see it."""
        return configure_rules.Receiver(
            worker=self.id,
            device=self.device,
            newest_epoch=max(self.epoch, self.pending.epoch if self.pending else 0),
            running_step=self.step if self.state is RUNNING else None,
            stopping=self.state is messages.AgentState.STOPPED,
            profiling=self.profiling,
        )

    async def watch(self, interval_s: float) -> AsyncIterator[messages.Heartbeat]:
        while True:
            self._reachable()
            if self.state is messages.AgentState.STOPPED:
                return
            if not self.hung:
                self.beats += 1
                yield self.heartbeat()
            await self.cluster.clock.sleep(interval_s)

    async def pause(self, epoch: int) -> messages.Acknowledgement:
        self._reachable()
        return refuse("pause is not simulated")

    async def resume(self, epoch: int) -> messages.Acknowledgement:
        self._reachable()
        return refuse("resume is not simulated")

    async def stop(self, grace_s: float) -> messages.Acknowledgement:
        self._reachable()
        self.state = messages.AgentState.STOPPED
        return messages.Acknowledgement(accepted=True)

    async def profile(self, order: messages.ProfileOrder) -> profile.Profile:
        self._reachable()
        assert self.cluster.profile is not None, "the test gave the cluster no profile"
        self.profiling = True
        try:
            await self.cluster.clock.sleep(self.cluster.profile_s)
        finally:
            self.profiling = False
        return self.cluster.profile

    async def load_snapshot(self, load: messages.SnapshotLoad) -> messages.Acknowledgement:
        self._reachable()
        return refuse("load_snapshot is not simulated")

    async def close(self) -> None:
        return None

    # -- simulation ------------------------------------------------------------------------

    def _reachable(self) -> None:
        if not self.alive:
            raise ports.AgentUnreachable(self.id, "connection refused")

    def heartbeat(self) -> messages.Heartbeat:
        snap = self.cluster.shm.get(self.id)
        batch = self.config.settings.global_batch_size if self.config else 0
        return messages.Heartbeat(
            worker=self.id,
            epoch=self.epoch,
            state=self.state,
            last_committed_step=self.step,
            loss=5.0 / (1 + self.step) if self.step else None,
            samples_processed=self.step * batch,
            timings=messages.Timings(step_s=self.cluster.step_s),
            snapshot=messages.SnapshotState(
                latest_step=snap[0] if snap else None,
                held_bytes=1 if snap else 0,
                held=self.cluster.held(self.id) if self.cluster.report_held else (),
            ),
            errors=self.errors,
            setup=self.setup,
            checkpoint_step=self.checkpoint_step,
        )

    def latch(self, kind: messages.ErrorKind, message: str) -> None:
        # a failed set-up keeps a Configure that came meanwhile, as the runtime does
        if self.cluster.drop_pending_on_failure and self.state is not CONFIGURING:
            self.pending = None
        self.state = FAILED
        self.waiting_since = None
        self.errors = (
            *self.errors,
            messages.LatchedError(kind=kind, message=message, step=self.step),
        )


def refuse(reason: str) -> messages.Acknowledgement:
    return messages.Acknowledgement(accepted=False, reason=reason)


def offer(config: messages.WorkerConfig) -> configure_rules.Offer:
    """What the contract's rules read of `config` (as the agent's `acceptance.offer`)."""
    return configure_rules.Offer(
        epoch=config.epoch,
        worker=config.worker,
        resume_step=config.resume_step,
        device=str(config.settings.device),
    )


class FakeCluster:
    """`ports.Backend` over FakeAgents in simulated time (module docstring).

    `peer_snapshots`: a lost layer can be rebuilt from the snapshot stores (redundancy) when
    some live worker snapshotted it at the resume step (a dead one's store is gone with it);
    False models redundancy NONE.
    `drop_pending_on_failure`: an agent whose step fails forgets a planned switch it accepted;
    False keeps it, so the agent then sets the switch's epoch up short of its step and latches
    SNAPSHOT_UNAVAILABLE (what the agent runtime does at the time of writing).
    `setup_errors`: {worker: (kind, message)} that the worker latches at every set-up instead of
    running (a corpus it cannot read, a device it lacks); a test may change it as the run goes.
    `report_held`: heartbeats list the snapshots each store holds (`SnapshotState.held`, issue
    #20), with one digest per member, the same at its holder and at its mirror unless `damage`d.
    `setup_s`: how long every set-up takes (a cold start on a loaded machine): the agent stays
    CONFIGURING that long and notices a lost peer only after it, as the agent's watcher starts
    once the epoch is set up: it shows RUNNING for a tick, then its step fails.
    """

    def __init__(
        self,
        clock: ports.Clock,
        *,
        step_s: float = 0.1,
        profile: profile.Profile | None = None,
        profile_s: float = 0.0,
        configure_delay_s: float = 0.0,
        peer_snapshots: bool = True,
        drop_pending_on_failure: bool = True,
        setup_errors: dict[int, tuple[messages.ErrorKind, str]] | None = None,
        report_held: bool = False,
        setup_s: float = 0.0,
    ) -> None:
        self.clock = clock
        self.step_s = step_s
        self.profile = profile
        self.profile_s = profile_s  # how long an agent's Profile takes
        self.configure_delay_s = configure_delay_s  # a Configure's way to the agent (load)
        self.peer_snapshots = peer_snapshots
        self.drop_pending_on_failure = drop_pending_on_failure
        self.setup_errors = dict(setup_errors or {})
        self.agents: dict[plans.WorkerId, FakeAgent] = {}
        self.shm: dict[plans.WorkerId, tuple[int, frozenset[int]]] = {}
        # The store's other slot: the snapshot before the latest (REFT's double buffer).
        self.shm_previous: dict[plans.WorkerId, tuple[int, frozenset[int]]] = {}
        self.report_held = report_held
        self.setup_s = setup_s
        # (worker, step) -> the (layer, member) pairs that snapshot holds, own and mirrored
        self.members: dict[tuple[plans.WorkerId, int], frozenset[tuple[int, int]]] = {}
        self.damaged: set[tuple[plans.WorkerId, int, int]] = set()  # (worker, layer, member)
        self.checkpoints: set[int] = set()
        self.sent: dict[int, list[messages.WorkerConfig]] = {}
        self.violations: list[str] = []
        self.shut = False
        self.failed_epochs: list[tuple[str, int]] = []  # fail_epoch's calls, in order
        self._flagged: set[str] = set()  # the key prefixes of the epochs flagged failed
        self.on_step: Callable[[int], None] | None = None
        self._events: asyncio.Queue[ports.WorkerEvent | None] = asyncio.Queue()
        self._ticker: asyncio.Task[None] | None = None

    # -- the Backend port ------------------------------------------------------------------

    @property
    def store(self) -> ports.StoreAddress:
        return ports.StoreAddress(host="127.0.0.1", port=29500)

    def fail_epoch(self, key_prefix: str, world_size: int) -> None:
        self.failed_epochs.append((key_prefix, world_size))
        self._flagged.add(key_prefix)
        self._given_up()

    async def start(self, workers: Sequence[plans.WorkerId]) -> None:
        for worker in workers:
            self.agents.setdefault(worker, FakeAgent(cluster=self, id=worker))
        if self._ticker is None:
            self._ticker = asyncio.ensure_future(self._tick())

    async def connect(self, worker: plans.WorkerId, timeout_s: float) -> ports.Agent:
        agent = self.agents.get(worker)
        if agent is None or not agent.alive:
            raise ports.AgentUnreachable(worker, "not started")
        return agent

    async def events(self) -> AsyncIterator[ports.WorkerEvent]:
        while (event := await self._events.get()) is not None:
            yield event

    async def shutdown(self) -> None:
        self.shut = True
        self._events.put_nowait(None)
        if self._ticker is not None:
            self._ticker.cancel()
        for agent in self.agents.values():
            agent.state = messages.AgentState.STOPPED

    # -- what tests inject -----------------------------------------------------------------

    def kill(self, worker: int, *, report: bool = True) -> None:
        """The worker's process dies; the backend reports it unless `report` is False."""
        self.agent(worker).alive = False
        if report:
            event = ports.WorkerEvent(kind=ports.EventKind.DIED, worker=plans.WorkerId(worker))
            self._events.put_nowait(event)

    def hang(self, worker: int) -> None:
        """The worker stops stepping and heartbeating; its stream stays open."""
        self.agent(worker).hung = True

    def slow(self, worker: int, seconds: float) -> None:
        """For `seconds` the worker keeps heartbeating RUNNING in its epoch without noticing
        a lost peer (an agent blocked in a set-up or a collective), then stops as usual."""
        self.agent(worker).slow_until = self.clock.monotonic() + seconds

    def fail_set_up(self, worker: int, kind: messages.ErrorKind, message: str) -> None:
        """The worker's set-up under way fails late (a layer copy that timed out once its
        group formed): it holds what it held before (a fresh agent: nothing, step 0)."""
        agent = self.agent(worker)
        agent.held, agent.step = agent.before_set_up
        agent.latch(kind, message)

    def notice(self, worker: int) -> None:
        self._events.put_nowait(
            ports.WorkerEvent(kind=ports.EventKind.PREEMPTION_NOTICE, worker=plans.WorkerId(worker))
        )

    def join(self, worker: int, *, cold_s: float = 0.0) -> None:
        """A fresh agent process for `worker` (its host-memory store survives) is up; its
        first set-up takes `cold_s` longer (a fresh process's first torch work, under load)."""
        worker_id = plans.WorkerId(worker)
        self.agents[worker_id] = FakeAgent(cluster=self, id=worker_id, cold_s=cold_s)
        self._events.put_nowait(ports.WorkerEvent(kind=ports.EventKind.JOINED, worker=worker_id))

    def agent(self, worker: int) -> FakeAgent:
        return self.agents[plans.WorkerId(worker)]

    # -- the simulation --------------------------------------------------------------------

    def set_up(self, agent: FakeAgent, config: messages.WorkerConfig) -> None:
        """Set `agent` up for `config`: find each layer's state, cheapest tier first."""
        agent.pending, agent.errors, agent.waiting_since = None, (), None
        agent.epoch, agent.config = config.epoch, config
        agent.set_up_epochs.add(config.epoch)
        agent.set_up_at = self.clock.monotonic() + self.setup_s + agent.cold_s
        agent.cold_s = 0.0
        if agent.id in self.setup_errors:  # the layers stay as they were
            agent.latch(*self.setup_errors[agent.id])
            return
        roles = transfers.roles(config.plan).get(agent.id, frozenset())
        tiers = []
        for layer in sorted(roles):
            tier = self._tier(agent, config, layer)
            if tier is None:  # the layers stay at the last committed step
                agent.latch(messages.ErrorKind.SNAPSHOT_UNAVAILABLE, f"layer {layer}: no tier")
                return
            tiers.append(tier)
        received = sum(t.destination == agent.id for t in config.transfers)
        agent.setup = messages.EpochSetup(
            epoch=config.epoch,
            tier=max(tiers, key=messages.TIER_ORDER.index, default=messages.RecoveryTier.KEPT),
            regroup_s=0.01,
            transfer_s=0.002 * received,
            received_bytes=1000 * received,
        )
        agent.before_set_up = (agent.held, agent.step)
        agent.held, agent.step, agent.state = roles, config.resume_step, CONFIGURING

    def _tier(
        self, agent: FakeAgent, config: messages.WorkerConfig, layer: int
    ) -> messages.RecoveryTier | None:
        step = config.resume_step
        copies = [t for t in config.transfers if t.destination == agent.id and t.layer == layer]
        own = self.shm.get(agent.id)
        if step == 0:
            return messages.RecoveryTier.INITIAL
        if (
            layer in agent.held
            and agent.step == step
            and agent.state is not messages.AgentState.IDLE
        ):
            return messages.RecoveryTier.KEPT
        if copies and all(self.agents[s].alive for s in copies[0].sources):
            return messages.RecoveryTier.LIVE_REPLICA
        older = self.shm_previous.get(agent.id)
        if any(o is not None and o[0] == step and layer in o[1] for o in (own, older)):
            return messages.RecoveryTier.LOCAL_SNAPSHOT
        # Only live workers serve their pieces (issue #20): a dead one's store is gone with it.
        stores = (*self.shm.items(), *self.shm_previous.items())
        slots = [slot for w, slot in stores if slot is not None and self.agents[w].alive]
        if self.peer_snapshots and any(s == step and layer in ls for s, ls in slots):
            return messages.RecoveryTier.PEER_SNAPSHOT
        if step in self.checkpoints:
            return messages.RecoveryTier.CHECKPOINT
        return None

    def damage(self, worker: plans.WorkerId, layer: int, member: int) -> None:
        """`worker`'s copy of `layer`'s member `member` is no longer what was snapshotted: it
        reports another digest for it in every snapshot it holds (needs `report_held`)."""
        self.damaged.add((worker, layer, member))

    def held(self, worker: plans.WorkerId) -> tuple[messages.HeldSnapshot, ...]:
        """What `worker`'s store holds, newest first, as its heartbeat lists it: a member's
        digest depends on the step, the layer and the member only, as equal files give equal
        digests, unless `damage`d on this worker."""
        slots = [self.shm.get(worker), self.shm_previous.get(worker)]
        steps = sorted({slot[0] for slot in slots if slot is not None}, reverse=True)
        return tuple(
            messages.HeldSnapshot(
                step=step,
                digest=f"fake:{worker}:{step}",
                members=tuple(
                    messages.MemberDigest(
                        layer=layer,
                        member=k,
                        digest=f"fake:{step}:{layer}:{k}"
                        + (":damaged" if (worker, layer, k) in self.damaged else ""),
                    )
                    for layer, k in sorted(self.members.get((worker, step), frozenset()))
                ),
            )
            for step in steps
        )

    def _snapshot_members(
        self, agent: FakeAgent, config: messages.WorkerConfig
    ) -> frozenset[tuple[int, int]]:
        """The (layer, member) pairs of `agent`'s snapshot: its own members and those it
        mirrors (`snapshot_placement`)."""
        groups = snapshot_placement.sharding_groups(config.plan)
        own = {(layer, groups[layer].index(agent.id)) for layer in agent.held}
        if not self.peer_snapshots:
            return frozenset(own)
        return frozenset(own | set(snapshot_placement.mirrored_by(config.plan, agent.id).items()))

    def _mirrored(self, agent: FakeAgent, config: messages.WorkerConfig) -> frozenset[int]:
        """The layers `agent` keeps as a mirror of another node's member (issue #20), when the
        cluster has snapshot redundancy."""
        if not self.peer_snapshots:
            return frozenset()
        return frozenset(snapshot_placement.mirrored_by(config.plan, agent.id))

    def _given_up(self) -> None:
        """Agents training in or setting up an epoch flagged failed stop (PEER_LOST), as an
        agent's watcher releases its waits; a hung one notices once it goes on, a slow one or
        one still in its set-up (its watcher starts after it) once that is over."""
        now = self.clock.monotonic()
        for agent in self.agents.values():
            training = agent.state in (RUNNING, CONFIGURING)
            blocked = agent.set_up_at > now or (
                agent.slow_until is not None and now < agent.slow_until
            )
            if agent.alive and not (agent.hung or blocked) and training and self._in_flagged(agent):
                agent.latch(messages.ErrorKind.PEER_LOST, f"epoch {agent.epoch} was given up")

    def _in_flagged(self, agent: FakeAgent) -> bool:
        return rendezvous.key_prefix(agent.epoch) in self._flagged

    async def _tick(self) -> None:
        while True:
            await self.clock.sleep(self.step_s)
            self._given_up()
            for agent in self.agents.values():  # a kept planned switch is taken at once
                if agent.alive and agent.pending is not None and agent.state is FAILED:
                    self.set_up(agent, agent.pending)
            epochs = {a.epoch for a in self.agents.values() if a.alive and a.config is not None}
            for epoch in sorted(epochs):
                self._advance(epoch)

    def _members(self, epoch: int) -> list[FakeAgent]:
        """The agents of `epoch`'s plan (whatever state they are in), or none."""
        here = [a for a in self.agents.values() if a.alive and a.epoch == epoch and a.config]
        if not here or here[0].config is None:
            return []
        return [self.agents[w] for w in sorted(here[0].config.plan.workers)]

    def _advance(self, epoch: int) -> None:
        """One step time of epoch `epoch`'s group: form it, break it, or commit a step."""
        members = self._members(epoch)
        if not members:
            return
        active = [
            a
            for a in members
            if a.alive and a.epoch == epoch and a.state in (RUNNING, CONFIGURING) and not a.hung
        ]
        if len(active) < len(members):
            self._short(epoch, members, active)
            return
        if any(a.set_up_at > self.clock.monotonic() for a in active):
            return  # some member still sets the epoch up: the others wait for it
        for agent in active:
            agent.state, agent.waiting_since = RUNNING, None
        if len({a.step for a in active}) > 1:
            self.violations.append(f"epoch {epoch}: steps {[a.step for a in active]}")
        self._commit(active)

    def _short(self, epoch: int, members: list[FakeAgent], active: list[FakeAgent]) -> None:
        """Some member is not there: gone for good (the others lose a peer) or not yet (they
        wait, up to the epoch's timeout). One that moved on to a later epoch without ever
        setting this one up (it refused it) never came: a rendezvous notices no more than that."""
        gone = [
            a
            for a in members
            if not a.alive
            or (a.epoch > epoch and epoch in a.set_up_epochs)
            or (a.epoch == epoch and a.state not in (RUNNING, CONFIGURING))
        ]
        now = self.clock.monotonic()
        for agent in active:
            config = agent.config
            assert config is not None
            if gone:
                if agent.set_up_at > now:
                    continue  # still setting up: it notices once set up
                if agent.state is CONFIGURING and self.setup_s:
                    agent.state = RUNNING  # set up: its step fails a tick later
                    continue
                if agent.slow_until is None or now >= agent.slow_until:
                    agent.latch(messages.ErrorKind.PEER_LOST, f"peer {gone[0].id} lost")
                continue
            if agent.set_up_at > now:
                continue  # its rendezvous, and the wait for its peers, begin once set up
            agent.waiting_since = agent.waiting_since if agent.waiting_since is not None else now
            if now - agent.waiting_since > config.rendezvous.timeout_s:
                agent.latch(messages.ErrorKind.TIMEOUT, "a peer did not answer in time")

    def _commit(self, group: list[FakeAgent]) -> None:
        for agent in group:
            config = agent.config
            assert config is not None
            if config.stop_step is not None and agent.step >= config.stop_step:
                agent.state = messages.AgentState.FINISHED
                continue
            agent.step += 1
            settings = config.settings
            if (
                settings.snapshot_interval_steps
                and agent.step % settings.snapshot_interval_steps == 0
            ):
                if agent.id in self.shm:
                    self.shm_previous[agent.id] = self.shm[agent.id]
                self.shm[agent.id] = (agent.step, agent.held | self._mirrored(agent, config))
                if self.report_held:
                    self.members[agent.id, agent.step] = self._snapshot_members(agent, config)
            every = settings.checkpoint_interval_steps
            if settings.checkpoint_dir and every and agent.step % every == 0:
                self.checkpoints.add(agent.step)
                agent.checkpoint_step = agent.step
            pending = agent.pending
            if pending is not None and configure_rules.due(pending.resume_step, agent.step):
                self.set_up(agent, pending)
        if self.on_step is not None and group:
            self.on_step(max(a.step for a in group))
