"""The agent runtime: one worker's training thread, driven by the controller's commands.

The gRPC servicer (`planaria.agent.server.service`) calls a `Runtime` from its threads; every method
is thread-safe and returns at once, except `profile`. Commands only record a request under one
condition variable; the training thread (the only one touching torch state, through
`training_thread.Training`) takes them at step boundaries:

    IDLE --configure--> CONFIGURING (TRANSFERRING while layers are copied) --> RUNNING
    RUNNING --> FINISHED (committed stop_step; its snapshot complete)
            --> FAILED   (a latched error: the layers stay at the last committed step c)
            --> PAUSED   (pause; resume goes back to RUNNING)
    any     --stop--> STOPPED (the loop ends at the next boundary, the epoch is left)

Which commands are accepted in which state, and how the worker's own errors are classed, are
pure rules (`acceptance`; a Configure's are the contract's, `planaria.contract.configure_rules`,
which the controller's side shares). A RUNNING agent accepts only a planned switch,
`resume_step > c`: it trains up to resume_step, then sets the new epoch up
(`configure_rules.due`); any other state sets it up at once.
A configuration that arrives while another is being set up waits for that
setup to end (it fails within the epoch's timeout when a peer is gone), then replaces it.

The heartbeat is the agent's state as last published by the training thread: epoch, committed
step c and its loss (the whole step's loss: the commit barrier sums every worker's share),
samples processed (c x global batch), the last step's timings, the snapshot store's state, the
errors latched in this epoch, how the epoch was set up and the latest persistent checkpoint.

Errors never end the thread: a set-up's or a step's is latched (state FAILED) with the kind the
controller acts on, a peer's as the executor or the set-up classed it, the worker's own by
`acceptance.own_error` (docs/agent.md, "Errors").

Not here: the acceptance rules (`acceptance`), epoch setup and tiers (`epoch_setup`), layer
copies (`layer_transfer`), steps, snapshots and checkpoints (`training_thread`), gRPC
(`planaria.agent.server.service`).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
from pathlib import Path

from planaria.agent.execution import executor, failures, profiler
from planaria.agent.recovery import epoch_setup
from planaria.agent.runtime import acceptance, training_thread
from planaria.contract import configure_rules, plan, profile, shapes
from planaria.wire import messages

LOG = logging.getLogger(__name__)
State = messages.AgentState
PROFILE_WARMUP = 2


class RuntimeBusyError(ValueError):
    """A command that needs an idle agent came while it trains or sets up an epoch."""


class _Order(enum.Enum):
    STOP = "stop"
    CONFIGURE = "configure"
    STEP = "step"
    FINISH = "finish"
    SNAPSHOT = "snapshot"
    LOAD = "load"


class Runtime:
    """One worker's agent runtime (see the module docstring). `hook` runs before every
    instruction of every step on the training thread (failure injection in tests)."""

    def __init__(
        self,
        *,
        worker: plan.WorkerId,
        job: str,
        snapshot_base: Path,
        device: str = "cpu",
        hook: executor.Hook | None = None,
    ) -> None:
        self.worker, self.job, self.device = worker, job, device
        self._training = training_thread.Training(
            worker=worker, job=job, snapshot_base=snapshot_base, device=device, hook=hook
        )
        self._cond = threading.Condition()
        self._shown = acceptance.Published()
        self._pending: messages.WorkerConfig | None = None
        self._stop_step: int | None = None
        self._pause = self._stop = self._snapshot = self._profiling = False
        self._load: messages.SnapshotLoad | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._crashed = False  # the training thread failed (`crashed`)

    # --- commands (any thread) ------------------------------------------------------------

    def start(self) -> None:
        """Start the training thread (state IDLE until configured)."""
        with self._cond:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._loop, name=f"planaria-worker-{self.worker}", daemon=True
            )
            self._thread.start()

    def configure(self, config: messages.WorkerConfig) -> messages.Acknowledgement:
        """Accept `config` per the acceptance rules, or refuse it with the reason."""
        with self._cond:
            verdict = acceptance.configure_verdict(config, self._receiver())
            if not verdict.accepted:
                return messages.Acknowledgement(accepted=False, reason=verdict.reason)
            self._pending = config
            self._cond.notify_all()
        return messages.Acknowledgement(accepted=True)

    def _receiver(self) -> configure_rules.Receiver:
        """This agent as the Configure rules see it (the caller holds the lock)."""
        shown = self._shown
        pending = self._pending.epoch if self._pending else 0
        return configure_rules.Receiver(
            worker=self.worker,
            device=self.device,
            newest_epoch=max(shown.epoch, pending),
            running_step=shown.step if shown.state is State.RUNNING else None,
            stopping=shown.state is State.STOPPED or self._stop,
            profiling=self._profiling,
        )

    def heartbeat(self) -> messages.Heartbeat:
        """The agent's state now; the snapshots reported as of that state (read after it, so a
        FINISHED heartbeat never carries the confirmed step of the training it ended)."""
        with self._cond:
            shown = dataclasses.replace(self._shown)  # a copy: the training thread mutates it
        snapshot = self._snapshot_state(shown)
        return messages.Heartbeat(
            worker=self.worker,
            epoch=shown.epoch,
            state=shown.state,
            last_committed_step=shown.step,
            loss=shown.loss if shown.step else None,
            samples_processed=shown.step * shown.global_batch,
            timings=shown.timings,
            snapshot=snapshot,
            errors=shown.errors,
            setup=shown.setup,
            checkpoint_step=shown.checkpoint_step,
        )

    def pause(self, epoch: int) -> messages.Acknowledgement:
        """Hold at the next step boundary (state PAUSED)."""
        with self._cond:
            reason = acceptance.epoch_refusal(self._shown, epoch, (State.RUNNING, State.PAUSED))
            if reason:
                return messages.Acknowledgement(accepted=False, reason=reason)
            self._pause = True
            self._cond.notify_all()
        return messages.Acknowledgement(accepted=True)

    def resume(self, epoch: int) -> messages.Acknowledgement:
        """Go on training after a pause."""
        with self._cond:
            reason = acceptance.epoch_refusal(self._shown, epoch, (State.RUNNING, State.PAUSED))
            if reason:
                return messages.Acknowledgement(accepted=False, reason=reason)
            self._pause = False
            if self._shown.state is State.PAUSED:
                self._shown.state = State.RUNNING
            self._cond.notify_all()
        return messages.Acknowledgement(accepted=True)

    def stop(self, grace_s: float) -> messages.Acknowledgement:
        """End the loop at the next step boundary, leave the epoch and close the writers; then
        state STOPPED. A step still in flight after `grace_s` gives up: its collectives and
        point-to-point waits end at once (`Training.abandon`), and so do its peers'."""
        with self._cond:
            self._stop = True
            if self._thread is None:
                self._shown.state = State.STOPPED
                self._stopped.set()
            else:
                timer = threading.Timer(grace_s, self._abandon)
                timer.daemon = True
                timer.start()
            self._cond.notify_all()
        return messages.Acknowledgement(accepted=True)

    def _abandon(self) -> None:
        if not self._stopped.is_set():
            self._training.abandon()

    def take_snapshot(self, epoch: int) -> messages.Acknowledgement:
        """Snapshot the committed step at the next boundary, whatever the interval."""
        with self._cond:
            allowed = (State.RUNNING, State.PAUSED, State.FINISHED, State.FAILED)
            reason = acceptance.epoch_refusal(self._shown, epoch, allowed)
            if not reason and self._shown.step == 0:
                reason = "no step is committed yet; snapshots hold steps >= 1"
            if reason:
                return messages.Acknowledgement(accepted=False, reason=reason)
            self._snapshot = True
            self._cond.notify_all()
        return messages.Acknowledgement(accepted=True)

    def snapshot_state(self) -> messages.SnapshotState:
        """The host-memory snapshots this worker holds (the store is safe to read any time)."""
        with self._cond:
            shown = dataclasses.replace(self._shown)
        return self._snapshot_state(shown)

    def _snapshot_state(self, shown: acceptance.Published) -> messages.SnapshotState:
        """The snapshots as of `shown`, a published state read before the store is."""
        busy = self._snapshot or self._training.snapshot_in_progress
        # While training, only what is complete on every worker (`epoch_writers`); once
        # FINISHED every worker waited for its own last snapshot.
        finished = shown.state is State.FINISHED
        at_most = None if finished else self._training.snapshot_confirmed_step
        state = self._training.store.state(in_progress=busy, at_most=at_most)
        interval = self._training.snapshot_achieved_interval_steps
        return dataclasses.replace(state, achieved_interval_steps=interval)

    def load_snapshot(self, load: messages.SnapshotLoad) -> messages.Acknowledgement:
        """Load every held layer from the snapshots of `load.step` (PAUSED or FINISHED only)."""
        with self._cond:
            reason = acceptance.epoch_refusal(
                self._shown, load.epoch, (State.PAUSED, State.FINISHED)
            )
            if reason:
                return messages.Acknowledgement(accepted=False, reason=reason)
            self._load = load
            self._cond.notify_all()
        return messages.Acknowledgement(accepted=True)

    def profile(self, order: messages.ProfileOrder) -> profile.Profile:
        """Measure a profile (blocking); RuntimeBusyError unless the agent is idle."""
        with self._cond:
            if self._shown.state in (State.RUNNING, State.CONFIGURING, State.TRANSFERRING):
                raise RuntimeBusyError(
                    f"the agent is {self._shown.state.value}; profile it before configuring "
                    "or while it is paused"
                )
            if self._profiling or self._pending is not None:
                raise RuntimeBusyError("the agent is busy; profile it when it is idle")
            self._profiling = True
        try:
            shape = shapes.resolve(order.model)
            return profiler.measure_profile(
                shape,
                order.micro_batch_size,
                warmup=PROFILE_WARMUP,
                repeats=order.repeats,
                device=self.device,
                arithmetic=order.precision,
            )
        finally:
            with self._cond:
                self._profiling = False

    def wait_stopped(self, timeout_s: float | None = None) -> bool:
        """Whether the runtime reached STOPPED within `timeout_s`."""
        return self._stopped.wait(timeout_s)

    @property
    def crashed(self) -> bool:
        """Whether the training thread ended by failing, not by a Stop (it never trains
        again: the agent exits for its supervisor to restart it, `service.serve`)."""
        return self._crashed

    def close(self) -> None:
        """Stop, join the training thread, leave the epoch and close the writers."""
        self.stop(0.0)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    # --- the training thread --------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while (order := self._next()) is not _Order.STOP:
                self._serve(order)
        except BaseException:  # a bug: report it, then stop like a Stop would
            LOG.exception("worker %d: the training thread failed", self.worker)
            self._crashed = True
        finally:
            self._training.close()
            with self._cond:
                self._shown.state = State.STOPPED
                self._stopped.set()

    def _next(self) -> _Order:
        with self._cond:
            while True:
                shown, pending = self._shown, self._pending
                running = shown.state is State.RUNNING
                if self._stop:
                    return _Order.STOP
                at = shown.step if running else None
                if pending is not None and configure_rules.due(pending.resume_step, at):
                    return _Order.CONFIGURE
                if self._snapshot:
                    return _Order.SNAPSHOT
                if self._load is not None:
                    return _Order.LOAD
                if running and self._stop_step is not None and shown.step >= self._stop_step:
                    return _Order.FINISH
                if running and self._pause:
                    shown.state = State.PAUSED
                elif running:
                    return _Order.STEP
                self._cond.wait()

    def _serve(self, order: _Order) -> None:
        match order:
            case _Order.CONFIGURE:
                self._configure()
            case _Order.STEP:
                self._step()
            case _Order.FINISH:
                self._training.finish_snapshot()
                self._training.poll_checkpoint(wait=True)
                self._publish(state=State.FINISHED)
            case _Order.SNAPSHOT:
                self._training.snapshot_now()
                with self._cond:
                    self._snapshot = False
            case _Order.LOAD:
                self._load_snapshot()

    def _configure(self) -> None:
        with self._cond:
            config, self._pending = self._pending, None
            assert config is not None
            self._stop_step, self._pause = config.stop_step, False
            involved = any(
                t.destination == self.worker or self.worker in t.sources for t in config.transfers
            )
            state = State.TRANSFERRING if involved else State.CONFIGURING
            self._set(
                state=state,
                epoch=config.epoch,
                errors=(),
                setup=None,
                global_batch=config.settings.global_batch_size,
            )
        try:
            report = self._training.set_up(config)
        except epoch_setup.SetupError as exc:
            self._fail(exc.kind, str(exc), config.resume_step, setting_up=True)
            return
        except Exception as exc:  # keep serving: the controller reads the latched error
            error = acceptance.own_error(exc, setting_up=True)
            self._fail(*error, config.resume_step, setting_up=True)
            return
        self._publish(state=State.RUNNING, step=config.resume_step, setup=report, loss=None)

    def _step(self) -> None:
        attempted = self._training.step + 1
        try:
            done = self._training.run_step()
        except failures.StepError as exc:
            self._training.end_epoch(failed=True)  # closes our connections: peers fail fast
            self._fail(exc.kind, str(exc), attempted, peer=exc.peer)
            return
        except Exception as exc:
            self._training.end_epoch(failed=True)
            self._fail(*acceptance.own_error(exc, setting_up=False), attempted)
            return
        self._training.poll_checkpoint()
        self._publish(step=done.step, loss=done.loss, timings=done.timings)

    def _load_snapshot(self) -> None:
        with self._cond:
            load, self._load = self._load, None
        assert load is not None
        try:
            self._training.load_snapshot(load.step)
        except epoch_setup.SetupError as exc:
            self._fail(exc.kind, str(exc), load.step)
            return
        self._publish(step=load.step, loss=None)

    def _fail(
        self,
        kind: messages.ErrorKind,
        message: str,
        step: int,
        *,
        peer: plan.WorkerId | None = None,
        setting_up: bool = False,
    ) -> None:
        """Latch the error, state FAILED. A failed step drops a planned switch still pending;
        a failed set-up (`setting_up`) keeps what came meanwhile: accepted while this worker
        was not running, it is due at once (a spare's next scale-up)."""
        LOG.warning("worker %d: %s at step %d: %s", self.worker, kind.value, step, message)
        error = messages.LatchedError(kind=kind, message=message, step=step, peer_worker=peer)
        with self._cond:
            pending = self._pending
            if not setting_up and pending is not None and pending.resume_step > self._training.step:
                # A planned switch at a step this worker will now never reach: drop it, the
                # controller reconfigures from the failure (and would read a stale epoch).
                self._pending = None
            self._set(
                state=State.FAILED, errors=(*self._shown.errors, error), step=self._training.step
            )

    def _publish(self, **changes: object) -> None:
        with self._cond:
            self._set(checkpoint_step=self._training.checkpoint_step, **changes)

    def _set(self, **changes: object) -> None:
        """Change published fields (the caller holds the lock)."""
        for name, value in changes.items():
            setattr(self._shown, name, value)
        self._cond.notify_all()
