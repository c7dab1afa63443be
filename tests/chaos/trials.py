"""Chaos trials: one seeded fault schedule against the real system, and its invariant checked.

    result = await run_trial(seed=7, workdir=tmp_path, shm_base=Path("/dev/shm/chaos-7"))
    assert not result.problems, result.describe()

A trial runs one small job end to end: the controller core (`planaria.control.controller`) over a
`LocalBackend` whose agents are real `planaria agent` processes training a GPT with gloo (tiny;
small for `schedule.Kind.RETURNS`, whose steps must outlast a restart). Its seed's schedule
(`schedule.draw`: the kind, the moment, the victims, ...) is injected beside the controller's
run (`faults.Injector`), and each `faults.Event` records the phase, epoch and committed step it
met; where in a step a fault lands depends on the machine's timing.

The invariant (`TrialResult.problems` lists every breach; the outcome checks are `invariant`):
- the job ends Succeeded with every layer (parameters, AdamW moments and step counts) bitwise
  equal to the fault-free `ReferenceTrainer`'s (the trials train in exact reduction mode), read
  from the snapshot stores while the finished agents are still up (`_FinalStates`, a status
  sink), or it ends Suspended with a message that says why and where it resumes, and then the
  persistent checkpoint it names loads and equals the reference at that step;
- it ends within `Shape.bound_s` (else it is cancelled, shut down and counted `Outcome.HUNG`);
- afterwards no process the backend ever started runs or lingers as a zombie, nor any process
  of their sessions, and the trial's shared-memory base is empty (the backend removes its stores:
  `keep_snapshots=False`); after a partition, its namespace and links are gone (`netns`).

The job is `schedule.Config`'s (`schedule.SHAPES`): DATA by default (4 workers, pure data
parallelism), PIPELINE (6 workers whose devices hold 85 % of the model: two pipelines of 2-4
stages, the policy drawn per seed) or DEMO (the demo's job: 8 workers, pipelines of 5 + 3
stages, micro-batches of 4, `adaptive`).

Only partition trials make a network namespace (which needs root); the others run everything
on loopback. Not here: the schedule (`schedule`), the faults (`faults`), killing the controller
itself (`controller_kill`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from planaria.agent.execution import profiler
from planaria.agent.runtime import runtime_states
from planaria.agent.training import data, model
from planaria.contract import plan, profile, shapes
from planaria.control import clock, controller
from planaria.control import status as statuses
from planaria.local import backend as local_backend
from planaria.local import launching
from tests.chaos import faults, invariant, netns, processes, schedule
from tests.e2e import local_job

Phase = statuses.Phase
CORPUS_BYTES = 100_000


class Outcome(StrEnum):
    SUCCEEDED = "Succeeded"
    SUSPENDED = "Suspended"
    FAILED = "Failed"
    HUNG = "Hung"


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialResult:
    """One trial's facts and the invariant's breaches (`problems`, empty when it held)."""

    seed: int
    kind: schedule.Kind
    redundancy: str
    events: tuple[faults.Event, ...]
    outcome: Outcome
    message: str
    step: int
    moves: tuple[str, ...]  # the kind of every recovery and planned move ("dynamic", "scale-up")
    wall_s: float
    differing: int | None  # elements unequal to the reference's (None: not compared)
    checkpoint_step: int | None
    leaked_pids: tuple[int, ...]
    leaked_shm: tuple[str, ...]
    problems: tuple[str, ...]
    leaked_net: tuple[str, ...] = ()  # a partition's namespace or links left ("netns pln7")
    config: str = schedule.Config.DATA.value
    policy: str = "dynamic"
    first_plan: str = ""  # the first epoch's stages per pipeline, e.g. "3+3" or "1+1+1+1"

    @property
    def injected(self) -> int:
        return sum(e.action in ("SIGKILL", "SIGSTOP", "cut") for e in self.events)

    def describe(self) -> str:
        events = "; ".join(e.describe() for e in self.events) or "no fault landed"
        differing = "-" if self.differing is None else str(self.differing)
        job = f"{self.config} {self.first_plan or '-'} {self.policy}, {self.redundancy}"
        head = (
            f"seed {self.seed} {self.kind} ({job}): {self.outcome} at step "
            f"{self.step} in {self.wall_s:.1f}s, {differing} differing, moves {list(self.moves)}; "
            f"{events}"
        )
        return "\n  ".join([head, *self.problems])


def write_corpus(folder: Path) -> Path:
    """The default corpus (standard-library sources, CORPUS_BYTES) as one file in `folder`."""
    path = folder / "corpus.txt"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.load_default_corpus(max_bytes=CORPUS_BYTES).tobytes())
    return path


async def run_trial(
    seed: int,
    workdir: Path,
    shm_base: Path,
    shape: schedule.Shape | None = None,
    corpus: Path | None = None,
    kind: schedule.Kind | None = None,
    config: schedule.Config = schedule.Config.DATA,
) -> TrialResult:
    """Run seed `seed`'s trial in `workdir` (run logs, checkpoints) with its snapshot stores
    under `shm_base`, which is removed afterwards; the result says whether the invariant held.
    Trials given the same `corpus` file (`write_corpus`) share their reference runs; `kind`
    replaces the seed's fault kind; `shape` replaces `config`'s (`schedule.SHAPES`)."""
    shape = shape or schedule.SHAPES[config]
    drawn = schedule.draw(seed, shape, kind)
    corpus = corpus or write_corpus(workdir)
    try:
        if drawn.kind is schedule.Kind.PARTITION:
            return await _partitioned(drawn, shape, workdir, shm_base, corpus)
        return await _Trial(drawn, shape, workdir, shm_base, corpus).run()
    finally:
        shutil.rmtree(shm_base, ignore_errors=True)


async def _partitioned(
    drawn: schedule.Draw, shape: schedule.Shape, workdir: Path, shm_base: Path, corpus: Path
) -> TrialResult:
    """A partition trial inside its network; what of the network outlived it is a leak.
    Raises `netns.NetnsError` when the network cannot be set up (no trial ran)."""
    result: TrialResult | None = None
    problems: list[str] = []
    try:
        with netns.partition(drawn.seed) as net:
            result = await _Trial(drawn, shape, workdir, shm_base, corpus, net).run()
    except netns.NetnsError as exc:
        if result is None:
            raise
        problems.append(f"network teardown failed: {exc}")
    leaked = net.leftovers()
    if leaked:
        problems.append(f"network left after the trial: {list(leaked)}")
    return dataclasses.replace(result, leaked_net=leaked, problems=(*result.problems, *problems))


class _FinalStates:
    """A status sink that reads the final layer states when Succeeded is published: the
    agents are FINISHED (their last snapshot complete) and the backend not yet shut down."""

    def __init__(self, settings: local_job.job_settings.JobSettings, shm_base: Path) -> None:
        self._settings, self._shm_base = settings, shm_base
        self.plan: Callable[[], plan.Plan | None] = lambda: None
        self.states: dict[int, model.LayerState] | None = None
        self.error = ""

    async def publish(self, status: statuses.JobStatus) -> None:
        final = self.plan()
        if status.phase is not Phase.SUCCEEDED or self.states is not None or final is None:
            return
        try:
            self.states = runtime_states.read_final_states(
                self._settings.name, self._shm_base, final, self._settings.steps
            )
        except Exception as exc:  # the trial's finding, reported with the others
            self.error = f"final states unreadable: {exc!r}"


class _Trial:
    """One trial's job, faults and checks (module docstring)."""

    def __init__(
        self,
        drawn: schedule.Draw,
        shape: schedule.Shape,
        workdir: Path,
        shm_base: Path,
        corpus: Path,
        net: netns.Net | None = None,
    ) -> None:
        self.draw, self.shape, self.shm_base, self.net = drawn, shape, shm_base, net
        self.checkpoints = workdir / "checkpoints"
        training = local_job.training(corpus, checkpoint_dir=self.checkpoints)
        training = dataclasses.replace(
            training,
            redundancy=drawn.redundancy,
            global_batch_size=shape.global_batch_size,
            model=shape.returns_model if drawn.kind is schedule.Kind.RETURNS else shape.model,
        )
        early = drawn.kind is schedule.Kind.EARLY
        self.settings = local_job.job(
            f"chaos-{drawn.seed}",
            training,
            workers=shape.workers,
            steps=schedule.steps(shape, drawn.kind),
            fault_tolerance=shape.fault_tolerance,
            heartbeat_timeout_s=shape.heartbeat_timeout_s,
            step_timeout_s=shape.step_timeout_s,
            micro_batch_size=shape.micro_batch_size,
            profile=None if early else _profile(training.model, shape.micro_batch_size),
            policy=drawn.policy,
            device_memory_bytes=device_memory_bytes(shape, training.model),
        )
        self.backend = local_backend.LocalBackend(
            job=self.settings.name,
            run_dir=workdir / "run",
            snapshot_base=shm_base,
            stop_grace_s=shape.stop_grace_s,
            # A partition's victim in its namespace, the others on the host's address there.
            store_host=net.host_ip if net else launching.LOOPBACK,
            placement=net.placement(drawn.victims[0]) if net else None,
        )
        self.sink = _FinalStates(self.settings, shm_base)
        self.controller = controller.Controller(
            self.settings, self.backend, clock=clock.RealClock(), sink=self.sink
        )
        self.sink.plan = lambda: self.controller.plan
        self.started = time.monotonic()
        self.pids = processes.Recorder()
        self.faults = faults.Injector(
            drawn,
            shape,
            self.controller,
            self.backend,
            net=net,
            pids=self.pids,
            started=self.started,
        )
        self.crash = ""  # the controller's own exception, if it raised one
        self.first_plan = ""

    async def run(self) -> TrialResult:
        running = asyncio.ensure_future(self.controller.run())
        helpers = [asyncio.ensure_future(self.faults.run()), asyncio.ensure_future(self._record())]
        try:
            outcome = await self._outcome(running)
        finally:
            for task in (*helpers, running):
                task.cancel()
            await asyncio.gather(*helpers, running, return_exceptions=True)
            await self.backend.shutdown()
        self.pids.add(self.backend.pids.values())
        return self._result(outcome, time.monotonic() - self.started)

    async def _outcome(self, running: asyncio.Future[statuses.JobStatus]) -> Outcome:
        """Wait for the job's end, a lasting suspension, or the bound."""
        deadline = self.started + self.shape.bound_s
        suspended_since: float | None = None
        while not running.done():
            now = time.monotonic()
            if now > deadline:
                return Outcome.HUNG
            if self.controller.status.phase is Phase.SUSPENDED:
                suspended_since = suspended_since or now
                if now - suspended_since >= self.shape.suspended_s:
                    return Outcome.SUSPENDED
            else:
                suspended_since = None
            await asyncio.sleep(local_job.POLL_S)
        if running.exception() is not None:
            self.crash = repr(running.exception())
            return Outcome.FAILED
        return Outcome(running.result().phase.value)

    async def _record(self) -> None:
        """Every process the backend starts, restarts included (for the leak check)."""
        while True:
            self.pids.add(self.backend.pids.values())
            running = self.controller.plan
            if not self.first_plan and running is not None:
                self.first_plan = _stages(running)
            await asyncio.sleep(local_job.POLL_S)

    # -- the invariant ------------------------------------------------------------------------

    def _result(self, outcome: Outcome, wall_s: float) -> TrialResult:
        status = self.controller.status
        problems: list[str] = []
        differing = self._check_outcome(outcome, status, problems)
        leaked_pids = self.pids.leaked()
        leaked_shm = tuple(sorted(str(p) for p in self.shm_base.glob("*")))
        if leaked_pids:
            problems.append(f"processes still there after shutdown: {list(leaked_pids)}")
        if leaked_shm:
            problems.append(f"shared memory left: {list(leaked_shm)}")
        return TrialResult(
            seed=self.draw.seed,
            kind=self.draw.kind,
            redundancy=self.draw.redundancy.value,
            events=tuple(self.faults.events),
            outcome=outcome,
            message=status.message,
            step=status.step,
            moves=tuple(r.kind for r in self.controller.recoveries),
            wall_s=wall_s,
            differing=differing,
            checkpoint_step=status.checkpoint_step,
            leaked_pids=leaked_pids,
            leaked_shm=leaked_shm,
            problems=tuple(problems),
            config=self.shape.config.value,
            policy=self.draw.policy,
            first_plan=self.first_plan,
        )

    def _check_outcome(
        self, outcome: Outcome, status: statuses.JobStatus, problems: list[str]
    ) -> int | None:
        if outcome is Outcome.SUCCEEDED:
            if self.sink.error:
                problems.append(self.sink.error)
            return invariant.succeeded(status, self.sink.states, self.settings, problems)
        if outcome is Outcome.SUSPENDED:
            return invariant.suspended(status, self.checkpoints, self.settings, problems)
        problems.append(f"ended {outcome}: {self.crash or status.message}")
        return None


@functools.cache
def _profile(model_name: str, micro_batch_size: int) -> profile.Profile:
    """The model's profile, measured once per process and given to the job, so trials other
    than `schedule.Kind.EARLY` skip the Profiling phase (seconds per trial on 2 cores)."""
    shape = shapes.named(model_name)
    return profiler.measure_profile(shape, micro_batch_size, warmup=0, repeats=1)


def device_memory_bytes(shape: schedule.Shape, model_name: str) -> int | None:
    """Each worker's device memory in job `shape` training `model_name`: its share of the bytes
    the model's layers take on a device (states and activations), or its bytes; None: the
    profile's (the model fits one worker)."""
    if shape.device_memory_share is None:
        return shape.device_memory_bytes
    layers = _profile(model_name, shape.micro_batch_size).layers
    total = sum(layer.state_bytes + layer.activation_bytes for layer in layers)
    return int(shape.device_memory_share * total)


def _stages(running: plan.Plan) -> str:
    """A plan's pipelines by their stage counts: "3+3", "2+2+2+2"."""
    return "+".join(str(len(pipeline.stages)) for pipeline in running.pipelines)
