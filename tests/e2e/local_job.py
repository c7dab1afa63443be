"""A test helper: one job driven by the real controller over a `LocalBackend` on the real clock.

`LocalJob` builds small `JobSettings` (the tiny model, a small corpus, snapshots every step,
exact reduction), runs `planaria.control.controller.Controller` with agent processes, lets a
test act on the backend while the job runs (a `Script`: an async function given the job), and
reads the final layer states from the agents' snapshot stores for the bitwise comparison with
the fault-free `ReferenceTrainer` (`planaria.agent.runtime.runtime_states`,
`planaria.agent.training.comparison`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from planaria.agent.execution import profiler
from planaria.agent.runtime import runtime_states
from planaria.agent.training import comparison
from planaria.contract import plan, profile, shapes
from planaria.control import clock, controller
from planaria.control import settings as job_settings
from planaria.control import status as statuses
from planaria.local import backend as local_backend
from planaria.wire import messages
from tests.chaos import processes

__all__ = [
    "LocalJob",
    "asyncio",
    "assert_like_reference",
    "job",
    "job_settings",
    "pipelined_profile",
    "training",
]

RUN_TIMEOUT_S = 150.0
POLL_S = 0.02


def training(corpus: Path, checkpoint_dir: Path | None = None) -> messages.TrainingSettings:
    """The tiny model on `corpus`, snapshots every step (XOR), checkpoints every 2 when given;
    exact reduction, so the result equals the reference's bitwise whatever the plan and faults."""
    return messages.TrainingSettings(
        model="tiny",
        seed=5,
        optimizer=messages.OptimizerSettings(lr=3e-3, eps=1e-6),
        global_batch_size=4,
        data=messages.DataSettings(corpus_paths=(str(corpus),)),
        device=messages.Device.CPU,
        snapshot_interval_steps=1,
        redundancy=messages.RedundancyMode.XOR,
        checkpoint_dir=str(checkpoint_dir) if checkpoint_dir else "",
        checkpoint_interval_steps=2 if checkpoint_dir else 0,
        reduction=messages.Reduction.EXACT,
    )


def job(
    name: str, training_: messages.TrainingSettings, **changes: object
) -> job_settings.JobSettings:
    values: dict[str, object] = {
        "name": name,
        "workers": 3,
        "steps": 10,
        "micro_batch_size": 1,
        "training": training_,
        "fault_tolerance": 1,
        "policy": "dynamic",
        "heartbeat_interval_s": 0.1,
        "heartbeat_timeout_s": 3.0,
        "step_timeout_s": 10.0,
        "configure_timeout_s": 60.0,
    }
    values.update(changes)
    return job_settings.JobSettings(**values)  # type: ignore[arg-type]


class LocalJob:
    """The controller and the backend of one job (module docstring)."""

    def __init__(self, settings: job_settings.JobSettings, run_dir: Path, shm: Path) -> None:
        self.settings = settings
        self.backend = local_backend.LocalBackend(
            job=settings.name, run_dir=run_dir, snapshot_base=shm, keep_snapshots=True
        )
        self.controller = controller.Controller(settings, self.backend, clock=clock.RealClock())
        self.final_plan: plan.Plan | None = None

    @property
    def status(self) -> statuses.JobStatus:
        return self.controller.status

    async def until(
        self, check: Callable[[statuses.JobStatus], bool], timeout_s: float = 90.0
    ) -> None:
        """Wait until `check(status)` holds (TimeoutError past `timeout_s`)."""

        async def poll() -> None:
            while not check(self.status):
                await asyncio.sleep(POLL_S)

        await asyncio.wait_for(poll(), timeout_s)

    async def run(
        self, script: Callable[[LocalJob], Awaitable[None]] | None = None
    ) -> statuses.JobStatus:
        """Run the job to its end with `script` acting alongside; the backend is shut down.
        A script still waiting when the job ends fails the test at once (its failures were
        never injected) instead of waiting out its own timeout."""
        acting = asyncio.ensure_future(script(self)) if script else None
        try:
            final = await asyncio.wait_for(self._run(), RUN_TIMEOUT_S)
            if acting is not None and not acting.done():
                raise AssertionError(
                    f"the job ended ({final.phase.value} at step {final.step}) before the test "
                    "injected its failures"
                )
            if acting is not None:
                await acting
            return final
        finally:
            if acting is not None and not acting.done():
                acting.cancel()
            await self.backend.shutdown()

    async def _run(self) -> statuses.JobStatus:
        final = await self.controller.run()
        self.final_plan = self.controller.plan
        return final


def assert_like_reference(job_: LocalJob, shm: Path) -> None:
    """The final layer states (snapshot stores, last step) equal the fault-free reference's
    bitwise (`comparison.compare`, exact mode): parameters, AdamW moments and step counts."""
    settings, final = job_.settings, job_.final_plan
    assert final is not None
    got = runtime_states.read_final_states(settings.name, shm, final, settings.steps)
    want, _ = runtime_states.reference_states(
        settings.training, settings.micro_batch_size, settings.steps
    )
    found = comparison.compare(got, want)
    assert found.equal, found.describe()


def pipelined_profile(micro_batch_size: int) -> profile.Profile:
    """The tiny model's measured profile with a device too small for the whole model on one
    worker (85 % of its layers' memory), so every pipeline of a plan has 2 or more stages."""
    measured = profiler.measure_profile(shapes.named("tiny"), micro_batch_size, warmup=0, repeats=1)
    need = sum(layer.state_bytes + layer.activation_bytes for layer in measured.layers)
    return dataclasses.replace(measured, memory_bytes=int(need * 0.85))


@dataclasses.dataclass(frozen=True)
class Ran:
    """A `planaria run` of a job file: the job's name, its stdout, the recoveries of its
    recoveries.json that answered a lost worker, and the regroups (no worker failed: a step of
    the first epoch outran the step timeout on a loaded machine and the same plan regrouped; the
    final parameters are compared all the same)."""

    name: str
    stdout: str
    recoveries: list[dict[str, object]]
    regroups: list[dict[str, object]]


def run_job_file(workdir: Path, prefix: str, shm: Path, bound_s: float) -> Ran:
    """`planaria run job.yaml` in `workdir` as job `prefix`-random (its report in workdir/out,
    its snapshots under `shm`), its agents killed afterwards whatever happened; asserts it
    exited 0."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    argv = [sys.executable, "-m", "planaria", "run", "job.yaml", "--name", name, "--no-progress"]
    argv += ["--out", str(workdir / "out"), "--snapshot-base", str(shm)]
    try:
        done = subprocess.run(
            argv, cwd=workdir, capture_output=True, text=True, timeout=bound_s, check=False
        )
    finally:
        processes.kill(processes.agents_of(name))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    recorded = json.loads((workdir / "out" / "recoveries.json").read_text(encoding="utf-8"))
    assert all(r["kind"] == "restart" for r in recorded if not r["failed"]), recorded
    return Ran(
        name=name,
        stdout=done.stdout,
        recoveries=[r for r in recorded if r["failed"]],
        regroups=[r for r in recorded if not r["failed"]],
    )
