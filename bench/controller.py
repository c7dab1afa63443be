"""Benchmark: the controller's decision time after a death (`Recovery.plan_s`), per policy.

`planaria.control.planning.Planner.recover` is what the controller runs between noticing a
death and sending the Configures: for `adaptive`, Odyssey eq. 8 over rerouting, the DP/PP
candidates and Oobleck's reinstantiations (given layouts), plus min-cost binding and transfer
restriction; for `dynamic`, Oobleck's reinstantiation and the binding; for `reroute`, ReCycle's
layout. Jobs: the `small` model (10 planner layers) at 30 MiB per GPU on 8 workers (the
controller tests' job, [2,2,2,2]) and GPT-3 2.7B (34 layers, A100-40GB) on 32 workers, one GPU
per node, fault tolerance 1. Each run fails a different worker of the templates' best plan.

- cold: a fresh Planner per decision (templates built outside the timing);
- warm: `Planner.prepare(plan)` ran first (the controller does it after every epoch opens).

Prints median / min / max milliseconds per (job, policy, cold|warm) and writes
bench/results/controller.json.

    .venv/bin/python bench/controller.py [--runs N]

How long the controller holds its event loop (`--loop-lag`): a probe coroutine sleeps 10 ms
at a time and records how late it wakes (about the longest anything held the loop meanwhile),
per window of the controller's phases (its INFO log): the first plan (from the profile's
request, else the start, to epoch 1 running: the templates, the first plan, the search ahead),
each recovery (from Recovering to the next epoch running: the decision), a scale-up (from a
worker's return to the next epoch running: the planner's new plan, then the switch), and
elsewhere; with what held the loop (`LagProbe`: sampled stacks; "-" for a hold too short to
sample or one in C code that kept the GIL, which no Python thread can sample).
- `--loop-lag demo [JOB.yaml]`: `planaria run` (examples/tiny-job.yaml) in this process, as
  the user runs it. Run it with an older tree first on PYTHONPATH (`git archive <commit>
  operator | tar -x -C DIR`, PYTHONPATH=DIR/operator) for the figures before.
- `--loop-lag fake [--before DIR]`: the controller with the controller tests' in-memory agents
  (tests/control/fakes.py) in real time, GPT-3 2.7B on 32 workers (the decision-time job
  above), one death at step 30 and that worker's return at step 60 (a scale-up), `--lag-runs`
  times per case, alternating, each in a fresh process: the planner on its thread and inline
  on the loop (`executors.Inline`); with `--before`, also the tree in DIR/operator as it was.
- `--loop-lag calls`: the planner's questions of a scale-up (`grow`), a resume from Suspended
  (`best`) and a preemption notice's move (`recover`, after the search ahead) at 1,024 nodes
  of 8 GPUs (GPT-3 6.7B on A100-80GB, f = 1, adaptive), more than the in-memory agents run in
  real time here: each asked `--lag-runs` times as a plain call on the loop (where switches
  and suspension asked before) and through `Planner.call` on the job's planner thread
  (where they ask now), alternating, in this process; the longest hold of the loop while each
  call ran, and the call's wall time. Writes bench/results/controller_loop_lag_calls.json.
- `--loop-lag configs`: that scale-up's switch Configures (`epochs.configs` over `grow`'s
  move, built on the loop): `--lag-runs` timings of all of them, the copies' and sources'
  counts, and the per-worker filter `configs` used before it indexed the copies, timed on
  `--sample` workers (all 8,192 would take hours with every holder a source). Printed only.
Writes bench/results/controller_loop_lag.json.

    .venv/bin/python -m bench.controller --loop-lag fake --before DIR   # from the repo root
    .venv/bin/python -m bench.controller --loop-lag demo
    .venv/bin/python -m bench.controller --loop-lag calls --lag-runs 3
    .venv/bin/python -m bench.controller --loop-lag configs --lag-runs 3 --sample 4
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path

from planaria.cli import main as cli
from planaria.contract import plan as plans
from planaria.contract import profile, shapes
from planaria.control import clock, controller, epochs, executors, planning, ports, settings, status
from planaria.planner import accelerators, synthetic, transfers
from planaria.wire import messages

RESULTS = Path(__file__).parent / "results" / "controller.json"
LAG_RESULTS = Path(__file__).parent / "results" / "controller_loop_lag.json"
CALLS_RESULTS = Path(__file__).parent / "results" / "controller_loop_lag_calls.json"
DEMO_JOB = Path(__file__).parent.parent / "examples" / "tiny-job.yaml"
HOUR_S = 3600.0
PROBE_S = 0.01  # the lag probe's sleep
HOLD_S = 0.05  # the probe this overdue: the watchdog samples what holds the loop
WATCH_S = 0.02  # the watchdog's period
FAKE_KILL_STEP = 30
FAKE_JOIN_STEP = 60  # the killed worker is back: a scale-up
CALLS_NODES, CALLS_GPUS = 1024, 8  # --loop-lag calls: the cluster scale of issue #17
PLANNERS = ("thread", "inline")  # inline: on the loop, as before the planner had a thread


def _job(
    name: str, workers: int, batch: int, source: profile.Profile, policy: str
) -> settings.JobSettings:
    training = messages.TrainingSettings(
        model=name,
        seed=1,
        optimizer=messages.OptimizerSettings(lr=1e-3),
        global_batch_size=batch,
        data=messages.DataSettings(corpus_paths=("corpus.txt",)),
        device=messages.Device.CPU,
        snapshot_interval_steps=1,
        redundancy=messages.RedundancyMode.XOR,
        precision=source.precision,  # a job plans with a profile of its own arithmetic
    )
    return settings.JobSettings(
        name=name,
        workers=workers,
        steps=100,
        micro_batch_size=source.micro_batch_size,
        training=training,
        policy=policy,
        profile=source,
    )


def _jobs() -> list[tuple[str, int, int, profile.Profile]]:
    small = synthetic.synthesize(shapes.named("small"), accelerators.named("a100-80gb"), 2, 1)
    gpt = synthetic.synthesize(shapes.named("gpt3-2.7b"), accelerators.named("a100-40gb"), 1, 1)
    return [
        ("small", 8, 16, dataclasses.replace(small, memory_bytes=30 * 2**20)),
        ("gpt3-2.7b", 32, 256, gpt),
    ]


def _time(planner: planning.Planner, running: plans.Plan, worker: plans.WorkerId) -> float:
    start = time.perf_counter()
    planner.recover(running, {worker}, set(), HOUR_S)
    return (time.perf_counter() - start) * 1e3


def measure(runs: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for name, workers, batch, source in _jobs():
        for policy in settings.Policy:
            job = _job(name, workers, batch, source, policy.value)
            running = (
                planning.Planner(source, job)
                .best([plans.WorkerId(w) for w in range(workers)], status.MoveKind.INITIAL)
                .plan
            )
            victims = [running.workers[(i * 7) % len(running.workers)] for i in range(runs)]
            cold = [_time(planning.Planner(source, job), running, w) for w in victims]
            warm_planner = planning.Planner(source, job)
            warm_planner.prepare(running)
            warm = [_time(warm_planner, running, w) for w in victims]
            for case, values in (("cold", cold), ("warm", warm)):
                rows.append(
                    {
                        "job": name,
                        "workers": workers,
                        "plan": [len(p.workers) for p in running.pipelines],
                        "policy": policy.value,
                        "case": case,
                        "median_ms": statistics.median(values),
                        "min_ms": min(values),
                        "max_ms": max(values),
                    }
                )
    return rows


class LagProbe:
    """How late a PROBE_S sleep wakes on the running loop (`holds`: loop time at waking,
    seconds late, what held the loop), and the controller's phase messages with their times.
    What held it: a watchdog thread samples the loop thread's stack every WATCH_S while the
    probe is overdue by HOLD_S, and names the innermost frame of our code and the library
    below it (`_holder`); "-" when no sample was taken (a hold under HOLD_S + WATCH_S)."""

    def __init__(self) -> None:
        self.holds: list[tuple[float, float, str]] = []
        self.phases: list[tuple[float, str]] = []
        self._since = time.monotonic()  # the probe's last wake (asyncio's loops: monotonic)
        self._seen: dict[float, collections.Counter[str]] = {}
        self._loop_thread = threading.get_ident()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start probing `loop` (call on its thread)."""
        self._loop_thread = threading.get_ident()
        loop.create_task(self._probe())
        threading.Thread(target=self._watch, name="lag-watchdog", daemon=True).start()
        logger = logging.getLogger(controller.__name__)
        logger.setLevel(logging.INFO)
        logger.addHandler(_Phases(self.phases, loop))

    def mark(self, what: str) -> None:
        """Note `what` happened now (on the loop's thread), opening its window (`windows`)."""
        self.phases.append((time.monotonic(), what))

    async def _probe(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._since = before = loop.time()
            await asyncio.sleep(PROBE_S)
            now = loop.time()
            seen = self._seen.pop(before, None)
            holder = seen.most_common(1)[0][0] if seen else "-"
            self.holds.append((now, now - before - PROBE_S, holder))

    def _watch(self) -> None:
        while True:
            time.sleep(WATCH_S)
            since = self._since
            frame = sys._current_frames().get(self._loop_thread)
            if frame is not None and time.monotonic() - since > PROBE_S + HOLD_S:
                self._seen.setdefault(since, collections.Counter())[_holder(frame)] += 1

    def windows(self) -> dict[str, dict[str, object]]:
        """The longest hold (ms, and what held the loop) in each window of the phases (module
        docstring), elsewhere, and overall."""
        bounds: list[tuple[str, float, float]] = []
        # the first plan: from the profile's request (else the start) to epoch 1 running
        start = self.holds[0][0] - PROBE_S if self.holds else 0.0
        opened: tuple[str, float] | None = ("first plan", start)
        for at, message in self.phases:
            if message.startswith("Profiling") and not bounds:
                opened = ("first plan", at)
            elif opened is None and message == "Joined":
                opened = ("scale-up", at)
            elif opened is None and message.startswith("Recovering"):
                opened = (f"recovery {len(bounds)}", at)
            elif opened is not None and message.startswith("Running"):
                bounds.append((opened[0], opened[1], at))
                opened = None
        found = {name: _longest(self.holds, lo, hi) for name, lo, hi in bounds}
        outside = [h for h in self.holds if not any(lo <= h[0] <= hi for _, lo, hi in bounds)]
        found["elsewhere"] = _longest(outside, float("-inf"), float("inf"))
        found["overall"] = _longest(self.holds, float("-inf"), float("inf"))
        return found


class _Phases(logging.Handler):
    def __init__(self, into: list[tuple[float, str]], loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(logging.INFO)
        self._into, self._loop = into, loop

    def emit(self, record: logging.LogRecord) -> None:
        self._into.append((self._loop.time(), record.getMessage()))


def _longest(holds: list[tuple[float, float, str]], lo: float, hi: float) -> dict[str, object]:
    """The longest hold woken in [lo, hi] or just after hi (a hold that ends the window is
    seen by the next wake): {"ms": .., "held_by": ..}."""
    inside = [h for h in holds if lo <= h[0] <= hi] + [h for h in holds if h[0] > hi][:1]
    top = max(inside, key=lambda h: h[1], default=(0.0, 0.0, "-"))
    return {"ms": round(top[1] * 1e3, 1), "held_by": top[2]}


def _holder(frame: types.FrameType) -> str:
    """What a stack is doing: the library of its innermost frames outside our code, the
    innermost frame of our code, and of the controller core ("torch <- planaria.local.backend.
    store", "planaria.planner.stage_dp.fill in planaria.control.planning._prepare")."""
    below, ours, core = "", "", ""
    for summary in reversed(traceback.extract_stack(frame)):
        path = summary.filename
        if "/planaria/" in path and "site-packages" not in path:
            module = path.rsplit("/planaria/", 1)[1].removesuffix(".py").replace("/", ".")
            ours = ours or f"planaria.{module}.{summary.name}"
            if module.startswith("control."):
                core = f"planaria.{module}.{summary.name}"
                break
        elif not ours and not below and "site-packages/" in path:
            below = path.split("site-packages/", 1)[1].split("/", 1)[0]
        elif not ours and not below and "importlib" in path:
            below = "import"
    held = f"{below} <- {ours}" if below else ours or "-"
    return held if core in ("", ours) else f"{held} in {core}"


class _ProbedPolicy(asyncio.DefaultEventLoopPolicy):
    """Every new loop (`asyncio.run` in `planaria run`) starts `probe` first."""

    def __init__(self, probe: LagProbe) -> None:
        super().__init__()
        self._probe = probe

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        loop = super().new_event_loop()
        loop.call_soon(self._probe.start, loop)
        return loop


def lag_demo(job: Path) -> dict[str, object]:
    """`planaria run job` in this process with the probe on its loop."""
    probe = LagProbe()
    asyncio.set_event_loop_policy(_ProbedPolicy(probe))
    with tempfile.TemporaryDirectory() as out:
        code = cli.main(["run", str(job), "--out", out, "--no-progress"])
    asyncio.set_event_loop_policy(None)
    return {"case": "demo", "job": str(job), "exit": code, "longest_ms": probe.windows()}


def lag_fake(runs: int, before: Path | None) -> list[dict[str, object]]:
    """The controller on the in-memory agents (module docstring), `runs` times per case,
    alternating, each run in a fresh process (a process's first planner pays imports and
    warm-up that a second would not)."""
    cases = [(p, os.environ.get("PYTHONPATH", "")) for p in PLANNERS]
    if before is not None:
        cases.insert(0, ("before", str(before / "operator")))
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs * len(cases)):
            (planner, path), row = cases[i % len(cases)], Path(tmp) / f"{i}.json"
            command = ["-m", "bench.controller", "--loop-lag", "fake", "--planner", planner]
            env = {**os.environ, "PYTHONPATH": path}
            subprocess.run([sys.executable, *command, "--row", str(row)], check=True, env=env)
            rows.append(json.loads(row.read_text()))
    return rows


def lag_fake_once(planner: str) -> dict[str, object]:
    """One run of `lag_fake` in this process: "before" builds the controller as an older
    tree takes it (no executor), "thread" with its default one, "inline" with `Inline`."""
    probe = LagProbe()
    final = asyncio.run(_fake_run(probe, planner))
    return {
        "case": f"fake gpt3-2.7b x 32, planner {planner}",
        "final": f"{final.phase} step {final.step} epoch {final.epoch}: {final.message}",
        "longest_ms": probe.windows(),
    }


async def _fake_run(probe: LagProbe, planner: str) -> status.JobStatus:
    from tests.control import fakes  # the tests' agents: `python -m bench.controller`

    probe.start(asyncio.get_running_loop())
    name, workers, batch, source = _jobs()[1]
    job = dataclasses.replace(
        _job(name, workers, batch, source, settings.Policy.ADAPTIVE.value),
        heartbeat_timeout_s=3.0,
        step_timeout_s=10.0,
        configure_timeout_s=60.0,
    )
    real = clock.RealClock()
    cluster = fakes.FakeCluster(real, step_s=0.1)

    def kill_then_join(step: int) -> None:
        if step == FAKE_KILL_STEP:
            cluster.kill(5)
        elif step == FAKE_JOIN_STEP and not cluster.agent(5).alive:
            cluster.on_step = None
            probe.mark("Joined")
            cluster.join(5)

    cluster.on_step = kill_then_join
    if planner != "inline":  # "before": an older tree's controller has no executor to give
        return await controller.Controller(job, cluster, clock=real).run()
    return await controller.Controller(job, cluster, clock=real, executor=executors.Inline()).run()


def _cluster_job() -> tuple[profile.Profile, settings.JobSettings]:
    """The 1,024 x 8 job of `--loop-lag calls` and `configs`: GPT-3 6.7B on A100-80GB, f = 1."""
    source = synthetic.synthesize(
        shapes.named("gpt3-6.7b"), accelerators.named("a100-80gb"), 1, CALLS_GPUS
    )
    job = dataclasses.replace(
        _job("gpt3-6.7b", CALLS_NODES * CALLS_GPUS, 1024, source, "adaptive"),
        gpus_per_node=CALLS_GPUS,
        fault_tolerance=1,
        steps=1000,
    )
    return source, job


def lag_calls(runs: int) -> list[dict[str, object]]:
    """`--loop-lag calls` (module docstring): rows of (call, where asked, hold and call ms)."""
    source, job = _cluster_job()
    transfers.load_solver()  # the job's start preloads it (planning.preload): not timed
    pool = executors.thread(job.name)
    try:
        return asyncio.run(_ask_calls(planning.Planner(source, job, pool), job, runs))
    finally:
        pool.shutdown(wait=True)


async def _ask_calls(
    planner: planning.Planner, job: settings.JobSettings, runs: int
) -> list[dict[str, object]]:
    probe = LagProbe()
    probe.start(asyncio.get_running_loop())
    everyone = [plans.WorkerId(w) for w in range(job.workers)]
    node_5 = range(5 * job.gpus_per_node, 6 * job.gpus_per_node)
    shrunk = planner.best([w for w in everyone if w not in node_5], status.MoveKind.INITIAL)
    running = planner.best(everyone, status.MoveKind.INITIAL).plan
    planner.prepare(running)  # the search ahead, as after every epoch opens
    await planner.ready()
    calls: dict[str, tuple[object, ...]] = {
        "scale-up (grow)": (planner.grow, shrunk.plan, set(everyone)),
        "resume (best)": (planner.best, everyone, status.MoveKind.RESUME),
    }
    asked = ("on the loop", "planner thread")
    cases = [(name, where) for name in (*calls, "preemption notice (recover)") for where in asked]
    found: dict[tuple[str, str], tuple[list[float], list[float]]] = {
        case: ([], []) for case in cases
    }
    for i in range(runs):
        noticed = {plans.WorkerId((7919 * i + 3) % job.workers)}
        calls["preemption notice (recover)"] = (
            planner.recover,
            running,
            noticed,
            set(),
            HOUR_S,
            job.steps // 2,
        )
        for name, where in cases:
            fn, *args = calls[name]
            assert callable(fn)
            hold_ms, call_ms = await _held(probe, planner, where == asked[0], fn, args)
            found[name, where][0].append(hold_ms)
            found[name, where][1].append(call_ms)
    return [
        {"call": name, "asked": where, "hold_ms": holds, "call_ms": took}
        for (name, where), (holds, took) in found.items()
    ]


async def _held(
    probe: LagProbe,
    planner: planning.Planner,
    on_loop: bool,
    fn: Callable[..., object],
    args: list[object],
) -> tuple[float, float]:
    """The longest hold of the loop while `fn(*args)` ran (ms), and its wall time (ms)."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(5 * PROBE_S)  # the probe sleeps again before the call starts
    start = loop.time()
    if on_loop:
        fn(*args)
    else:
        await planner.call(fn, *args)
    end = loop.time()
    await asyncio.sleep(5 * PROBE_S)  # the probe's wake after the call ends the window
    hold = _longest(probe.holds, start, end)["ms"]
    assert isinstance(hold, float)
    return hold, round((end - start) * 1e3, 1)


def lag_configs(runs: int, sample: int) -> None:
    """`--loop-lag configs` (module docstring): prints what it measures."""
    source, job = _cluster_job()
    transfers.load_solver()
    planner = planning.Planner(source, job, executors.Inline())
    everyone = [plans.WorkerId(w) for w in range(job.workers)]
    node_5 = range(5 * job.gpus_per_node, 6 * job.gpus_per_node)
    shrunk = planner.best([w for w in everyone if w not in node_5], status.MoveKind.INITIAL)
    start = time.perf_counter()
    move = planner.grow(shrunk.plan, set(everyone))
    grow_s = time.perf_counter() - start
    copies = move.transfers
    sources = [len(t.sources) for t in copies]
    print(
        f"grow {grow_s:.1f} s, {len(copies)} copies, sources per copy max {max(sources, default=0)}"
        f" total {sum(sources)}"
    )
    store = ports.StoreAddress(host="127.0.0.1", port=29400)
    start = time.perf_counter()
    index = epochs.by_worker(copies)
    print(f"copies indexed by worker (one pass): {time.perf_counter() - start:.2f} s")
    for _ in range(runs):
        start = time.perf_counter()
        built = epochs.configs(
            epoch=2, plan=move.plan, transfers=copies, resume_step=10, job=job, store=store
        )
        took = time.perf_counter() - start
        most = max(len(c.transfers) for c in built.values())
        print(f"epochs.configs, all {len(built)} workers: {took:.2f} s (most copies: {most})")
    picked = move.plan.workers[:: max(1, len(move.plan.workers) // max(1, sample))][:sample]
    ranks = {w: r for r, w in enumerate(sorted(move.plan.workers))}
    for worker in picked:
        start = time.perf_counter()
        mine = tuple(t for t in copies if worker == t.destination or worker in t.sources)
        filtered = time.perf_counter() - start
        assert mine == tuple(index.get(worker, ()))
        start = time.perf_counter()
        _one_config(worker, ranks[worker], move.plan, mine, job, store)
        checked = time.perf_counter() - start
        print(
            f"worker {worker}: {len(mine)} copies; the old filter {filtered:.3f} s, "
            f"its WorkerConfig (checks every copy) {checked:.3f} s"
        )
    print(f"load average {os.getloadavg()}")


def _one_config(
    worker: plans.WorkerId,
    rank: int,
    plan: plans.Plan,
    mine: tuple[plans.LayerTransfer, ...],
    job: settings.JobSettings,
    store: ports.StoreAddress,
) -> messages.WorkerConfig:
    """One worker's Configure as `epochs.configs` builds it, given its copies."""
    return messages.WorkerConfig(
        epoch=2,
        worker=worker,
        plan=plan,
        resume_step=10,
        rendezvous=messages.Rendezvous(
            store_host=store.host,
            store_port=store.port,
            key_prefix="epoch-2",
            rank=rank,
            world_size=len(plan.workers),
            backend=job.backend,
            timeout_s=job.step_timeout_s,
        ),
        transfers=mine,
        settings=job.training,
        stop_step=job.steps,
    )


def _print_calls(rows: list[dict[str, object]]) -> None:
    for row in rows:
        holds, took = row["hold_ms"], row["call_ms"]
        print(f"{row['call']:<28} {row['asked']:<15} longest hold ms {holds}  call ms {took}")


def _print_lags(rows: list[dict[str, object]]) -> None:
    for row in rows:
        print(row["case"], row.get("final", f"exit {row.get('exit')}"))
        longest = row["longest_ms"]
        assert isinstance(longest, dict)
        for window, hold in longest.items():
            print(f"  {window:<12} longest loop hold {hold['ms']:8.1f} ms  {hold['held_by']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="decisions per case (default 5)")
    parser.add_argument(
        "--loop-lag",
        choices=("demo", "fake", "calls", "configs"),
        help="measure how long the controller holds its event loop (module docstring)",
    )
    parser.add_argument("--lag-runs", type=int, default=2, help="--loop-lag fake's, per planner")
    parser.add_argument("--before", type=Path, help="--loop-lag fake: an older tree (DIR)")
    parser.add_argument(
        "--planner", choices=("before", *PLANNERS), help="--loop-lag fake: one run, this one"
    )
    parser.add_argument("--row", type=Path, help="--planner: write its row here")
    parser.add_argument(
        "--sample", type=int, default=4, help="--loop-lag configs: workers the old filter times"
    )
    parser.add_argument("job", nargs="?", type=Path, default=DEMO_JOB, help="--loop-lag demo's")
    args = parser.parse_args()
    if args.planner is not None:
        args.row.write_text(json.dumps(lag_fake_once(args.planner)))
        return
    if args.loop_lag == "configs":
        lag_configs(args.lag_runs, args.sample)
        return
    if args.loop_lag == "calls":
        rows = lag_calls(args.lag_runs)
        _print_calls(rows)
        CALLS_RESULTS.parent.mkdir(parents=True, exist_ok=True)
        CALLS_RESULTS.write_text(json.dumps({"load_average": os.getloadavg(), "rows": rows}))
        print(f"wrote {CALLS_RESULTS}")
        return
    if args.loop_lag is not None:
        if args.loop_lag == "fake":
            lags = lag_fake(args.lag_runs, args.before)
        else:
            lags = [lag_demo(args.job)]
        _print_lags(lags)
        LAG_RESULTS.parent.mkdir(parents=True, exist_ok=True)
        LAG_RESULTS.write_text(json.dumps(lags, indent=2))
        print(f"wrote {LAG_RESULTS}")
        return
    rows = measure(args.runs)
    head = ("job", "workers", "policy", "case", "median ms", "min", "max")
    print("{:<10} {:>7} {:<9} {:<5} {:>10} {:>8} {:>8}".format(*head))
    for r in rows:
        print(
            f"{r['job']:<10} {r['workers']:>7} {r['policy']:<9} {r['case']:<5} "
            f"{r['median_ms']:>10.1f} {r['min_ms']:>8.1f} {r['max_ms']:>8.1f}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"time_to_failure_s": HOUR_S, "rows": rows}, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
