"""Step time of the executor with host-memory snapshots off, every 5 steps and every step.

    .venv/bin/python bench/snapshot_executor.py [--model small] [--steps 5] [--rounds 6]
                                                [--threads 1]
                                                [--out bench/results/snapshot_executor.json]

The real code path, not the reference trainer: one worker (world size 1, gloo, a TCPStore in
this process as the controller hosts it) holding the whole model trains through
`training_thread.Training`, the agent's own training state: the executor runs the schedule, the
epoch's writers stage each due snapshot after the optimizer step, release it before the next
one and write it in the background into a store in /dev/shm (issue #16 item 4). With one
worker the sharding group has one member, so the worker writes its whole state.

Each arm (interval 0 = off, 5, 1) is an epoch resumed at the current step, so the arms train
the same model one after the other; arms are interleaved in rounds (A B C, then C B A, ...) so
that drift on a shared machine hits all alike. Per arm: the median step time (the executor's
wall clock per step), the median seconds the step spent on snapshots on its critical path
(begin + release: the `snapshot_s` timing the heartbeat carries), process CPU seconds per step
(all threads: the background writer's work shows here even when a spare core hides it from
the step time), the snapshots taken and skipped, and the achieved interval; the overhead is the
ratio of median step times to the off arm's. Also measured: the checksums' throughput on
this machine (zlib's crc32, the old default; crc32c when the package is installed; xxh3).
Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xxhash
from torch._C import _distributed_c10d as c10d

from planaria.agent.runtime import training_thread
from planaria.agent.training import data
from planaria.contract import plan, shapes
from planaria.wire import messages

INTERVALS = (0, 5, 1)
MICRO_BATCH, NUM_MICRO_BATCHES = 4, 2
GOAL = "snapshot every step costs <= 3% step time (issue #16, CPU, `small`, the executor)"


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    interval_steps: int
    steps: int
    step_median_s: float
    snapshot_median_s: float
    cpu_per_step_s: float
    snapshots_taken: int
    snapshots_skipped: int
    achieved_interval_steps: float
    overhead: float
    cpu_overhead: float


@dataclass(slots=True, kw_only=True)
class Arm:
    step_s: list[float]
    snapshot_s: list[float]
    cpu_s: float = 0.0
    taken: int = 0
    skipped: int = 0
    achieved: list[float] | None = None


class Worker:
    """One worker's `Training`, switched between snapshot intervals by epochs."""

    def __init__(
        self,
        model_name: str,
        corpus: Path,
        base: Path,
        *,
        device: messages.Device = messages.Device.CPU,
        precision: messages.Precision = messages.Precision.FP32,
        micro_batch: int = MICRO_BATCH,
        num_micro_batches: int = NUM_MICRO_BATCHES,
    ) -> None:
        """On `device` (cuda: an NCCL epoch on the current GPU, as an agent started with
        `--device cuda` trains), in `precision`."""
        self.store = c10d.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=30))
        self.training = training_thread.Training(
            worker=plan.WorkerId(0), job="bench", snapshot_base=base, device=device.value
        )
        self.model_name, self.corpus, self.epoch = model_name, corpus, 0
        self.device, self.precision = device, precision
        self.micro_batch, self.num_micro_batches = micro_batch, num_micro_batches

    def arm(self, interval: int) -> None:
        """Start an epoch at the current step that snapshots every `interval` steps."""
        self.epoch += 1
        settings = messages.TrainingSettings(
            model=self.model_name,
            seed=0,
            optimizer=messages.OptimizerSettings(lr=1e-3),
            global_batch_size=self.micro_batch * self.num_micro_batches,
            data=messages.DataSettings(corpus_paths=(str(self.corpus),)),
            device=self.device,
            snapshot_interval_steps=interval,
            redundancy=messages.RedundancyMode.XOR,
            precision=self.precision,
        )
        num_layers = shapes.named(self.model_name).num_planner_layers
        stage = plan.Stage(layer_start=0, layer_stop=num_layers, workers=(plan.WorkerId(0),))
        p = plan.Plan(
            pipelines=(plan.Pipeline(stages=(stage,), num_micro_batches=self.num_micro_batches),),
            micro_batch_size=self.micro_batch,
        )
        rendezvous = messages.Rendezvous(
            store_host="127.0.0.1",
            store_port=self.store.port,
            key_prefix=f"epoch-{self.epoch}",
            rank=0,
            world_size=1,
            backend=messages.Backend.NCCL
            if self.device is messages.Device.CUDA
            else messages.Backend.GLOO,
            timeout_s=60.0,
        )
        self.training.set_up(
            messages.WorkerConfig(
                epoch=self.epoch,
                worker=plan.WorkerId(0),
                plan=p,
                resume_step=self.training.step,
                rendezvous=rendezvous,
                transfers=(),
                settings=settings,
            )
        )

    def run(self, interval: int, steps: int, arm: Arm) -> None:
        self.arm(interval)
        self.training.run_step()  # warm-up: the epoch's first step allocates
        cpu = time.process_time()
        for _ in range(steps):
            timings = self.training.run_step().timings
            arm.step_s.append(timings.step_s)
            arm.snapshot_s.append(timings.snapshot_s)
        arm.cpu_s += time.process_time() - cpu
        writers = self.training._writers  # the epoch's writers: what the heartbeat reads
        assert writers is not None
        arm.taken += writers.num_begun
        arm.skipped += writers.skipped
        arm.achieved = (arm.achieved or []) + [writers.achieved_interval_steps]
        self.training.end_epoch()  # completes the pending snapshot outside the measurement

    def close(self) -> None:
        self.training.close()


def checksum_speeds(nbytes: int = 64 << 20) -> dict[str, float]:
    """GB/s of each checksum over `nbytes` of random bytes (best of 5)."""
    data = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    buffer = memoryview(data.tobytes())
    candidates: dict[str, Callable[[Any], object]] = {
        "crc32 (zlib)": zlib.crc32,
        "xxh3 (xxhash)": lambda b: xxhash.xxh3_64(b).intdigest(),
    }
    try:
        import crc32c  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415 (optional)

        candidates["crc32c"] = crc32c.crc32c
    except ImportError:
        pass
    speeds = {}
    for name, function in candidates.items():
        best = float("inf")
        for _ in range(5):
            started = time.perf_counter()
            function(buffer)
            best = min(best, time.perf_counter() - started)
        speeds[name] = nbytes / best / 1e9
    return speeds


def rows_of(arms: dict[int, Arm]) -> list[Row]:
    off = arms[0]
    off_step = statistics.median(off.step_s)
    off_cpu = off.cpu_s / len(off.step_s)
    rows = []
    for interval, arm in arms.items():
        step = statistics.median(arm.step_s)
        cpu = arm.cpu_s / len(arm.step_s)
        achieved = [a for a in arm.achieved or [] if a]
        rows.append(
            Row(
                interval_steps=interval,
                steps=len(arm.step_s),
                step_median_s=step,
                snapshot_median_s=statistics.median(arm.snapshot_s),
                cpu_per_step_s=cpu,
                snapshots_taken=arm.taken,
                snapshots_skipped=arm.skipped,
                achieved_interval_steps=statistics.mean(achieved) if achieved else 0.0,
                overhead=step / off_step - 1,
                cpu_overhead=cpu / off_cpu - 1,
            )
        )
    return rows


def print_table(rows: list[Row], speeds: dict[str, float]) -> None:
    print(
        f"{'interval':>8} {'steps':>5} {'step ms':>8} {'snap ms':>8} {'cpu ms':>8} "
        f"{'taken':>5} {'skip':>4} {'achieved':>8} {'overhead':>8} {'cpu ovh':>8}"
    )
    for r in rows:
        name = "off" if r.interval_steps == 0 else str(r.interval_steps)
        print(
            f"{name:>8} {r.steps:>5} {r.step_median_s * 1e3:>8.1f} "
            f"{r.snapshot_median_s * 1e3:>8.2f} {r.cpu_per_step_s * 1e3:>8.1f} "
            f"{r.snapshots_taken:>5} {r.snapshots_skipped:>4} {r.achieved_interval_steps:>8.2f} "
            f"{r.overhead:>+8.1%} {r.cpu_overhead:>+8.1%}"
        )
    print("checksums: " + ", ".join(f"{k} {v:.1f} GB/s" for k, v in speeds.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--steps", type=int, default=5, help="measured steps per arm and round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--out", type=Path, default=Path("bench/results/snapshot_executor.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="planaria-bench-", dir="/dev/shm") as base:
        corpus = Path(base) / "corpus.txt"
        corpus.write_bytes(data.decode(data.load_default_corpus(max_bytes=500_000)).encode())
        worker = Worker(args.model, corpus, Path(base) / "stores")
        arms = {i: Arm(step_s=[], snapshot_s=[]) for i in INTERVALS}
        try:
            for r in range(args.rounds):
                for interval in INTERVALS if r % 2 == 0 else reversed(INTERVALS):
                    worker.run(interval, args.steps, arms[interval])
        finally:
            worker.close()
    rows = rows_of(arms)
    speeds = checksum_speeds()
    print_table(rows, speeds)
    result = {
        "goal": GOAL,
        "model": args.model,
        "global_batch": MICRO_BATCH * NUM_MICRO_BATCHES,
        "threads": args.threads,
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "load_average_before": load,
        "load_average_after": os.getloadavg(),
        "torch": torch.__version__,
        "rows": [asdict(r) for r in rows],
        "checksum_gb_per_s": speeds,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
