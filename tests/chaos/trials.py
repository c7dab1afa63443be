"""Chaos trials: one seeded fault schedule against the real system, and its invariant checked.

    result = await run_trial(seed=7, workdir=tmp_path, shm_base=Path("/dev/shm/chaos-7"))
    assert not result.problems, result.describe()

A trial runs one small job end to end: the controller core (`planaria.control.controller`) over a
`LocalBackend` whose agents are real `planaria agent` processes training a GPT with gloo (tiny;
small for `Kind.RETURNS`, whose steps must outlast a restart).
Its seed draws everything about the faults up front (`draw`): the kind (see `Kind`), the
snapshot redundancy, the moment of the first fault (a point of the training run counted in
steps; seconds after Profiling begins for `Kind.EARLY`, after the first epoch's set-up begins
for `Kind.RETURNS`), the victims in order, the gaps between faults, a returning worker's
pause and how long a partition lasts. So a seed replays the same schedule; where in a step a
fault lands depends on the machine's timing, and each `Event` records the phase, epoch and
committed step it met.

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

The job is `Config.DATA`'s (4 workers, the tiny model's best plan pure data parallelism,
`dynamic`) unless the trial asks for `Config.PIPELINE`: 6 workers whose devices hold 85 % of
the model (the job's `device_memory_bytes`, as deviceMemory in examples/tiny-job.yaml), so the
plan is two pipelines of 2-4 stages and recoveries copy layers between stages; 20 steps; the
policy drawn per seed from adaptive, reroute and dynamic, on a stream of its own. A seed's
`Config.DATA` schedule is the one it always had.

Only `Kind.PARTITION` trials make a network namespace (which needs root); the others run
everything on loopback. Not here: killing the controller itself (`controller_kill`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import math
import random
import shutil
import signal
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
from planaria.wire import messages
from tests.chaos import invariant, netns, processes
from tests.e2e import local_job

Phase = statuses.Phase
W = plan.WorkerId
CORPUS_BYTES = 100_000
MICRO_BATCH_SIZE = 1


class Kind(StrEnum):
    """The fault a trial injects."""

    KILL = "kill"  # one SIGKILL
    DOUBLE = "double"  # two SIGKILLs of distinct workers within MAX_GAP_S
    TRIPLE = "triple"  # three: more than the fault tolerance, often Suspended
    HANG = "hang"  # SIGSTOP: only the heartbeat timeout can tell
    RETURNS = "returns"  # SIGKILL, then the worker starts again (a scale-up)
    EARLY = "early"  # SIGKILL while an agent profiles or the first epoch is set up
    # Every worker SIGSTOPped past the heartbeat timeout, then SIGCONT (a paused machine);
    # drawn apart from the others (STALL_SHARE of the seeds).
    STALL = "stall"
    # One worker's traffic dropped both ways (`netns`) for `Draw.cut_s`, then let through: it
    # ran all along and comes back in a stale epoch. Drawn apart too (PARTITION_SHARE).
    PARTITION = "partition"
    # `planaria run` itself SIGKILLed and run again (tests/chaos/controller_kill.py, its own
    # harness); only with `bench.chaos --kind controller`: a trial starts two controllers.
    CONTROLLER = "controller"


class Config(StrEnum):
    """The job a trial runs (`SHAPES`)."""

    DATA = "data"  # 4 workers, the tiny model fits one: pure data parallelism, `dynamic`
    # 6 workers whose devices hold 85 % of the model: two pipelines of 3 stages (the demo's
    # kind of plan), the policy drawn from adaptive, reroute and dynamic.
    PIPELINE = "pipeline"


class Outcome(StrEnum):
    SUCCEEDED = "Succeeded"
    SUSPENDED = "Suspended"
    FAILED = "Failed"
    HUNG = "Hung"


KINDS = tuple(k for k in Kind if k not in (Kind.STALL, Kind.PARTITION, Kind.CONTROLLER))
STALL_SHARE = 1 / 7
PARTITION_SHARE = 1 / 7  # of the seeds not stalled
KEPT_CUT_SHARE = 1 / 4  # of the partitions: never healed, the job ends around the lost worker
MAX_CUT_EXTRA_S = 3.0  # a healed cut lasts the heartbeat timeout + up to this
MAX_GAP_S = 1.5
_FAULTS = {
    Kind.KILL: 1,
    Kind.DOUBLE: 2,
    Kind.TRIPLE: 3,
    Kind.HANG: 1,
    Kind.RETURNS: 1,
    Kind.EARLY: 1,
}
# From Profiling, whose ~1-2 s are followed by the first epoch's set-up (seconds on 2 cores);
# from the first epoch's set-up for a returning worker (`_TRIGGERS`).
_DELAY_S = {Kind.EARLY: 3.0, Kind.RETURNS: 2.0}


@dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    """The job every trial runs, and the trial's bounds. Heartbeat and step timeouts are small
    so a stopped worker is caught within seconds; a Suspended job is ended once it stayed so
    for `suspended_s` (longer than a stall's pause, from which the job should come back)."""

    config: Config = Config.DATA
    workers: int = 4
    steps: int = 12
    global_batch_size: int = 4
    model: str = "tiny"
    returns_model: str = "small"
    fault_tolerance: int = 1
    heartbeat_timeout_s: float = 1.5
    step_timeout_s: float = 4.0
    bound_s: float = 120.0
    suspended_s: float = 4.0
    stop_grace_s: float = 2.0
    # Each worker's device memory as a share of the model's layers (state + activations),
    # given as the job's `device_memory_bytes`; None: the profile's, the model fits one worker.
    device_memory_share: float | None = None
    policies: tuple[str, ...] = ("dynamic",)  # one is drawn per seed (`draw`)


SHAPES = {
    Config.DATA: Shape(),
    Config.PIPELINE: Shape(
        config=Config.PIPELINE,
        workers=6,
        steps=20,
        device_memory_share=0.85,
        policies=("adaptive", "reroute", "dynamic"),
    ),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Draw:
    """Everything a seed decides (module docstring)."""

    seed: int
    kind: Kind
    redundancy: messages.RedundancyMode
    at: float  # in [0, 1): where in its window the first fault lands (`_Trial._first_moment`)
    victims: tuple[plan.WorkerId, ...]
    gaps_s: tuple[float, ...]
    rejoin_s: float
    cut_s: float = 0.0  # `Kind.PARTITION`: how long the cut lasts; math.inf: to the end
    policy: str = "dynamic"  # the job's recovery policy, one of `Shape.policies`


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One action on a worker, with where the job was when it landed (seconds from the start;
    `doing`: the start of the status message, e.g. "opening epoch 1" or "epoch 2 running")."""

    at_s: float
    # "SIGKILL", "SIGSTOP", "SIGCONT", "cut", "heal", "restart", or "skipped ..." when it could
    # not act
    action: str
    worker: plan.WorkerId
    phase: str
    epoch: int
    step: int
    doing: str

    def describe(self) -> str:
        where = f"{self.phase} epoch {self.epoch} step {self.step}: {self.doing}"
        return f"{self.at_s:.2f}s {self.action} w{self.worker} ({where})"


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialResult:
    """One trial's facts and the invariant's breaches (`problems`, empty when it held)."""

    seed: int
    kind: Kind
    redundancy: str
    events: tuple[Event, ...]
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
    config: str = Config.DATA.value
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


def draw(seed: int, shape: Shape = Shape(), kind: Kind | None = None) -> Draw:
    """The seed's fault schedule (module docstring); the same seed, the same schedule. `kind`
    replaces the drawn kind (the rest is drawn as without it). The policy (when `shape` has
    several) comes from a stream of its own: a seed's faults do not depend on its policy."""
    rng = random.Random(seed)
    policies = shape.policies
    policy = policies[0] if len(policies) == 1 else random.Random(f"policy-{seed}").choice(policies)
    drawn = rng.choice(KINDS)
    chosen = kind or drawn
    workers = [W(w) for w in range(shape.workers)]
    schedule = Draw(
        seed=seed,
        kind=chosen,
        redundancy=rng.choice((messages.RedundancyMode.XOR, messages.RedundancyMode.COPY)),
        at=rng.random(),
        victims=tuple(rng.sample(workers, _FAULTS.get(chosen, len(workers)))),  # STALL: all
        gaps_s=tuple(rng.uniform(0.0, MAX_GAP_S) for _ in range(2)),
        rejoin_s=rng.uniform(0.0, 0.5),
        policy=policy,
    )
    # Drawn last, so that adding the stall left every other seed's schedule as it was.
    if kind is None and rng.random() < STALL_SHARE:
        everyone = tuple(rng.sample(workers, len(workers)))
        return dataclasses.replace(schedule, kind=Kind.STALL, victims=everyone)
    # Then the partition, after everything else for the same reason.
    if chosen is Kind.PARTITION or (kind is None and rng.random() < PARTITION_SHARE):
        kept = rng.random() < KEPT_CUT_SHARE
        cut_s = shape.heartbeat_timeout_s + rng.uniform(0.0, MAX_CUT_EXTRA_S)
        victim = (rng.choice(workers),)
        return dataclasses.replace(
            schedule, kind=Kind.PARTITION, victims=victim, cut_s=math.inf if kept else cut_s
        )
    return schedule


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
    shape: Shape | None = None,
    corpus: Path | None = None,
    kind: Kind | None = None,
    config: Config = Config.DATA,
) -> TrialResult:
    """Run seed `seed`'s trial in `workdir` (run logs, checkpoints) with its snapshot stores
    under `shm_base`, which is removed afterwards; the result says whether the invariant held.
    Trials given the same `corpus` file (`write_corpus`) share their reference runs; `kind`
    replaces the seed's fault kind; `shape` replaces `config`'s (`SHAPES`)."""
    shape = shape or SHAPES[config]
    schedule = draw(seed, shape, kind)
    corpus = corpus or write_corpus(workdir)
    try:
        if schedule.kind is Kind.PARTITION:
            return await _partitioned(schedule, shape, workdir, shm_base, corpus)
        return await _Trial(schedule, shape, workdir, shm_base, corpus).run()
    finally:
        shutil.rmtree(shm_base, ignore_errors=True)


async def _partitioned(
    schedule: Draw, shape: Shape, workdir: Path, shm_base: Path, corpus: Path
) -> TrialResult:
    """A partition trial inside its network; what of the network outlived it is a leak.
    Raises `netns.NetnsError` when the network cannot be set up (no trial ran)."""
    result: TrialResult | None = None
    problems: list[str] = []
    try:
        with netns.partition(schedule.seed) as net:
            result = await _Trial(schedule, shape, workdir, shm_base, corpus, net).run()
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
        schedule: Draw,
        shape: Shape,
        workdir: Path,
        shm_base: Path,
        corpus: Path,
        net: netns.Net | None = None,
    ) -> None:
        self.draw, self.shape, self.shm_base, self.net = schedule, shape, shm_base, net
        self.checkpoints = workdir / "checkpoints"
        training = local_job.training(corpus, checkpoint_dir=self.checkpoints)
        training = dataclasses.replace(
            training,
            redundancy=schedule.redundancy,
            global_batch_size=shape.global_batch_size,
            model=shape.returns_model if schedule.kind is Kind.RETURNS else shape.model,
        )
        share = shape.device_memory_share
        self.settings = local_job.job(
            f"chaos-{schedule.seed}",
            training,
            workers=shape.workers,
            steps=shape.steps,
            fault_tolerance=shape.fault_tolerance,
            heartbeat_timeout_s=shape.heartbeat_timeout_s,
            step_timeout_s=shape.step_timeout_s,
            micro_batch_size=MICRO_BATCH_SIZE,
            profile=None if schedule.kind is Kind.EARLY else _profile(training.model),
            policy=schedule.policy,
            device_memory_bytes=None if share is None else _device_memory(training.model, share),
        )
        self.backend = local_backend.LocalBackend(
            job=self.settings.name,
            run_dir=workdir / "run",
            snapshot_base=shm_base,
            stop_grace_s=shape.stop_grace_s,
            # A partition's victim in its namespace, the others on the host's address there.
            store_host=net.host_ip if net else launching.LOOPBACK,
            placement=net.placement(schedule.victims[0]) if net else None,
        )
        self.sink = _FinalStates(self.settings, shm_base)
        self.controller = controller.Controller(
            self.settings, self.backend, clock=clock.RealClock(), sink=self.sink
        )
        self.sink.plan = lambda: self.controller.plan
        self.events: list[Event] = []
        self.started = time.monotonic()
        self.pids = processes.Recorder()
        self.crash = ""  # the controller's own exception, if it raised one
        self.first_plan = ""

    async def run(self) -> TrialResult:
        running = asyncio.ensure_future(self.controller.run())
        helpers = [asyncio.ensure_future(self._inject()), asyncio.ensure_future(self._record())]
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

    # -- faults -----------------------------------------------------------------------------

    async def _inject(self) -> None:
        kind = self.draw.kind
        await self._first_moment()
        if kind is Kind.STALL:
            await self._stall()
            return
        if kind is Kind.PARTITION:
            await self._partition(self.draw.victims[0])
            return
        signum = signal.SIGSTOP if kind is Kind.HANG else signal.SIGKILL
        for index, victim in enumerate(self.draw.victims):
            if index:
                await asyncio.sleep(self.draw.gaps_s[index - 1])
            self._signal(victim, signum)
        if kind is Kind.RETURNS:
            await self._return(self.draw.victims[0])

    async def _first_moment(self) -> None:
        """Wait for the first fault's moment. Seconds after its trigger for the kinds of
        `_DELAY_S`; otherwise a point of the training run counted in steps, so the fault lands
        inside the run whatever the machine's speed: `at` of the way through steps
        0..steps - 2, the fraction of a step slept out by the last step's duration."""
        kind = self.draw.kind
        await self._until(_TRIGGERS.get(kind, _running))
        if kind in _DELAY_S:
            await asyncio.sleep(self.draw.at * _DELAY_S[kind])
            return
        position = self.draw.at * (self.shape.steps - 2)
        await self._until(lambda s: s.step >= int(position))
        records = self.controller.steps
        step_s = records[-1].at_s - records[-2].at_s if len(records) > 1 else 0.1
        await asyncio.sleep((position - int(position)) * step_s)

    async def _stall(self) -> None:
        """Stop every victim at once, past the heartbeat timeout, then let them go on."""
        for victim in self.draw.victims:
            self._signal(victim, signal.SIGSTOP)
        await asyncio.sleep(self.shape.heartbeat_timeout_s + 1.0)
        for victim in self.draw.victims:
            self._signal(victim, signal.SIGCONT)

    async def _partition(self, victim: plan.WorkerId) -> None:
        """Cut the victim's link for `cut_s`, then heal it (never, when infinite)."""
        assert self.net is not None
        self.net.cut()
        self._event("cut", victim)
        if math.isinf(self.draw.cut_s):
            return
        await asyncio.sleep(self.draw.cut_s)
        self.net.heal()
        self._event("heal", victim)

    async def _until(self, check: Callable[[statuses.JobStatus], bool]) -> None:
        while not check(self.controller.status):
            await asyncio.sleep(local_job.POLL_S)

    def _signal(self, worker: plan.WorkerId, signum: signal.Signals) -> None:
        if self.backend.running(worker):
            self.backend.kill(worker, signum)
            self._event(signum.name, worker)
        else:
            self._event(f"skipped {signum.name} (not running)", worker)

    async def _return(self, worker: plan.WorkerId) -> None:
        with contextlib.suppress(TimeoutError):
            await self.backend.wait_exited(worker, 10.0)
        await asyncio.sleep(self.draw.rejoin_s)
        try:
            await self.backend.restart(worker)
        except local_backend.LocalBackendError as exc:  # the job ended first: nothing to join
            self._event(f"skipped restart ({exc})", worker)
            return
        self.pids.add(self.backend.pids.values())
        self._event("restart", worker)

    def _event(self, action: str, worker: plan.WorkerId) -> None:
        status = self.controller.status
        self.events.append(
            Event(
                at_s=time.monotonic() - self.started,
                action=action,
                worker=worker,
                phase=status.phase.value,
                epoch=status.epoch,
                step=status.step,
                doing=status.message.split(":")[0],
            )
        )

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
            events=tuple(self.events),
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
def _profile(model_name: str) -> profile.Profile:
    """The model's profile, measured once per process and given to the job, so trials other
    than `Kind.EARLY` skip the Profiling phase (seconds per trial on 2 cores)."""
    shape = shapes.named(model_name)
    return profiler.measure_profile(shape, MICRO_BATCH_SIZE, warmup=0, repeats=1)


def _device_memory(model_name: str, share: float) -> int:
    """`share` of the bytes the model's layers take on a device (states and activations)."""
    layers = _profile(model_name).layers
    return int(share * sum(layer.state_bytes + layer.activation_bytes for layer in layers))


def _stages(running: plan.Plan) -> str:
    """A plan's pipelines by their stage counts: "3+3", "2+2+2+2"."""
    return "+".join(str(len(pipeline.stages)) for pipeline in running.pipelines)


def _running(status: statuses.JobStatus) -> bool:
    return status.phase is Phase.RUNNING


def _early(status: statuses.JobStatus) -> bool:
    """Profiling has begun (the first epoch's set-up follows it)."""
    return status.phase is Phase.PROFILING


def _setting_up(status: statuses.JobStatus) -> bool:
    """The first epoch is being set up (its Configures sent, the workers regrouping)."""
    return status.message.startswith("opening epoch 1") or status.phase is Phase.RUNNING


# When a kind's delay starts: a returning worker is killed while the first epoch is set up
# (seconds), so that its restart (seconds too) can come back while the job still trains.
_TRIGGERS = {Kind.EARLY: _early, Kind.RETURNS: _setting_up}
