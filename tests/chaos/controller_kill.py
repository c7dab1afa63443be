"""Chaos trials of the controller itself: `planaria run` SIGKILLed at a seeded moment and the
same command run again (issue #10's "controller killed and restarted mid-recovery").

    result = await run_trial(seed=3, workdir=tmp_path, shm_base=Path("/dev/shm/ctl-3"))
    assert not result.problems, result.describe()

A trial runs one small job (`schedule.Shape`: the tiny GPT, gloo, real agent processes) as
`python -m planaria run`, the real controller process over a LocalBackend, with one worker
killed by the controller's own `--fail step=S:worker=V`, and SIGKILLs that controller at a
moment its seed draws (`Moment`), told from outside by the run's pid files, journal and
progress lines:

    SETUP       every agent runs, then 0-1 s later, mostly before the first epoch is journalled
                (profiling, the first plan): the next controller then finds agents without a
                journal, stops them and starts over
    TRAINING    the first "Running" progress line, then 0-0.6 s later: training, the worker kill
                before or after it
    RECOVERING  the recovery's epoch journalled (its Configures going out), then 0-0.5 s later

Then the same command runs again (adopting, or starting over, docs/local-mode.md) until the job
ends or `Shape.bound_s` passes (then it is interrupted: Ctrl-C stops its agents, and the trial
counts as hung). The old controller's agents are re-parented to this process, which makes
itself a child subreaper for the trial and reaps them, as init would.

The invariant, as `trials`'s: the job ends Succeeded at the last step and the persistent
checkpoint of that step (written before the agents report finished) equals the fault-free
reference bitwise (exact reduction, `invariant.compare`); no hang past the bound; afterwards no
agent process of either controller (pids with their start times, and their sessions:
`processes.Recorder`) and nothing under the trial's snapshot base is left. A run that ends
Suspended waits for workers that never return, so it ends by the bound: this trial's schedule
(one worker killed, fault tolerance 1) must not suspend.

The results are `trials.TrialResult`s of kind "controller"; their events name the controller as
worker -1. Not here: the rest of the fault kinds (`trials`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from planaria.agent.state import checkpoints
from planaria.contract import plan
from planaria.local import adoption, journal
from planaria.spec import conversion, job_file
from tests.chaos import faults, invariant, processes, schedule, trials
from tests.e2e import local_job

KIND = schedule.Kind.CONTROLLER  # never drawn by `schedule.draw`: each trial starts two controllers
CONTROLLER = plan.WorkerId(-1)  # the controller, in `faults.Event.worker`
POLL_S = 0.005
INTERRUPT_GRACE_S = 60.0
_DELAY_S = {"setup": 1.0, "training": 0.6, "recovering": 0.5}  # 12 steps: ~1.2 s
SHAPE = schedule.Shape()
_PROGRESS = re.compile(r"\]\s+(\w+)\s+step (\d+)/")
_PLAN = re.compile(r"\[(\d+(?:,\d+)*)\] initial")


class Moment(StrEnum):
    """When the controller is killed (module docstring)."""

    SETUP = "setup"
    TRAINING = "training"
    RECOVERING = "recovering"


@dataclass(frozen=True, slots=True, kw_only=True)
class Draw:
    """Everything a seed decides."""

    seed: int
    moment: Moment
    delay: float  # in [0, 1): of the moment's _DELAY_S
    fail_step: int
    victim: plan.WorkerId
    redundancy: str
    policy: str = "dynamic"  # the job's recovery policy, one of `Shape.policies`


def draw(seed: int, shape: schedule.Shape = SHAPE) -> Draw:
    """The seed's schedule; the same seed, the same schedule. The policy (when `shape` has
    several) comes from a stream of its own, as in `schedule.draw`."""
    rng = random.Random(seed)
    policies = shape.policies
    policy = policies[0] if len(policies) == 1 else random.Random(f"policy-{seed}").choice(policies)
    return Draw(
        seed=seed,
        moment=rng.choice(tuple(Moment)),
        delay=rng.random(),
        fail_step=rng.randint(2, shape.steps // 2),
        victim=plan.WorkerId(rng.randrange(shape.workers)),
        redundancy=rng.choice(("xor", "copy")),
        policy=policy,
    )


async def run_trial(
    seed: int,
    workdir: Path,
    shm_base: Path,
    shape: schedule.Shape = SHAPE,
    corpus: Path | None = None,
) -> trials.TrialResult:
    """Run seed `seed`'s trial in `workdir` with its snapshot stores under `shm_base` (removed
    afterwards); the result says whether the invariant held."""
    corpus = corpus or trials.write_corpus(workdir)
    trial = _Trial(draw(seed, shape), shape, workdir, shm_base, corpus)
    try:
        with processes.subreaper():
            return await trial.run()
    finally:
        shutil.rmtree(shm_base, ignore_errors=True)


class _Trial:
    """One trial's runs, kill and checks (module docstring)."""

    def __init__(
        self, schedule: Draw, shape: schedule.Shape, workdir: Path, shm_base: Path, corpus: Path
    ) -> None:
        self.draw, self.shape, self.workdir, self.shm_base = schedule, shape, workdir, shm_base
        self.corpus = corpus
        self.name = f"ctl-{schedule.seed}"
        self.out = workdir / "run"
        self.checkpoints = workdir / "checkpoints"
        self.job_path = workdir / "job.yaml"
        self.job_path.write_text(_job_yaml(schedule, shape, corpus, self.checkpoints))
        self.pids = processes.Recorder()
        self.events: list[faults.Event] = []
        self.started = time.monotonic()

    def command(self) -> list[str]:
        return [
            *(sys.executable, "-m", "planaria", "run", str(self.job_path)),
            *("--out", str(self.out), "--name", self.name, "--no-progress"),
            *("--fail", f"step={self.draw.fail_step}:worker={self.draw.victim}"),
            *("--snapshot-base", str(self.shm_base)),
        ]

    async def run(self) -> trials.TrialResult:
        code: int | None = None
        try:
            ended = await self._first_run()
            code = ended if ended is not None else await self._second_run()
        finally:
            self._record_pids()
            processes.reap(set(self.pids.started))
        return self._result(code, time.monotonic() - self.started)

    async def _first_run(self) -> int | None:
        """Run until the drawn moment and SIGKILL; the exit status if the job ended first."""
        log = self.workdir / "first.log"
        first = await _spawn(self.command(), log)
        try:
            await asyncio.wait_for(self._moment(first), self.shape.bound_s)
        except TimeoutError:
            pass  # killed below; the second run still has its bound
        finally:
            self._record_pids()
            if first.returncode is None:
                first.kill()
                self._event("SIGKILL", log)
            await first.wait()
        if first.returncode != -signal.SIGKILL:
            self._event(f"skipped SIGKILL (the run ended: {first.returncode})", log)
            return first.returncode
        return None

    async def _moment(self, first: asyncio.subprocess.Process) -> None:
        moment = self.draw.moment
        while first.returncode is None:
            self._record_pids()
            if moment is Moment.SETUP:
                reached = len(adoption.running(self.out / "workers")) == self.shape.workers
            elif moment is Moment.TRAINING:
                reached = "] Running" in _text(self.workdir / "first.log")
            else:
                reached = _journalled(self.out) >= 2
            if reached:
                await asyncio.sleep(self.draw.delay * _DELAY_S[moment])
                return
            await asyncio.sleep(POLL_S)

    async def _second_run(self) -> int | None:
        """The same command again, to the job's end or the bound (then Ctrl-C: None)."""
        second = await _spawn(self.command(), self.workdir / "second.log")
        deadline = self.started + self.shape.bound_s
        while second.returncode is None and time.monotonic() < deadline:
            self._record_pids()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(second.wait(), 0.1)
        if second.returncode is not None:
            return second.returncode
        second.send_signal(signal.SIGINT)  # it stops its agents and writes its report
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(second.wait(), INTERRUPT_GRACE_S)
        if second.returncode is None:
            second.kill()
            await second.wait()
        return None

    def _record_pids(self) -> None:
        for path in (self.out / "workers").glob(f"worker-*{adoption.SUFFIX}"):
            entry = adoption.read(path)
            if entry is not None:
                self.pids.add([entry[0]])

    def _event(self, action: str, log: Path) -> None:
        phase, step = _last_progress(log)
        moment = self.draw.moment
        self.events.append(
            faults.Event(
                at_s=time.monotonic() - self.started,
                action=action,
                worker=CONTROLLER,
                phase=phase,
                epoch=_journalled(self.out),
                step=step,
                doing=f"the controller, {moment} + {self.draw.delay * _DELAY_S[moment]:.2f} s",
            )
        )

    # -- the invariant --------------------------------------------------------------------------

    def _result(self, code: int | None, wall_s: float) -> trials.TrialResult:
        said = _text(self.workdir / "second.log") or _text(self.workdir / "first.log")
        outcome = _outcome(code)
        problems: list[str] = []
        differing = self._check(outcome, said, problems)
        leaked = self.pids.leaked()
        if leaked:
            problems.append(f"processes left: {list(leaked)}")
            processes.kill(leaked)
        left = sorted(str(p) for p in self.shm_base.rglob("*")) if self.shm_base.exists() else []
        if left:
            problems.append(f"snapshot stores left: {left[:5]}")
        return trials.TrialResult(
            seed=self.draw.seed,
            kind=KIND,
            redundancy=self.draw.redundancy,
            events=tuple(self.events),
            outcome=outcome,
            message=said.strip().splitlines()[-1] if said.strip() else "",
            step=_last_progress_text(said)[1],
            moves=tuple(re.findall(r"recovery \d+: \S+ -> (\S+),", said)),
            wall_s=wall_s,
            differing=differing,
            checkpoint_step=None,
            leaked_pids=leaked,
            leaked_shm=tuple(left),
            problems=tuple(problems),
            config=self.shape.config.value,
            policy=self.draw.policy,
            first_plan=_first_plan(_text(self.workdir / "first.log")),
        )

    def _check(self, outcome: trials.Outcome, said: str, problems: list[str]) -> int | None:
        """Succeeded at the last step, its checkpoint equal to the reference."""
        if outcome is trials.Outcome.HUNG:
            problems.append(f"not ended within {self.shape.bound_s:g} s: {said[-300:]!r}")
            return None
        if outcome is not trials.Outcome.SUCCEEDED:
            problems.append(f"ended {outcome}: {said[-300:]!r}")
            return None
        if f"Succeeded at step {self.shape.steps}" not in said:
            problems.append(f"Succeeded, but not at step {self.shape.steps}")
        try:
            states = checkpoints.load_checkpoint(self.checkpoints, self.shape.steps)
        except Exception as exc:  # the trial's finding, reported with the others
            problems.append(f"the checkpoint of the last step does not load: {exc}")
            return None
        spec = job_file.load_job(self.job_path).spec
        settings = conversion.to_settings(spec, self.name, str(self.corpus))
        return invariant.compare(states, settings, self.shape.steps, problems)


def _job_yaml(drawn: Draw, shape: schedule.Shape, corpus: Path, checkpoint_dir: Path) -> str:
    training = local_job.training(corpus)
    memory = trials.device_memory_bytes(shape, shape.model)
    return "\n".join(
        [
            f"model: {shape.model}",
            f"workers: {shape.workers}",
            f"steps: {shape.steps}",
            f"microBatchSize: {shape.micro_batch_size}",
            f"globalBatchSize: {shape.global_batch_size}",
            f"seed: {training.seed}",
            # Fixed-point: YAML reads 1e-06 (no dot) as a string.
            f"optimizer: {{lr: {training.optimizer.lr:.10f}, eps: {training.optimizer.eps:.10f}}}",
            f"data: {{corpusPaths: [{corpus}]}}",
            f"reduction: {training.reduction}",
            f"snapshots: {{intervalSteps: 1, redundancy: {drawn.redundancy}}}",
            f"checkpoints: {{dir: {checkpoint_dir}, intervalSteps: 2}}",
            f"faultTolerance: {shape.fault_tolerance}",
            f"policy: {drawn.policy}",
            *([] if memory is None else [f"deviceMemory: '{memory}'"]),  # a quantity string
            "timeouts: {"
            f"heartbeatSeconds: {shape.heartbeat_timeout_s}, "
            f"stepSeconds: {shape.step_timeout_s}}}",
            "",
        ]
    )


async def _spawn(command: list[str], log: Path) -> asyncio.subprocess.Process:
    with open(log, "ab") as sink:
        return await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=sink,
            stderr=sink,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def _journalled(out: Path) -> int:
    """The epoch in the run's journal, 0 when there is none yet."""
    try:
        return int(json.loads((out / journal.FILE_NAME).read_bytes())["epoch"])
    except (FileNotFoundError, ValueError, KeyError):
        return 0


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _last_progress(log: Path) -> tuple[str, int]:
    return _last_progress_text(_text(log))


def _last_progress_text(text: str) -> tuple[str, int]:
    """(phase, step) of the last progress line, ("-", 0) before the first."""
    found = _PROGRESS.findall(text)
    return (found[-1][0], int(found[-1][1])) if found else ("-", 0)


def _first_plan(text: str) -> str:
    """The first plan's stages per pipeline ("3+3") from the run's log, "" when not seen."""
    found = _PLAN.search(text)
    return "+".join(found.group(1).split(",")) if found else ""


def _outcome(code: int | None) -> trials.Outcome:
    if code is None:
        return trials.Outcome.HUNG
    if code == 0:
        return trials.Outcome.SUCCEEDED
    return trials.Outcome.FAILED
