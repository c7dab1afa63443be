"""Setting up one epoch on one worker: regroup, then find every layer's state at resume_step.

The order (interfaces: "Setup of an epoch"): leave the old epoch's groups (the caller does, with
its snapshot writers closed so their last snapshot is complete), form the new epoch's groups
(`groups.form_epoch`, rank = position in the plan's sorted workers), then for every layer of
this worker's stage find its state AT STEP resume_step, cheapest tier first:

    KEPT            held, at resume_step: the module and its AdamW are reused as they are
    LIVE_REPLICA    a transfer names this worker as its destination: receive the bytes from
                    the listed sources (`layer_transfer`)
    LOCAL_SNAPSHOT  this worker's own store alone rebuilds the layer at resume_step (a
                    restarted agent process, or a roll-back from resume_step + 1)
    PEER_SNAPSHOT   the sharding group's members' pieces of the step, fetched over the
                    epoch's process group from the workers that hold them and verified on
                    arrival (`snapshot_exchange`), plus this worker's own, rebuild it with
                    copies or parity (`snapshots.rebuild_layer`); never other workers' files
    CHECKPOINT      the persistent checkpoint of resume_step (`checkpoints.load_checkpoint`)
    INITIAL         resume_step == 0: built from the seed

A layer this worker sends (it is a source of a transfer) is found the same way, without the
LIVE_REPLICA tier: a source that was one step ahead rolls back before it sends. The peer tier
needs one exchange round of every rank (`snapshot_exchange.exchange`): after KEPT and the own
store are tried, each rank says which layers it still wants, and the holders send their pieces
before the layer copies start (a source may need them). A checksum failure makes a snapshot
tier unusable (the store's reader, and the receiver of a peer's piece, verify every file) and
the next tier is tried. When none works, SnapshotUnavailableError names what each tier said.

The result is a new `HeldLayers` of exactly the stage's layers and an `messages.EpochSetup`
with the costliest tier used, seconds per part and bytes copied. Nothing the worker held is
changed on failure, so a later epoch can still use it.

Errors (the runtime latches them, state FAILED):

    SetupError                kind says how the controller should read it
    ├── RegroupError          the new epoch's rendezvous failed (TIMEOUT)
    ├── GivenUpError          the epoch was flagged failed before every rank came to form it
    │                         (PEER_LOST: a member failed or left, or the controller gave
    │                         the epoch up; no wait ran out)
    ├── TransferFailedError   a peer died or stalled during the copies or the snapshot
    │                         exchange (PEER_LOST)
    └── SnapshotUnavailableError  no tier holds a layer at resume_step (SNAPSHOT_UNAVAILABLE)
"""

from __future__ import annotations

import contextlib
import datetime
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch._C import _distributed_c10d as c10d  # the store classes (see groups.py)

from planaria.agent.execution import groups, held_layers
from planaria.agent.recovery import cold_start, layer_transfer, snapshot_exchange
from planaria.agent.state import checkpoints, snapshot_store, snapshots
from planaria.agent.training import model, semantics
from planaria.contract import plan, schedule
from planaria.contract import rendezvous as epoch_keys
from planaria.wire import messages

Tier = messages.RecoveryTier
STORE_TIMEOUT_S = 60.0  # the store client's own timeout; epochs use the rendezvous's timeout_s


class SetupError(Exception):
    """An epoch could not be set up; `kind` is what the heartbeat reports."""

    kind = messages.ErrorKind.INTERNAL


class RegroupError(SetupError):
    kind = messages.ErrorKind.TIMEOUT


class GivenUpError(SetupError):
    """The epoch was given up before it formed (`groups.EpochGivenUpError`): classed as a lost
    peer, as a step released by the same flag is (`planaria.agent.execution.failures`)."""

    kind = messages.ErrorKind.PEER_LOST


class TransferFailedError(SetupError):
    kind = messages.ErrorKind.PEER_LOST

    def __init__(self, message: str, *, peer: plan.WorkerId | None) -> None:
        super().__init__(message)
        self.peer = peer


class SnapshotUnavailableError(SetupError):
    kind = messages.ErrorKind.SNAPSHOT_UNAVAILABLE


@dataclass(frozen=True, slots=True, kw_only=True)
class Holding:
    """What a worker holds between epochs: its layers (None: nothing) at committed `step`."""

    layers: held_layers.HeldLayers | None
    step: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Stores:
    """Where the local tiers look: this worker's own store and the persistent checkpoints
    (peers' stores are reached only through `snapshot_exchange`)."""

    own: snapshot_store.SnapshotStore
    checkpoint_dir: str


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Ready:
    """A set-up epoch: its groups, schedule, layers at resume_step and the setup report."""

    epoch: groups.Epoch
    sched: schedule.Schedule
    layers: held_layers.HeldLayers
    report: messages.EpochSetup


def connect_store(rendezvous: messages.Rendezvous) -> c10d.Store:
    """A client of the controller's rendezvous store (unprefixed: `form` and the failure flag
    add their prefixes). Connecting is bounded by the rendezvous's timeout: torch retries a
    refused connection for twice the client's timeout, and a store that died with its
    controller must not keep the agent from the successor's next epoch for minutes. The
    client's own operations then wait up to STORE_TIMEOUT_S."""
    connect = datetime.timedelta(seconds=min(STORE_TIMEOUT_S, rendezvous.timeout_s))
    store = c10d.TCPStore(rendezvous.store_host, rendezvous.store_port, None, False, connect)
    store.set_timeout(datetime.timedelta(seconds=STORE_TIMEOUT_S))
    return store


def form(
    config: messages.WorkerConfig, store: c10d.Store, sched: schedule.Schedule
) -> groups.Epoch:
    """Join the config's epoch (groups.form_epoch adds the `epoch-N` prefix itself; any other
    prefix the controller chose is put in front of it)."""
    rendezvous = config.rendezvous
    if rendezvous.key_prefix != epoch_keys.key_prefix(config.epoch):
        store = c10d.PrefixStore(rendezvous.key_prefix, store)
    try:
        return groups.form_epoch(
            store,
            config.epoch,
            rendezvous.rank,
            rendezvous.world_size,
            rendezvous.backend,
            rendezvous.timeout_s,
            subgroups=groups.subgroup_ranks(sched),
        )
    except groups.EpochGivenUpError as exc:
        raise GivenUpError(str(exc)) from exc
    except groups.EpochFormationError as exc:
        raise RegroupError(str(exc)) from exc


def set_up(
    *,
    config: messages.WorkerConfig,
    job: semantics.Job,
    holding: Holding,
    stores: Stores,
    store: c10d.Store,
    device: str,
) -> Ready:
    """Form the epoch and acquire its layers (see the module docstring); SetupError on failure,
    after leaving the epoch it formed."""
    sched = schedule.compile_schedule(config.plan)
    # A fresh process's first torch work (`cold_start`) and the templates of the layers this
    # worker receives come before the rendezvous, while the peers of a planned switch still
    # train towards it, not after it while they wait with the epoch's timeout to send.
    cold_start.warm_up()
    templates = _templates(config, job)
    started = time.perf_counter()
    epoch = form(config, store, sched)
    regroup_s = time.perf_counter() - started
    try:
        return _acquire(config, job, holding, stores, device, epoch, sched, regroup_s, templates)
    except BaseException:
        groups.leave_epoch(epoch)
        raise


def _acquire(
    config: messages.WorkerConfig,
    job: semantics.Job,
    holding: Holding,
    stores: Stores,
    device: str,
    epoch: groups.Epoch,
    sched: schedule.Schedule,
    regroup_s: float,
    templates: dict[int, model.LayerState],
) -> Ready:
    me, step = config.worker, config.resume_step
    mine = sched.stream(me).layers
    incoming = [t for t in config.transfers if t.destination == me]
    outgoing = [t for t in config.transfers if t.destination != me]
    received = {t.layer for t in incoming}
    locator = Locator(job=job, holding=holding, stores=stores, step=step)
    started = time.perf_counter()
    needed = [i for i in mine if i not in received] + [t.layer for t in outgoing]
    peers = _exchange(epoch, sched, step, locator.wanted(needed), stores.own)
    locator.peers = peers
    local = {i: locator.find(i) for i in mine if i not in received}
    sent = {t.layer: locator.state(t.layer) for t in outgoing}
    load_s = time.perf_counter() - started
    try:
        moved = layer_transfer.run_transfers(
            worker=me,
            transfers=config.transfers,
            sources=sent,
            templates=templates,
            epoch=epoch,
            ranks=groups.worker_ranks(sched),
        )
    except layer_transfer.TransferError as exc:
        raise TransferFailedError(str(exc), peer=exc.peer) from exc
    tiers = {i: found[0] for i, found in local.items()} | dict.fromkeys(received, Tier.LIVE_REPLICA)
    states = {i: found[1] for i, found in local.items()} | moved.received
    layers = _assemble(job, holding, device, mine, tiers, states)
    report = messages.EpochSetup(
        epoch=config.epoch,
        tier=costliest(tiers.values()),
        regroup_s=regroup_s,
        transfer_s=moved.seconds,
        load_s=load_s,
        received_bytes=moved.received_bytes + peers.received_bytes,
        sent_bytes=moved.sent_bytes + peers.sent_bytes,
    )
    return Ready(epoch=epoch, sched=sched, layers=layers, report=report)


def _templates(config: messages.WorkerConfig, job: semantics.Job) -> dict[int, model.LayerState]:
    """Each layer `config` has this worker receive, as built (`layer_transfer.fill` overwrites
    every byte of it)."""
    c = job.config
    return {
        t.layer: model.initial_state(c.shape, c.seed, t.layer, c.optimizer)
        for t in config.transfers
        if t.destination == config.worker
    }


def _exchange(
    epoch: groups.Epoch,
    sched: schedule.Schedule,
    step: int,
    wanted: list[int],
    own: snapshot_store.SnapshotStore,
) -> snapshot_exchange.Received:
    """The peer snapshot round (every rank takes part, so the condition depends only on the
    Configure): none at step 0, where nothing is snapshotted, or in a one-rank epoch."""
    if step == 0 or epoch.world_size == 1:
        return snapshot_exchange.Received()
    ranks = groups.worker_ranks(sched)
    workers = sorted(ranks, key=ranks.__getitem__)
    try:
        return snapshot_exchange.exchange(
            epoch=epoch, step=step, wanted=wanted, own=own, workers=workers
        )
    except snapshot_exchange.ExchangeError as exc:
        raise TransferFailedError(str(exc), peer=exc.peer) from exc


costliest = messages.costliest_tier  # the contract's own ordering of the tiers


def _assemble(
    job: semantics.Job,
    holding: Holding,
    device: str,
    mine: Iterable[int],
    tiers: dict[int, messages.RecoveryTier],
    states: dict[int, model.LayerState | None],
) -> held_layers.HeldLayers:
    """The new HeldLayers: kept modules reused, others built and loaded with their state."""
    config, target = job.config, torch.device(device)
    modules, optimizers = {}, {}
    for i in mine:
        if tiers[i] is Tier.KEPT:
            assert holding.layers is not None
            modules[i], optimizers[i] = holding.layers.modules[i], holding.layers.optimizers[i]
            continue
        state = states[i]
        # A layer restored from a tier needs no random init: its state overwrites every
        # parameter and the optimizer's moments.
        module = model.build_layer(config.shape, config.seed, i, target, initialise=state is None)
        optimizer = model.make_optimizer(module, config.optimizer)
        if state is not None:
            model.load_layer_state(i, module, optimizer, state)
        modules[i], optimizers[i] = module, optimizer
    return held_layers.HeldLayers(modules, optimizers, target)


class Locator:
    """Finds layers at `step` through every tier but LIVE_REPLICA. The peer tier serves what
    `peers` holds: the members' pieces the exchange round brought (none until it is set)."""

    def __init__(self, *, job: semantics.Job, holding: Holding, stores: Stores, step: int) -> None:
        self.job, self.holding, self.stores, self.step = job, holding, stores, step
        self.peers = snapshot_exchange.Received()
        self._checkpoint: dict[int, model.LayerState] | None = None
        self._local: dict[int, model.LayerState | str] = {}

    def wanted(self, layers: Iterable[int]) -> list[int]:
        """The layers among `layers` that neither KEPT nor this worker's own store serves at
        the step: what this worker asks its peers for (none at step 0)."""
        if self.step == 0:
            return []
        return sorted({i for i in layers if not self._kept(i) and self._own(i) is not None})

    def find(self, layer: int) -> tuple[messages.RecoveryTier, model.LayerState | None]:
        """The cheapest tier holding `layer` at the step, and its state (None: KEPT or
        INITIAL, which need no state); SnapshotUnavailableError when none does."""
        if self._kept(layer):
            return Tier.KEPT, None
        problems = []
        for tier, read in self._snapshot_tiers():
            try:
                return tier, read(layer)
            except (snapshot_store.SnapshotError, KeyError) as exc:
                problems.append(f"{tier.value}: {exc}")
        if self.step == 0:
            return Tier.INITIAL, None
        raise SnapshotUnavailableError(
            f"no tier holds layer {layer} at step {self.step} (held: step {self.holding.step}); "
            + "; ".join(problems)
        )

    def state(self, layer: int) -> model.LayerState:
        """`layer`'s state at the step, to send it to a peer."""
        tier, state = self.find(layer)
        if state is not None:
            return state
        if tier is Tier.KEPT:
            return _state_of(self.holding, layer)
        config = self.job.config  # INITIAL: as built
        return model.initial_state(config.shape, config.seed, layer, config.optimizer)

    def _kept(self, layer: int) -> bool:
        held = self.holding.layers
        return held is not None and layer in held.modules and self.holding.step == self.step

    def _own(self, layer: int) -> str | None:
        """Why this worker's own store alone cannot rebuild `layer` (None: it can; the state
        is kept for `find`)."""
        if layer not in self._local:
            try:
                own = snapshots.load_layer([self.stores.own], self.step, layer)
                self._local[layer] = own
            except (snapshot_store.SnapshotError, KeyError) as exc:
                self._local[layer] = str(exc)
        found = self._local[layer]
        return found if isinstance(found, str) else None

    def _from_own(self, layer: int) -> model.LayerState:
        problem = self._own(layer)
        if problem is not None:
            raise snapshot_store.SnapshotMissing(problem)
        found = self._local[layer]
        assert not isinstance(found, str)
        return found

    def _from_peers(self, layer: int) -> model.LayerState:
        """The layer rebuilt from the pieces peers sent and this worker's own member."""
        arrived = self.peers.members.get(layer, [])
        said = "; ".join(self.peers.problems.get(layer, [])) or "no peer sent a piece"
        if not arrived:
            raise snapshot_store.SnapshotMissing(said)
        members = list(arrived)
        # Without a usable member of its own here, the peers' members must do.
        with contextlib.suppress(snapshot_store.SnapshotError):
            members.append(snapshots.read_member(self.stores.own, self.step, layer))
        try:
            return snapshots.rebuild_layer(members)
        except snapshot_store.SnapshotError as exc:
            raise type(exc)(f"{exc} ({said})") from exc

    def _snapshot_tiers(
        self,
    ) -> Iterator[tuple[messages.RecoveryTier, Callable[[int], model.LayerState]]]:
        if self.step == 0:
            return
        yield Tier.LOCAL_SNAPSHOT, self._from_own
        yield Tier.PEER_SNAPSHOT, self._from_peers
        if self.stores.checkpoint_dir:
            yield Tier.CHECKPOINT, self._from_checkpoint

    def _from_checkpoint(self, layer: int) -> model.LayerState:
        if self._checkpoint is None:
            root = Path(self.stores.checkpoint_dir)
            self._checkpoint = checkpoints.load_checkpoint(root, self.step)
        if layer not in self._checkpoint:
            raise snapshot_store.SnapshotMissing(
                f"the checkpoint of step {self.step} has no layer {layer}"
            )
        return self._checkpoint[layer]


def _state_of(holding: Holding, layer: int) -> model.LayerState:
    assert holding.layers is not None
    layers = holding.layers
    return model.extract_layer_state(layer, layers.modules[layer], layers.optimizers[layer])
