"""Benchmark: the schedule executor against torch's DDP, and against the time estimator.

1. Symmetric data parallelism: 2 workers, each the whole model, 4 micro-batches of 4 samples
   per worker per step. Our executor (planaria.agent.harness) and torch's
   DistributedDataParallel (gloo, same processes count, model, data, per-layer AdamW; DDP's
   average turned into a sum by scaling the loss with the world size) are timed in
   interleaved rounds; the table gives samples/s of each and their ratio (goal: ours within
   10%), plus the largest parameter difference between the two (they train the same thing).
2. The estimator: a profile measured here (`profiler.measure_profile`, one thread) predicts the
   step time of pipeline, data-parallel, heterogeneous and rerouted plans
   (`estimator.estimate_step`); the table gives measured vs predicted seconds and the error
   (goal: <= 5%). Each worker is one process with one thread, but this machine may have fewer
   cores than a plan has workers; the estimator assumes one device per worker, so the table
   also gives a contention-aware prediction, max(estimate, sum of busy seconds / cores), and
   its error. Only the plans with no more workers than cores are like for like.

Step time of a run: per worker the median over the measured steps (after warm-up steps) of
its step wall time; the run's step time is the slowest worker's (steps are back to back, so
that is the period). Writes bench/results/executor.json.

    .venv/bin/python bench/executor.py [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import multiprocessing
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import connection
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d
from torch.nn.parallel import DistributedDataParallel

from planaria.agent import data, harness, model, profiler, reference
from planaria.planner import estimator, plan, schedule, shapes

RESULTS = Path(__file__).parent / "results" / "executor.json"
SHAPE = shapes.named("small")
MICRO_BATCH = 4
SEED = 0
WARMUP_STEPS = 2
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


def config_for(p: plan.Plan) -> reference.TrainingConfig:
    return reference.TrainingConfig(
        shape=SHAPE, seed=SEED, global_batch_size=p.global_batch_size, micro_batch_size=MICRO_BATCH
    )


def period_s(step_s: Sequence[Sequence[float]]) -> float:
    """The slowest worker's median step time over the measured (post-warm-up) steps."""
    return max(statistics.median(steps[WARMUP_STEPS:]) for steps in step_s)


# --- 1. ours vs DDP ---------------------------------------------------------------------------


def run_ours(
    cluster: harness.LocalCluster, p: plan.Plan, steps: int
) -> tuple[float, harness.RunResult]:
    run = cluster.run(config_for(p), p, range(steps))
    if not run.ok:
        raise RuntimeError(f"executor run failed: {run.errors} lost {run.lost}")
    return period_s(list(run.step_s.values())), run


def ddp_worker(
    rank: int, port: int, tokens: data.Tokens, steps: int, results: connection.Connection
) -> None:
    """One DDP rank: the whole model, this rank's share of every step's micro-batches."""
    torch.set_num_threads(1)
    store = c10d.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=60))
    world = len(DATA_PARALLEL.pipelines)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    config = config_for(DATA_PARALLEL)
    layers = model.build_layers(config.shape, config.seed)
    net = DistributedDataParallel(torch.nn.Sequential(*layers))
    optimizers = [model.make_optimizer(layer, config.optimizer) for layer in layers]
    dataset = data.TokenDataset(tokens=tokens, seq_len=config.shape.seq_len)
    sampler = data.Sampler(
        num_samples=dataset.num_samples, global_batch_size=config.global_batch_size, seed=SEED
    )
    times = [ddp_step(net, optimizers, dataset, sampler, step, rank) for step in range(steps)]
    # numpy, not tensors: torch would pass tensors as shared memory this process then frees
    results.send((times, [p.detach().numpy().copy() for p in net.module.parameters()]))
    dist.destroy_process_group()


def ddp_step(
    net: DistributedDataParallel,
    optimizers: Sequence[torch.optim.Optimizer],
    dataset: data.TokenDataset,
    sampler: data.Sampler,
    step: int,
    rank: int,
) -> float:
    started = time.perf_counter()
    counts = [pipeline.num_micro_batches for pipeline in DATA_PARALLEL.pipelines]
    mine = sampler.split(step, MICRO_BATCH, counts)[rank]
    for i, samples in enumerate(mine):
        inputs, targets = dataset.batch(samples)
        last = i == len(mine) - 1
        with contextlib.nullcontext() if last else net.no_sync():
            loss = model.micro_batch_loss(net(inputs), targets, sampler.global_batch_size)
            torch.autograd.backward(loss * len(counts))  # DDP averages over ranks; we sum
    for optimizer in optimizers:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - started


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
    cluster: harness.LocalCluster, tokens: data.Tokens, settings: Settings
) -> dict[str, float]:
    ours, theirs, difference = [], [], 0.0
    for _ in range(settings.rounds):  # interleaved, so drifting machine load hits both
        period, run = run_ours(cluster, DATA_PARALLEL, settings.steps)
        ours.append(period)
        period, parameters = run_ddp(tokens, settings.steps)
        theirs.append(period)
        difference = max(difference, max_difference(run, parameters))
    samples = DATA_PARALLEL.global_batch_size
    ours_rate, ddp_rate = samples / statistics.median(ours), samples / statistics.median(theirs)
    return {
        "samples_per_step": samples,
        "ours_samples_per_s": ours_rate,
        "ddp_samples_per_s": ddp_rate,
        "ours_over_ddp": ours_rate / ddp_rate,
        "max_parameter_difference": difference,
    }


def max_difference(
    run: harness.RunResult, ddp_parameters: Sequence[npt.NDArray[np.float32]]
) -> float:
    ours = [p for i in range(SHAPE.num_planner_layers) for p in run.layer_state(i).parameters]
    pairs = zip(ours, ddp_parameters, strict=True)
    return max((a - torch.from_numpy(b)).abs().max().item() for a, b in pairs)


# --- 2. ours vs the estimator ------------------------------------------------------------------


def compare_with_estimator(
    cluster: harness.LocalCluster, settings: Settings
) -> list[dict[str, object]]:
    torch.set_num_threads(1)
    measured_profile = profiler.measure_profile(
        SHAPE, MICRO_BATCH, warmup=3, repeats=settings.profile_repeats
    )
    cores = len(os.sched_getaffinity(0))
    rows: list[dict[str, object]] = []
    for name, p in ESTIMATED.items():
        estimate = estimator.estimate_step(schedule.compile_schedule(p), measured_profile)
        measured = statistics.median(
            run_ours(cluster, p, settings.steps)[0] for _ in range(settings.rounds)
        )
        busy = sum(w.busy_s for w in estimate.workers)
        bound = max(estimate.step_s, busy / cores)
        rows.append(
            {
                "plan": name,
                "workers": len(p.workers),
                "cores": cores,
                "measured_s": measured,
                "estimated_s": estimate.step_s,
                "error_pct": 100 * (estimate.step_s - measured) / measured,
                "cpu_bound_s": bound,
                "cpu_bound_error_pct": 100 * (bound - measured) / measured,
            }
        )
    return rows


# --- main ----------------------------------------------------------------------------------------


def print_tables(ddp: dict[str, float], rows: list[dict[str, object]]) -> None:
    print(f"model {SHAPE.name}, micro-batch {MICRO_BATCH}, {ddp['samples_per_step']} samples/step")
    print(f"{'executor':>10} {'DDP':>10} {'ratio':>7} {'max |dparam|':>13}")
    print(
        f"{ddp['ours_samples_per_s']:>10.1f} {ddp['ddp_samples_per_s']:>10.1f} "
        f"{ddp['ours_over_ddp']:>7.3f} {ddp['max_parameter_difference']:>13.2e}"
    )
    print()
    header = f"{'plan':<30} {'workers':>7} {'measured':>9} {'estimate':>9} {'err %':>7}"
    print(header + f" {'cpu-bound':>9} {'err %':>7}")
    for row in rows:
        print(
            f"{row['plan']!s:<30} {row['workers']!s:>7} {row['measured_s']:>9.3f} "
            f"{row['estimated_s']:>9.3f} {row['error_pct']:>7.1f} {row['cpu_bound_s']:>9.3f} "
            f"{row['cpu_bound_error_pct']:>7.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and steps")
    quick = parser.parse_args().quick
    settings = Settings(rounds=1 if quick else 3, steps=4 if quick else 8, profile_repeats=10)
    tokens = data.load_default_corpus(max_bytes=2_000_000)
    with harness.LocalCluster(workers=range(5), tokens=tokens, timeout_s=120.0) as cluster:
        ddp = compare_with_ddp(cluster, tokens, settings)
        rows = compare_with_estimator(cluster, settings)
    print_tables(ddp, rows)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps({"settings": vars_of(settings), "ddp": ddp, "estimator": rows}, indent=2)
    )
    print(f"\nwrote {RESULTS}")


def vars_of(settings: Settings) -> dict[str, int]:
    return {"rounds": settings.rounds, "steps": settings.steps, "repeats": settings.profile_repeats}


if __name__ == "__main__":
    main()
