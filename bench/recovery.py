"""One worker lost, two ways back: Planaria's recovery vs restarting every worker from the
persistent checkpoint, end to end with real agent processes on this machine, for a data
parallel job and for a pipeline job, in one run.

    .venv/bin/python bench/recovery.py [--workers 6] [--steps 40] [--kill-step 20]
                                       [--out bench/results/recovery.json]

The two cases: "data parallel" (the tiny model fits one worker: the planner's plans are
pipelines of one stage) and "pipelines" (the job's device memory capped at 60 % of the tiny
model's training state, `JobSettings.device_memory_bytes`, so that every pipeline has two or
more stages and a survivor may wait on a peer point to point when the victim dies).

Planaria: the controller (`planaria.control.controller`) runs a tiny-GPT job on `--workers`
local agents (`planaria.local.backend`); once step `--kill-step` is committed one worker is
SIGKILLed. Measured: the time from the SIGKILL to the first step committed in the recovered
epoch, and the controller's breakdown of it (its `Recovery` record: detect, plan, regroup,
transfer, resume) with the bytes of layer state the agents transferred.

Restart from the checkpoint (what a job without Planaria does): stop every agent, start fresh
ones, Configure them with the same plan at resume step = the latest complete persistent
checkpoint (CHECKPOINT tier), and time until the first step after it is committed, and until
the step reached before the failure is committed again (the lost steps recomputed). Its
detection is taken as the controller's (the same heartbeat stream would see it).

Goals (issue #7): Planaria's recovery <= 2 s and >= 10x faster than the restart; transferred
bytes a fraction of the model's state. The model's state is every layer's parameters and AdamW
moments (fp32).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from planaria.agent.execution import profiler
from planaria.agent.runtime import runtime_states
from planaria.agent.state import checkpoints
from planaria.agent.training import data
from planaria.contract import plan as plans
from planaria.contract import rendezvous, shapes
from planaria.control import clock, controller, ports
from planaria.control import settings as job_settings
from planaria.control import status as statuses
from planaria.local import backend as local_backend
from planaria.wire import messages

SHM = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


def _settings(
    args: argparse.Namespace, corpus: Path, ckpt: Path, pipelines: bool
) -> job_settings.JobSettings:
    training = messages.TrainingSettings(
        model="tiny",
        seed=0,
        optimizer=messages.OptimizerSettings(lr=2e-3),
        global_batch_size=2 * args.workers,
        data=messages.DataSettings(corpus_paths=(str(corpus),)),
        device=messages.Device.CPU,
        snapshot_interval_steps=1,
        redundancy=messages.RedundancyMode.COPY,
        checkpoint_dir=str(ckpt),
        checkpoint_interval_steps=args.checkpoint_interval,
    )
    return job_settings.JobSettings(
        name="bench-recovery",
        workers=args.workers,
        steps=args.steps,
        micro_batch_size=1,
        training=training,
        fault_tolerance=1,
        policy="adaptive",
        device_memory_bytes=int(PIPELINE_MEMORY * _model_bytes()) if pipelines else None,
    )


PIPELINE_MEMORY = 0.6  # of the model's training state, per worker, in the pipelines case


def _model_bytes() -> int:
    """The tiny model's training state at micro-batch 1 as the profiler counts it."""
    measured = profiler.measure_profile(shapes.named("tiny"), 1, warmup=0, repeats=1)
    return sum(layer.state_bytes + layer.activation_bytes for layer in measured.layers)


class _Planaria:
    """The controller's run with one SIGKILL at the kill step."""

    def __init__(self, settings: job_settings.JobSettings, run_dir: Path, shm: Path) -> None:
        self.backend = local_backend.LocalBackend(
            job=settings.name, run_dir=run_dir, snapshot_base=shm, keep_snapshots=True
        )
        self.controller = controller.Controller(settings, self.backend, clock=clock.RealClock())
        self.checkpoints = Path(settings.training.checkpoint_dir)
        self.killed_at = 0.0
        self.kill_step = 0
        self.plan: plans.Plan | None = None

    async def run(self, kill_step: int, victim: plans.WorkerId) -> statuses.JobStatus:
        async def kill() -> None:
            while not (
                self.status.phase is statuses.Phase.RUNNING and self.status.step >= kill_step
            ):
                await asyncio.sleep(0.005)
            self.plan, self.kill_step = self.controller.plan, self.status.step
            # the checkpoints as they are at the failure (later epochs write and prune more)
            shutil.copytree(self.checkpoints, self.checkpoints.with_name("at-failure"))
            self.killed_at = time.monotonic()
            self.backend.kill(victim)

        acting = asyncio.ensure_future(kill())
        try:
            return await self.controller.run()
        finally:
            acting.cancel()
            await self.backend.shutdown()

    @property
    def status(self) -> statuses.JobStatus:
        return self.controller.status

    def first_step_after(self, epoch: int) -> float:
        """Seconds from the SIGKILL to the first step committed in `epoch`."""
        times = [r.at_s for r in self.controller.steps if r.epoch >= epoch]
        return min(times) - self.killed_at


async def _restart_all(
    settings: job_settings.JobSettings,
    running: plans.Plan,
    resume: int,
    reached: int,
    run_dir: Path,
) -> dict[str, float | str]:
    """Fresh agents for every worker of `running`, resumed from checkpoint step `resume`."""
    shm = Path(tempfile.mkdtemp(prefix="bench-restart-", dir=SHM))
    backend = local_backend.LocalBackend(job="bench-restart", run_dir=run_dir, snapshot_base=shm)
    workers = sorted(running.workers)
    started = time.monotonic()
    try:
        await backend.start(workers)
        launched = time.monotonic()
        agents = [await backend.connect(w, timeout_s=30.0) for w in workers]
        acks = await asyncio.gather(
            *(
                a.configure(_config(settings, running, backend.store, w, resume, reached))
                for a, w in zip(agents, workers, strict=True)
            )
        )
        assert all(a.accepted for a in acks), [a.reason for a in acks]
        first, done, tier = await _watch(agents, resume + 1, reached)
        stop = time.monotonic()
        for agent in agents:
            await agent.close()
    finally:
        await backend.shutdown()
        shutil.rmtree(shm, ignore_errors=True)
    return {
        "start_s": launched - started,
        "first_step_s": first - started,
        "reached_s": done - started,
        "stop_s": time.monotonic() - stop,
        "tier": tier,
    }


def _config(
    settings: job_settings.JobSettings,
    running: plans.Plan,
    store: object,
    worker: plans.WorkerId,
    resume: int,
    stop: int,
) -> messages.WorkerConfig:
    ranked = sorted(running.workers)
    address = backend_store(store)
    return messages.WorkerConfig(
        epoch=1,
        worker=worker,
        plan=running,
        resume_step=resume,
        rendezvous=messages.Rendezvous(
            store_host=address[0],
            store_port=address[1],
            key_prefix=rendezvous.key_prefix(1),
            rank=ranked.index(worker),
            world_size=len(ranked),
            backend=settings.backend,
            timeout_s=settings.step_timeout_s,
        ),
        transfers=(),
        settings=settings.training,
        stop_step=stop,
    )


def backend_store(store: object) -> tuple[str, int]:
    host, port = getattr(store, "host"), getattr(store, "port")  # noqa: B009 - ports.StoreAddress
    return str(host), int(port)


async def _watch(
    agents: list[ports.Agent], first_step: int, reached: int
) -> tuple[float, float, str]:
    """When every agent committed `first_step`, when all reached `reached`, and their tier."""
    first: dict[int, float] = {}
    done: dict[int, float] = {}
    tiers: set[str] = set()

    async def one(agent: ports.Agent) -> None:
        async for beat in agent.watch(0.02):
            if beat.setup is not None:
                tiers.add(beat.setup.tier.value)
            if beat.state is messages.AgentState.FAILED:
                raise RuntimeError(f"worker {agent.worker} failed: {beat}")
            if beat.last_committed_step >= first_step:
                first.setdefault(agent.worker, time.monotonic())
            if beat.last_committed_step >= reached:
                done[agent.worker] = time.monotonic()
                return

    await asyncio.wait_for(asyncio.gather(*(one(a) for a in agents)), 300.0)
    return max(first.values()), max(done.values()), ",".join(sorted(tiers))


def _state_bytes(settings: job_settings.JobSettings, final: plans.Plan, shm: Path) -> int:
    states = runtime_states.read_final_states(settings.name, shm, final, settings.steps)
    kinds = ("parameters", "exp_avg", "exp_avg_sq")
    return sum(
        t.numel() * t.element_size() for s in states.values() for k in kinds for t in getattr(s, k)
    )


async def _bench(args: argparse.Namespace, work: Path, pipelines: bool) -> dict[str, object]:
    corpus = work / "corpus.txt"
    corpus.write_bytes(data.load_default_corpus(max_bytes=200_000).tobytes())
    settings = _settings(args, corpus, work / "checkpoints", pipelines)
    shm = Path(tempfile.mkdtemp(prefix="bench-recovery-", dir=SHM))
    try:
        planaria = _Planaria(settings, work / "run", shm)
        final = await planaria.run(args.kill_step, plans.WorkerId(args.victim))
        assert final.phase is statuses.Phase.SUCCEEDED, final.message
        victim = plans.WorkerId(args.victim)  # (a recovery before it, e.g. a step timeout
        # of an overloaded machine, is not the one measured)
        recovery = next(r for r in planaria.controller.recoveries if victim in r.failed)
        state_bytes = _state_bytes(settings, planaria.controller.plan or planaria.plan, shm)  # type: ignore[arg-type]
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    assert planaria.plan is not None
    at_failure = work / "at-failure"
    resume = max(checkpoints.checkpoint_steps(at_failure), default=0)
    shutil.rmtree(work / "checkpoints")
    at_failure.rename(work / "checkpoints")
    restart = await _restart_all(
        settings, planaria.plan, resume, planaria.kill_step, work / "restart"
    )
    return _figures(args, planaria, recovery, state_bytes, resume, restart)


def _figures(
    args: argparse.Namespace,
    planaria: _Planaria,
    recovery: statuses.Recovery,
    state_bytes: int,
    resume: int,
    restart: dict[str, float | str],
) -> dict[str, object]:
    to_first = planaria.first_step_after(recovery.epoch)
    restart_first = recovery.detect_s + float(restart["stop_s"]) + float(restart["first_step_s"])
    restart_reached = recovery.detect_s + float(restart["stop_s"]) + float(restart["reached_s"])
    return {
        "machine": f"{os.cpu_count()} CPU cores",
        "load_average": os.getloadavg(),
        "workers": args.workers,
        "plan": str([len(p.stages) for p in planaria.plan.pipelines]) if planaria.plan else "",
        "kill_step": planaria.kill_step,
        "planaria": {
            "kill_to_first_step_s": to_first,
            "tier": recovery.tier.value,
            "kind": recovery.kind,
            "detect_s": recovery.detect_s,
            "stop_s": recovery.stop_s,
            "plan_s": recovery.plan_s,
            "regroup_s": recovery.regroup_s,
            "transfer_s": recovery.transfer_s,
            "resume_s": recovery.resume_s,
            "total_s": recovery.total_s,
            "lost_steps": recovery.lost_steps,
            "transferred_bytes": recovery.transferred_bytes,
            "reason": recovery.reason,
        },
        "restart": {
            **restart,
            "checkpoint_step": resume,
            "detect_s": recovery.detect_s,
            "kill_to_first_step_s": restart_first,
            "kill_to_reached_s": restart_reached,
            "lost_steps": planaria.kill_step - resume,
        },
        "model_state_bytes": state_bytes,
        "speedup_first_step": restart_first / to_first,
        "speedup_reached": restart_reached / to_first,
    }


def _cell(value: object) -> str:
    return f"{value:10.3f}" if isinstance(value, float) else f"{'-':>10}"


def _table(result: dict[str, object]) -> str:
    p, r = result["planaria"], result["restart"]
    assert isinstance(p, dict) and isinstance(r, dict)
    moved, whole = int(p["transferred_bytes"]), int(str(result["model_state_bytes"]))
    rows = [
        (
            "SIGKILL -> first step after recovery",
            p["kill_to_first_step_s"],
            r["kill_to_first_step_s"],
        ),
        ("  detect", p["detect_s"], r["detect_s"]),
        ("  survivors stop their failed step", p["stop_s"], None),
        ("  plan", p["plan_s"], None),
        ("  regroup", p["regroup_s"], None),
        ("  transfer", p["transfer_s"], None),
        ("  resume (to the first step)", p["resume_s"], None),
        ("  stop every agent", None, r["stop_s"]),
        ("  start fresh agents", None, r["start_s"]),
        (
            "  configure + load checkpoint + 1 step",
            None,
            float(r["first_step_s"]) - float(r["start_s"]),
        ),
        (
            "SIGKILL -> step reached before the failure",
            p["kill_to_first_step_s"],
            r["kill_to_reached_s"],
        ),
    ]
    lines = [f"{'seconds':44} {'planaria':>10} {'restart all':>12}"]
    for name, a, b in rows:
        lines.append(f"{name:44} {_cell(a)} {_cell(b):>12}")
    lines += [
        f"plan at the failure (stages per pipeline): {result['plan']}",
        f"tier: planaria {p['tier']} ({p['kind']}), restart {r['tier']} (checkpoint step "
        f"{r['checkpoint_step']}, {r['lost_steps']} steps lost); killed at step "
        f"{result['kill_step']}",
        f"transferred {moved:,} B of a {whole:,} B model state ({100 * moved / whole:.1f} %)",
        f"speed-up: {result['speedup_first_step']:.1f}x to the first step, "
        f"{result['speedup_reached']:.1f}x to the step reached (goals: <= 2 s, >= 10x)",
    ]
    return "\n".join(lines)


CASES = {"data parallel": False, "pipelines": True}


def _side_by_side(result: dict[str, object]) -> str:
    lines = [f"{'SIGKILL -> first step, seconds':34} {'planaria':>10} {'restart all':>12}"]
    for case in CASES:
        found = result[case]
        assert isinstance(found, dict)
        p, r = found["planaria"], found["restart"]
        name = f"{case} {found['plan']}"
        lines.append(
            f"{name:34} {_cell(p['kill_to_first_step_s'])} {_cell(r['kill_to_first_step_s']):>12}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--kill-step", type=int, default=20)
    parser.add_argument("--victim", type=int, default=3)
    parser.add_argument("--checkpoint-interval", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench/results/recovery.json"))
    args = parser.parse_args()
    result: dict[str, object] = {}
    for case, pipelines in CASES.items():
        with tempfile.TemporaryDirectory(prefix="bench-recovery-") as folder:
            result[case] = found = asyncio.run(_bench(args, Path(folder), pipelines))
        print(f"== {case}\n{_table(found)}\n")
    print(_side_by_side(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
