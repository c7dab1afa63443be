"""Benchmark: the schedule executor against torch's DDP, and against the time estimator.

1. Symmetric data parallelism: 2 workers, each the whole model, 4 micro-batches of 4 samples
   per worker per step. Our executor (planaria.agent.harness.local_cluster) and torch's
   DistributedDataParallel (gloo, same number of processes, model, data, per-layer AdamW;
   DDP's average turned into a sum by scaling the loss with the world size) run in rounds,
   one after the other; the table gives samples/s of each (medians) and the median over
   rounds of their ratio (goal: ours within 10%), plus the largest parameter difference
   between the two (they train the same thing). Wall time on a shared machine is noisy, so
   the same comparison is also made in CPU seconds, each as the one rank of a group in this
   process, stepped in alternation: what the executor itself costs against DDP.
2. The estimator: per plan (pipeline, data-parallel, heterogeneous, rerouted), rounds of
   (measure profiles with `profiler.measure_profile`, one thread; predict the step with
   `estimator.estimate_step`; run the plan, a process per worker running the executor
   directly, one torch thread each); the table gives the medians of the measured and
   predicted seconds and of the rounds' errors (goal: <= 5%). Two predictions: from a profile
   measured alone in this process, and from per-layer medians of profiles measured by as
   many processes at once as the plan has workers. The estimator assumes a device per
   worker; on a machine with few cores shared with other work a worker runs as fast as the
   concurrent profile says, not the lone one. A second table splits the step by kind of
   instruction, summed over the workers: the executor's StepResult.seconds (a receive, an
   all-reduce and the optimizer step, which holds the commit barrier, include their waits)
   against the estimator's WorkerTime.seconds, counted alike, from the alone profile; and the
   time outside instructions, which the estimator does not model.

Step time of a run: per worker the median over the measured steps (after warm-up steps) of
its step wall time; the run's step time is the slowest worker's (steps are back to back, so
that is the period). Writes bench/results/executor.json, with the machine's load average.

    .venv/bin/python bench/executor.py [--quick] [--max-workers N]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import multiprocessing
import os
import statistics
import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing import connection
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d
from torch.nn.parallel import DistributedDataParallel

from planaria.agent.execution import executor, groups, held_layers, profiler
from planaria.agent.harness import local_cluster, run_results
from planaria.agent.training import data, model, semantics
from planaria.contract import instructions, plan, profile, schedule, shapes
from planaria.planner import estimator
from planaria.wire import messages

RESULTS = Path(__file__).parent / "results" / "executor.json"
SHAPE = shapes.named("small")
MICRO_BATCH = 4
SEED = 0
WARMUP_STEPS = 2
CORES = len(os.sched_getaffinity(0))
Stages = list[tuple[int, int, tuple[int, ...]]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    rounds: int
    steps: int
    profile_repeats: int


def make_plan(*pipelines: tuple[Stages, int], reroutes: tuple[plan.Reroute, ...] = ()) -> plan.Plan:
    return plan.Plan(
        pipelines=tuple(
            plan.Pipeline(
                stages=tuple(
                    plan.Stage(layer_start=a, layer_stop=b, workers=tuple(map(plan.WorkerId, ws)))
                    for a, b, ws in stages
                ),
                num_micro_batches=n,
            )
            for stages, n in pipelines
        ),
        micro_batch_size=MICRO_BATCH,
        reroutes=reroutes,
    )


L = SHAPE.num_planner_layers  # 10 for "small": embedding, 8 blocks, head
DATA_PARALLEL = make_plan(([(0, L, (0,))], 4), ([(0, L, (1,))], 4))
ONE_WORKER = make_plan(([(0, L, (0,))], 4))
ESTIMATED = {
    "pipeline of 2 stages": make_plan(([(0, 5, (0,)), (5, L, (1,))], 8)),
    "data parallel 2x1": DATA_PARALLEL,
    "heterogeneous [2, 1]": make_plan(([(0, 5, (0,)), (5, L, (1,))], 4), ([(0, L, (2,))], 2)),
    "rerouted 2x2, one stage lost": make_plan(
        ([(0, 5, (0,)), (5, L, (1,))], 4),
        ([(0, 5, (2,)), (5, L, ())], 4),
        reroutes=(plan.Reroute(pipeline=1, stage=1, peer_pipeline=0, micro_batches=(0, 1, 2, 3)),),
    ),
    "heterogeneous [3, 2]": make_plan(
        ([(0, 3, (0,)), (3, 7, (1,)), (7, L, (2,))], 4), ([(0, 5, (3,)), (5, L, (4,))], 4)
    ),
}


def config_for(p: plan.Plan) -> semantics.TrainingConfig:
    return semantics.TrainingConfig(
        shape=SHAPE, seed=SEED, global_batch_size=p.global_batch_size, micro_batch_size=MICRO_BATCH
    )


def period_s(step_s: Sequence[Sequence[float]]) -> float:
    """The slowest worker's median step time over the measured (post-warm-up) steps."""
    return max(statistics.median(steps[WARMUP_STEPS:]) for steps in step_s)


# --- 1. ours vs DDP ---------------------------------------------------------------------------


def run_ours(
    cluster: local_cluster.LocalCluster, p: plan.Plan, steps: int
) -> tuple[float, run_results.RunResult]:
    run = cluster.run(config_for(p), p, range(steps))
    if not run.ok:
        raise RuntimeError(f"executor run failed: {run.errors} lost {run.lost}")
    return period_s(list(run.step_s.values())), run


class DdpRank:
    """One DDP rank of `p` (pipelines of one stage): the whole model, one AdamW per layer,
    this rank's micro-batches of every step."""

    def __init__(self, p: plan.Plan, rank: int, tokens: data.Tokens) -> None:
        config = config_for(p)
        layers = model.build_layers(config.shape, config.seed)
        self.net = DistributedDataParallel(torch.nn.Sequential(*layers))
        self.optimizers = [model.make_optimizer(layer, config.optimizer) for layer in layers]
        self.job = semantics.Job.from_tokens(config, tokens)
        self.counts = [pipeline.num_micro_batches for pipeline in p.pipelines]
        self.rank = rank

    def step(self, step: int) -> float:
        """Train step `step`; returns its wall seconds."""
        started = time.perf_counter()
        mine = self.job.sampler.split(step, MICRO_BATCH, self.counts)[self.rank]
        for i, samples in enumerate(mine):
            inputs, targets = self.job.dataset.batch(samples)
            last = i == len(mine) - 1
            with contextlib.nullcontext() if last else self.net.no_sync():
                logits = self.net(inputs)
                loss = model.micro_batch_loss(logits, targets, self.job.config.global_batch_size)
                torch.autograd.backward(loss * len(self.counts))  # DDP averages; we sum
        for optimizer in self.optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - started


def ddp_worker(
    rank: int, port: int, tokens: data.Tokens, steps: int, results: connection.Connection
) -> None:
    """A DDP process of DATA_PARALLEL: train, then send the step times and the parameters."""
    torch.set_num_threads(1)
    store = c10d.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=60))
    world = len(DATA_PARALLEL.pipelines)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    ddp = DdpRank(DATA_PARALLEL, rank, tokens)
    times = [ddp.step(step) for step in range(steps)]
    # numpy, not tensors: torch would pass tensors as shared memory this process then frees
    results.send((times, [p.detach().numpy().copy() for p in ddp.net.module.parameters()]))
    dist.destroy_process_group()


def run_ddp(tokens: data.Tokens, steps: int) -> tuple[float, list[npt.NDArray[np.float32]]]:
    context = multiprocessing.get_context("forkserver")
    store = c10d.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=60), False)
    pipes = [context.Pipe(duplex=False) for _ in DATA_PARALLEL.pipelines]
    processes = [
        context.Process(target=ddp_worker, args=(rank, store.port, tokens, steps, pipe[1]))
        for rank, pipe in enumerate(pipes)
    ]
    for process in processes:
        process.start()
    outputs = [pipe[0].recv() for pipe in pipes]
    for process in processes:
        process.join()
    return period_s([times for times, _ in outputs]), outputs[0][1]


def compare_with_ddp(
    cluster: local_cluster.LocalCluster, tokens: data.Tokens, settings: Settings
) -> dict[str, float]:
    """Rounds of (ours, DDP) back to back; the ratio is the median of the rounds' ratios, since
    the two runs of a round see about the same load from whatever else runs here."""
    ours, theirs, difference = [], [], 0.0
    for _ in range(settings.rounds):
        period, run = run_ours(cluster, DATA_PARALLEL, settings.steps)
        ours.append(period)
        period, parameters = run_ddp(tokens, settings.steps)
        theirs.append(period)
        difference = max(difference, max_difference(run, parameters))
    samples = DATA_PARALLEL.global_batch_size
    return {
        "samples_per_step": samples,
        "ours_samples_per_s": samples / statistics.median(ours),
        "ddp_samples_per_s": samples / statistics.median(theirs),
        "ours_over_ddp": statistics.median(t / o for o, t in zip(ours, theirs, strict=True)),
        "max_parameter_difference": difference,
    }


def max_difference(
    run: run_results.RunResult, ddp_parameters: Sequence[npt.NDArray[np.float32]]
) -> float:
    ours = [p for i in range(SHAPE.num_planner_layers) for p in run.layer_state(i).parameters]
    pairs = zip(ours, ddp_parameters, strict=True)
    return max((a - torch.from_numpy(b)).abs().max().item() for a, b in pairs)


def compare_cpu_in_process(tokens: data.Tokens, settings: Settings) -> dict[str, float]:
    """CPU seconds per step of the executor and of DDP, both as the one rank of a group in this
    process, stepped in alternation: what each costs by itself, whatever else loads the machine
    (process CPU time, not wall time)."""
    torch.set_num_threads(1)
    store = c10d.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=60), False)
    epoch = groups.form_epoch(store, 1, 0, 1, messages.Backend.GLOO, 60.0)
    try:
        sched = schedule.compile_schedule(ONE_WORKER)
        config = config_for(ONE_WORKER)
        layers = held_layers.HeldLayers.build(config, range(SHAPE.num_planner_layers))
        job = semantics.Job.from_tokens(config, tokens)
        ours = executor.Executor(
            job=job, sched=sched, worker=plan.WorkerId(0), epoch=epoch, layers=layers
        )
        ddp = DdpRank(ONE_WORKER, 0, tokens)
        steppers: dict[str, Callable[[int], object]] = {"ours": ours.run_step, "ddp": ddp.step}
        times: dict[str, list[float]] = {name: [] for name in steppers}
        for step in range(settings.steps + WARMUP_STEPS):
            for name, run in steppers.items():
                started = time.process_time()
                run(step)
                times[name].append(time.process_time() - started)
    finally:
        groups.leave_epoch(epoch)
    ours_s, ddp_s = (statistics.median(times[n][WARMUP_STEPS:]) for n in ("ours", "ddp"))
    return {"ours_cpu_s": ours_s, "ddp_cpu_s": ddp_s, "ours_over_ddp": ddp_s / ours_s}


# --- 2. ours vs the estimator ------------------------------------------------------------------

Op = instructions.Op
# Kinds of instruction compared one by one (sends only post: their time is in `outside`).
OP_CLASSES: dict[str, tuple[instructions.Op, ...]] = {
    "forward": (Op.FORWARD,),
    "backward": (Op.BACKWARD,),
    "receive": (Op.RECV_ACTIVATION, Op.RECV_GRAD),
    "all-reduce": (Op.ALL_REDUCE,),
    "optimizer+barrier": (Op.OPTIMIZER_STEP,),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    """A plan's run: the step period and, per worker, its median seconds per op class over the
    measured steps (as StepResult.seconds counts them), plus the time outside instructions."""

    step_s: float
    seconds: dict[int, dict[str, float]]


def compare_with_estimator(
    tokens: data.Tokens, settings: Settings, max_workers: int
) -> list[dict[str, object]]:
    """Per plan of at most `max_workers` workers, rounds of (measure profiles, predict, run);
    each run is compared with the predictions from the profiles measured just before it, and
    the medians are reported."""
    torch.set_num_threads(1)
    rows: list[dict[str, object]] = []
    for name, p in ESTIMATED.items():
        if len(p.workers) > max_workers:
            print(f"skipped {name}: {len(p.workers)} workers, over --max-workers {max_workers}")
            continue
        rounds = [estimate_and_run(p, tokens, settings) for _ in range(settings.rounds)]
        row: dict[str, object] = {"plan": name, "workers": len(p.workers)}
        for key in ("alone_s", "concurrent_s", "measured_s"):
            row[key] = statistics.median(float(r[key]) for r in rounds)  # type: ignore[arg-type]
        for key in ("alone", "concurrent"):
            errors = [_error_pct(r[f"{key}_s"], r["measured_s"]) for r in rounds]
            row[f"{key}_error_pct"] = statistics.median(errors)
        row["per_op"] = {
            kind: {
                which: statistics.median(r["per_op"][kind][which] for r in rounds)  # type: ignore[index]
                for which in ("measured_s", "estimated_s")
            }
            for kind in (*OP_CLASSES, "outside")
        }
        rows.append(row)
    return rows


def _error_pct(estimated: object, measured: object) -> float:
    return 100 * (float(estimated) - float(measured)) / float(measured)  # type: ignore[arg-type]


def estimate_and_run(p: plan.Plan, tokens: data.Tokens, settings: Settings) -> dict[str, object]:
    """One round: the step predicted from a profile measured alone in this process and from
    profiles measured by as many processes at once as the plan has workers, then measured;
    the per-op classes summed over the workers, measured against the alone prediction."""
    sched = schedule.compile_schedule(p)
    alone = profiler.measure_profile(SHAPE, MICRO_BATCH, warmup=2, repeats=settings.profile_repeats)
    concurrent = profile_concurrently(len(p.workers), settings.profile_repeats)
    predicted = estimator.estimate_step(sched, alone)
    measured = run_executors(p, tokens, settings.steps)
    per_op = {
        kind: {
            "measured_s": sum(w[kind] for w in measured.seconds.values()),
            "estimated_s": sum(sum(w.seconds[op] for op in ops) for w in predicted.workers),
        }
        for kind, ops in OP_CLASSES.items()
    }
    # the estimator has nothing outside instructions: the executor's Python and bookkeeping
    per_op["outside"] = {
        "measured_s": sum(w["outside"] for w in measured.seconds.values()),
        "estimated_s": 0.0,
    }
    return {
        "alone_s": predicted.step_s,
        "concurrent_s": estimator.estimate_step(sched, concurrent).step_s,
        "measured_s": measured.step_s,
        "per_op": per_op,
    }


def executor_worker(
    p: plan.Plan,
    worker: plan.WorkerId,
    port: int,
    tokens: data.Tokens,
    steps: int,
    results: connection.Connection,
) -> None:
    """One worker of `p` in its own process: join the epoch, run `steps` steps with the
    executor, send back each step's (step_s, seconds per op)."""
    torch.set_num_threads(1)
    sched = schedule.compile_schedule(p)
    ranks = groups.worker_ranks(sched)
    store = c10d.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=60))
    epoch = groups.form_epoch(
        store,
        1,
        ranks[worker],
        len(ranks),
        messages.Backend.GLOO,
        120.0,
        subgroups=groups.subgroup_ranks(sched),
    )
    try:
        config = config_for(p)
        layers = held_layers.HeldLayers.build(config, sched.stream(worker).layers)
        job = semantics.Job.from_tokens(config, tokens)
        ours = executor.Executor(job=job, sched=sched, worker=worker, epoch=epoch, layers=layers)
        done = [ours.run_step(step) for step in range(steps)]
        results.send([(r.step_s, {str(op): s for op, s in r.seconds.items()}) for r in done])
    finally:
        groups.leave_epoch(epoch)


def run_executors(p: plan.Plan, tokens: data.Tokens, steps: int) -> Measured:
    """Run `p` for WARMUP_STEPS + `steps` steps, a process per worker."""
    context = multiprocessing.get_context("forkserver")
    store = c10d.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=60), False)
    pipes = {w: context.Pipe(duplex=False) for w in p.workers}
    processes = [
        context.Process(
            target=executor_worker,
            args=(p, w, store.port, tokens, WARMUP_STEPS + steps, pipe[1]),
        )
        for w, pipe in pipes.items()
    ]
    for process in processes:
        process.start()
    reports = {w: pipe[0].recv() for w, pipe in pipes.items()}
    for process in processes:
        process.join()
    seconds = {}
    for w, report in reports.items():
        kept = report[WARMUP_STEPS:]
        per_kind = {
            kind: statistics.median(sum(s[str(op)] for op in ops) for _, s in kept)
            for kind, ops in OP_CLASSES.items()
        }
        per_kind["outside"] = statistics.median(t - sum(s.values()) for t, s in kept)
        seconds[int(w)] = per_kind
    return Measured(step_s=period_s([[t for t, _ in r] for r in reports.values()]), seconds=seconds)


def profile_worker(repeats: int, results: connection.Connection) -> None:
    torch.set_num_threads(1)
    results.send(profiler.measure_profile(SHAPE, MICRO_BATCH, warmup=2, repeats=repeats))


def profile_concurrently(num_processes: int, repeats: int) -> profile.Profile:
    """Per-layer medians over profiles measured by `num_processes` processes at once: each
    worker's speed when as many processes share this machine's cores as in the run."""
    context = multiprocessing.get_context("forkserver")
    pipes = [context.Pipe(duplex=False) for _ in range(num_processes)]
    processes = [context.Process(target=profile_worker, args=(repeats, w)) for _, w in pipes]
    for process in processes:
        process.start()
    profiles: list[profile.Profile] = [r.recv() for r, _ in pipes]
    for process in processes:
        process.join()
    layers = tuple(
        dataclasses.replace(
            versions[0],
            forward_s=(statistics.median(v.forward_s[0] for v in versions),),
            backward_s=(statistics.median(v.backward_s[0] for v in versions),),
            optimizer_s=statistics.median(v.optimizer_s for v in versions),
        )
        for versions in zip(*(p.layers for p in profiles), strict=True)
    )
    return dataclasses.replace(profiles[0], layers=layers)


# --- main ----------------------------------------------------------------------------------------


def print_tables(
    ddp: dict[str, float], cpu: dict[str, float], rows: list[dict[str, object]]
) -> None:
    print(f"model {SHAPE.name}, micro-batch {MICRO_BATCH}, {ddp['samples_per_step']} samples/step")
    print(f"{'executor':>10} {'DDP':>10} {'ratio':>7} {'max |dparam|':>13}")
    print(
        f"{ddp['ours_samples_per_s']:>10.1f} {ddp['ddp_samples_per_s']:>10.1f} "
        f"{ddp['ours_over_ddp']:>7.3f} {ddp['max_parameter_difference']:>13.2e}"
    )
    print(
        f"one rank in one process, CPU s/step: executor {cpu['ours_cpu_s']:.3f}, "
        f"DDP {cpu['ddp_cpu_s']:.3f}, ratio {cpu['ours_over_ddp']:.3f}"
    )
    print("\nstep seconds: measured; estimated from a profile measured alone / concurrently")
    header = f"{'plan':<30} {'workers':>7} {'measured':>9} {'alone':>7} {'err %':>7}"
    print(header + f" {'concurrent':>10} {'err %':>7}")
    for row in rows:
        print(
            f"{row['plan']!s:<30} {row['workers']!s:>7} {row['measured_s']:>9.3f} "
            f"{row['alone_s']:>7.3f} {row['alone_error_pct']:>7.1f} "
            f"{row['concurrent_s']:>10.3f} {row['concurrent_error_pct']:>7.1f}"
        )
    print_per_op(rows)


def print_per_op(rows: list[dict[str, object]]) -> None:
    """Per plan and kind of instruction, seconds summed over the workers: measured by the
    executor (StepResult.seconds, waits included) / estimated from the alone profile."""
    kinds = (*OP_CLASSES, "outside")
    print("\nper kind of instruction, seconds summed over workers: measured / estimated (alone)")
    print(f"{'plan':<30}" + "".join(f" {kind:>17}" for kind in kinds))
    for row in rows:
        per_op = typing.cast(dict[str, dict[str, float]], row["per_op"])
        cells = [f"{per_op[k]['measured_s']:.3f} / {per_op[k]['estimated_s']:.3f}" for k in kinds]
        print(f"{row['plan']!s:<30}" + "".join(f" {cell:>17}" for cell in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round of fewer steps")
    parser.add_argument(
        "--max-workers",
        type=int,
        default=max(len(p.workers) for p in ESTIMATED.values()),
        help="estimate only the plans of at most this many workers (a fair check needs a core "
        "per worker: on 2 cores, 2)",
    )
    arguments = parser.parse_args()
    quick = arguments.quick
    settings = Settings(rounds=1 if quick else 3, steps=4 if quick else 8, profile_repeats=5)
    tokens = data.load_default_corpus(max_bytes=2_000_000)
    load_before = os.getloadavg()[0]  # other work on this machine skews every figure
    with local_cluster.LocalCluster(workers=range(2), tokens=tokens, timeout_s=120.0) as cluster:
        ddp = compare_with_ddp(cluster, tokens, settings)
    rows = compare_with_estimator(tokens, settings, arguments.max_workers)
    cpu = compare_cpu_in_process(tokens, settings)
    machine = {"cores": CORES, "load_before": load_before, "load_after": os.getloadavg()[0]}
    print_tables(ddp, cpu, rows)
    print(
        f"\n{CORES} cores; 1-minute load average {load_before:.2f} before, "
        f"{machine['load_after']:.2f} after"
    )
    report = {"settings": dataclasses.asdict(settings), "machine": machine, "ddp": ddp}
    report["ddp_cpu_one_rank"] = cpu
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({**report, "estimator": rows}, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
