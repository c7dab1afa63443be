"""The runtime's training-thread state: epochs, layers and steps, and the epoch's writers.

`Training` owns everything torch touches and is used from one thread only (the runtime's
training thread); `planaria.agent.runtime.runtime` wraps it with commands, states and heartbeats.

Steps: committed step t (t = 1, 2, ...) trains the sampler's global batch t - 1, exactly as the
reference trainer's `step(t - 1)` does (`snapshot_writer`: "after the reference trainer's
step(i) it is i + 1"), so the executor's own step numbers, which are sampler indices, are one
less than the contract's.

Snapshots and checkpoints: after committed step t that is due (every
`snapshot_interval_steps`, or asked for by TakeSnapshot), the epoch's writers begin its
snapshot (the copy into staging buffers); the executor hook releases it right before the next
step's first OptimizerStep (before the commit barrier), waiting only for that copy, not for
the checksums and writes, and (RECOMPUTE) replays that step's moment update on the writer's
host replicas. The time spent in both places is the step's `snapshot_s`. When the writer is
busy with an earlier snapshot at a step's commit barrier (every worker's flag is summed there),
a due one is skipped by every worker and taken later (the interval stretches;
`snapshot_achieved_interval_steps`); `snapshot_confirmed_step` is the newest snapshot known
complete on every worker, which the heartbeat reports while training. The writers, and the
checkpoint started once a snapshot is complete, are `epoch_writers`.

A failed step sets the epoch's failure keys in the controller's store
(`planaria.contract.rendezvous`) and releases the epoch's transport (`groups.Epoch.release`);
every other worker's watcher (`epoch_watch`) wakes on its key and releases its own, so every
survivor fails its step within milliseconds of the first one that noticed the death, point to
point waits included, instead of at the epoch's timeout (the controller sets the same keys when
it declares a worker lost or hung). Leaving an epoch closes its writers first, which makes their
pending snapshot complete (the roll-back tiers rely on it).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch._C import _distributed_c10d as c10d  # the store classes (see groups.py)

from planaria.agent.execution import executor, groups
from planaria.agent.recovery import epoch_setup, snapshot_mirrors
from planaria.agent.runtime import epoch_watch, epoch_writers
from planaria.agent.state import snapshot_store, snapshot_writer, staging
from planaria.agent.training import corpora, model, semantics
from planaria.contract import instructions, plan, rendezvous, shapes
from planaria.wire import messages

LOG = logging.getLogger(__name__)
Op = instructions.Op
COMMUNICATION = (Op.SEND_ACTIVATION, Op.RECV_ACTIVATION, Op.SEND_GRAD, Op.RECV_GRAD)


@dataclass(frozen=True, slots=True, kw_only=True)
class Committed:
    """One committed step: its number, the step's loss (every worker's share summed by the
    commit barrier) and where the time went."""

    step: int
    loss: float | None
    timings: messages.Timings


def training_config(
    settings: messages.TrainingSettings, micro_batch: int, vocab_size: int | None = None
) -> semantics.TrainingConfig:
    """The reference's configuration of a job's settings and a plan's micro-batch size; a
    tokenizer's `vocab_size` (`corpora.Corpus`) replaces the model shape's."""
    opt = settings.optimizer
    shape = shapes.resolve(settings.model)
    return semantics.TrainingConfig(
        shape=shape if vocab_size is None else replace(shape, vocab_size=vocab_size),
        seed=settings.seed,
        global_batch_size=settings.global_batch_size,
        micro_batch_size=micro_batch,
        optimizer=model.OptimizerConfig(
            lr=opt.lr, beta1=opt.beta1, beta2=opt.beta2, eps=opt.eps, weight_decay=opt.weight_decay
        ),
        reduction=settings.reduction,
        precision=settings.precision,
    )


class Training:
    """One worker's training state across epochs (single-threaded; see the module docstring)."""

    def __init__(
        self,
        *,
        worker: plan.WorkerId,
        job: str,
        snapshot_base: Path,
        device: str,
        hook: executor.Hook | None = None,
    ) -> None:
        self.worker, self.job_name, self.base, self.device = worker, job, snapshot_base, device
        self.store = snapshot_store.SnapshotStore(
            snapshot_store.store_root(job, worker, snapshot_base)
        )
        self.holding = epoch_setup.Holding(layers=None, step=0)
        self.config: messages.WorkerConfig | None = None
        self.epoch: groups.Epoch | None = None
        self._checkpoint_step: int | None = None  # as the last epoch's writers left it
        self._confirmed: int | None = None  # likewise (`snapshot_confirmed_step`)
        self._extra_hook = hook
        # One copier for every epoch's writers: their staging buffers (pinned on a GPU) are
        # allocated once and handed from one epoch's writer to the next (`staging`).
        self._copier = staging.copier_for(torch.device(device))
        self._executor: executor.Executor | None = None
        self._writers: epoch_writers.EpochWriters | None = None
        self._corpora: dict[messages.DataSettings, corpora.Corpus] = {}
        self._stores: dict[tuple[str, int], c10d.Store] = {}
        self._snapshot_s = 0.0
        self._hooked = False  # the step's first OptimizerStep has been seen
        self._flag: c10d.Store | None = None  # the worker's store client, epoch-prefixed
        self._watcher: epoch_watch.Watcher | None = None
        # Set from another thread (a Stop's grace ran out): the step's collectives give up.
        self.abandon_requested = False

    def abandon(self) -> None:
        """Give up the step in flight (from another thread: a Stop's grace ran out): its
        polled collectives stop, and releasing the epoch's transport ends its point-to-point
        waits and its peers' waits on it at once."""
        self.abandon_requested = True
        epoch = self.epoch
        if epoch is not None:
            epoch.release()

    @property
    def step(self) -> int:
        return self.holding.step

    @property
    def snapshot_in_progress(self) -> bool:
        """Whether a snapshot is being written (safe to read from any thread)."""
        writers = self._writers
        return writers is not None and writers.in_progress

    @property
    def checkpoint_step(self) -> int | None:
        """The newest persistent checkpoint a resume can load (None before the first)."""
        writers = self._writers
        return self._checkpoint_step if writers is None else writers.checkpoint_step

    # --- epochs ---------------------------------------------------------------------------

    def set_up(self, config: messages.WorkerConfig) -> messages.EpochSetup:
        """Leave the current epoch and set up `config`'s (epoch_setup.SetupError, ValueError)."""
        self.end_epoch()
        job = self._job(config)
        stores = epoch_setup.Stores(own=self.store, checkpoint_dir=config.settings.checkpoint_dir)
        try:
            ready = epoch_setup.set_up(
                config=config,
                job=job,
                holding=self.holding,
                stores=stores,
                store=self._store_client(config.rendezvous),
                device=self.device,
            )
        except BaseException:
            # The store may be the cause (its controller died, and a successor may listen at
            # the same address: an operator container restarted in its pod): connect afresh.
            self._stores.clear()
            raise
        self.epoch, self.config = ready.epoch, config
        self.holding = epoch_setup.Holding(layers=ready.layers, step=config.resume_step)
        prefix = config.rendezvous.key_prefix
        self._flag = flag = c10d.PrefixStore(prefix, self._store_client(config.rendezvous))
        self._watcher = watcher = epoch_watch.Watcher(
            lambda: epoch_setup.connect_store(config.rendezvous), prefix, ready.epoch, flag
        )
        try:
            self._executor = executor.Executor(
                job=job,
                sched=ready.sched,
                worker=self.worker,
                epoch=ready.epoch,
                layers=ready.layers,
                abandoned=lambda: self.abandon_requested or watcher.failed.is_set(),
                barrier_flag=self._busy_flag,
            )
        except BaseException:
            self.end_epoch()
            raise
        self._open_writers(config)
        return ready.report

    def end_epoch(self, *, failed: bool = False) -> None:
        """Finish pending snapshots, close the writers and leave the epoch's groups; after a
        failed step, flag the epoch failed and release its transport first, so that every
        peer's waits end at once (module docstring) and leaving does not wait on a collective
        still in flight."""
        epoch, self.epoch, self._executor = self.epoch, None, None
        flag, self._flag = self._flag, None
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.stop()
        if flag is not None and epoch is not None and failed:
            rendezvous.flag_failed(flag, epoch.world_size, f"worker {self.worker}")
        if epoch is not None and failed:
            epoch.release()
        self._close_writers()
        if epoch is not None:
            groups.leave_epoch(epoch)

    # --- steps ----------------------------------------------------------------------------

    def run_step(self) -> Committed:
        """Train and commit the next step (failures.StepError when it aborts)."""
        assert self._executor is not None and self.holding.layers is not None
        t = self.holding.step + 1
        self._snapshot_s, self._hooked = 0.0, False
        result = self._executor.run_step(t - 1, before=self._hook)
        self.holding = epoch_setup.Holding(layers=self.holding.layers, step=t)
        if self._writers is not None:
            self._writers.barrier(t, result.barrier_flags)
        self._after_commit(t, forced=False)
        seconds = result.seconds
        timings = messages.Timings(
            forward_s=seconds[Op.FORWARD],
            backward_s=seconds[Op.BACKWARD],
            communication_s=sum(seconds[op] for op in COMMUNICATION) + result.send_wait_s,
            allreduce_s=seconds[Op.ALL_REDUCE],
            optimizer_s=seconds[Op.OPTIMIZER_STEP],
            snapshot_s=self._snapshot_s,
            step_s=result.step_s,
        )
        return Committed(step=t, loss=result.step_loss, timings=timings)

    def _hook(self, step: int, index: int, op: instructions.Instruction) -> None:
        if isinstance(op, instructions.OptimizerStep) and not self._hooked:
            self._hooked = True
            with self._timed():
                self._release_snapshot()
                self._recompute(step + 1)
        if self._extra_hook is not None:
            self._extra_hook(step, index, op)

    def _recompute(self, t: int) -> None:
        writers, layers = self._writers, self.holding.layers
        if writers is not None and layers is not None:
            writers.recompute(t, layers)

    # --- snapshots and checkpoints --------------------------------------------------------

    def snapshot_now(self) -> bool:
        """Snapshot the committed step now (TakeSnapshot) and wait for it; False at step 0."""
        if self.holding.step == 0 or self._writers is None:
            return False
        self.finish_snapshot()
        self._after_commit(self.holding.step, forced=True)
        self.finish_snapshot()
        return True

    def _busy_flag(self) -> float:
        writers = self._writers
        return 0.0 if writers is None else writers.busy_flag()

    @property
    def snapshot_confirmed_step(self) -> int | None:
        """The newest snapshot step known complete on every worker of the current (or last)
        epoch (`epoch_writers`; 0: none), None before the first epoch; safe from any thread."""
        writers = self._writers
        return self._confirmed if writers is None else writers.confirmed

    @property
    def snapshot_achieved_interval_steps(self) -> float:
        """Mean steps between this epoch's snapshots (0.0 before two; safe from any thread)."""
        writers = self._writers
        return 0.0 if writers is None else writers.achieved_interval_steps

    def finish_snapshot(self) -> None:
        """Wait until the pending snapshot is complete; start a due checkpoint from it."""
        if self._writers is not None:
            self._writers.finish_snapshot()

    def _release_snapshot(self) -> None:
        """Wait until the pending snapshot no longer reads the live state (not its writes)."""
        if self._writers is not None:
            self._writers.release()

    def poll_checkpoint(self, *, wait: bool = False) -> None:
        """Record a finished background checkpoint (wait for it when `wait`)."""
        if self._writers is not None:
            self._writers.poll_checkpoint(wait=wait)

    def _after_commit(self, t: int, *, forced: bool) -> None:
        writers, layers = self._writers, self.holding.layers
        if writers is None or layers is None:
            return
        if forced or writers.due(t):
            last = self.config is not None and t == self.config.stop_step
            with self._timed():
                writers.begin(t, layers, forced=forced, last=last)

    def load_snapshot(self, step: int) -> None:
        """Replace every held layer with its state at `step` from the snapshot tiers."""
        layers, config = self.holding.layers, self.config
        assert layers is not None and config is not None
        self.finish_snapshot()
        stores = epoch_setup.Stores(own=self.store, checkpoint_dir="")  # own store only
        locator = epoch_setup.Locator(
            job=self._job(config),
            holding=epoch_setup.Holding(layers=None, step=-1),
            stores=stores,
            step=step,
        )
        states = {i: locator.state(i) for i in layers.indices}
        for i, state in states.items():
            model.load_layer_state(i, layers.modules[i], layers.optimizers[i], state)
        self.holding = epoch_setup.Holding(layers=layers, step=step)

    def _open_writers(self, config: messages.WorkerConfig) -> None:
        settings = config.settings
        opt = training_config(settings, config.plan.micro_batch_size).optimizer
        self._writers = epoch_writers.EpochWriters(
            store=self.store,
            worker=self.worker,
            config=config,
            writer=snapshot_writer.WriterConfig(
                job=self.job_name,
                worker=self.worker,
                redundancy=settings.redundancy,
                interval_steps=1,
                optimizer=opt,
            ),
            checkpoint_step=self._checkpoint_step,
            copier=self._copier,
            mirrors=self._mirrors(config),
        )
        if self.holding.layers is not None:
            self._writers.reserve(self.holding.layers)

    def _mirrors(self, config: messages.WorkerConfig) -> snapshot_mirrors.Link | None:
        """The snapshot mirrors' link over this epoch's host-bytes group, on any backend (None:
        no epoch, no redundancy or one worker)."""
        if self.epoch is None:
            return None
        redundancy = config.settings.redundancy
        return snapshot_mirrors.link_for(
            self.epoch, config.plan, self.worker, self.job_name, redundancy
        )

    def _close_writers(self) -> None:
        writers = self._writers
        if writers is None:
            return
        writers.close()
        self._checkpoint_step = writers.checkpoint_step
        self._confirmed = writers.confirmed
        self._writers = None

    @contextlib.contextmanager
    def _timed(self) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self._snapshot_s += time.perf_counter() - started

    # --- job and store --------------------------------------------------------------------

    def _job(self, config: messages.WorkerConfig) -> semantics.Job:
        settings = config.settings
        corpus = self._corpora.get(settings.data)
        if corpus is None:
            corpus = corpora.load(settings.data)
            self._corpora = {settings.data: corpus}
        micro_batch = config.plan.micro_batch_size
        return semantics.Job.from_tokens(
            training_config(settings, micro_batch, corpus.vocab_size), corpus.tokens
        )

    def _store_client(self, rendezvous: messages.Rendezvous) -> c10d.Store:
        key = (rendezvous.store_host, rendezvous.store_port)
        if key not in self._stores:
            self._stores.clear()  # one controller at a time: an older store's client goes
            try:
                self._stores[key] = epoch_setup.connect_store(rendezvous)
            except RuntimeError as exc:  # torch's DistNetworkError: the store did not answer
                # A regroup timeout, as when a peer does not come (the controller retries the
                # epoch), not this worker's own fault (INTERNAL: one retry, then the job fails);
                # seen under heavy load, where the store's accept came late.
                raise epoch_setup.RegroupError(
                    f"the rendezvous store at {key[0]}:{key[1]} did not answer within "
                    f"{rendezvous.timeout_s:g} s: {str(exc).splitlines()[0]}"
                ) from exc
        return self._stores[key]

    def close(self) -> None:
        self.end_epoch()
