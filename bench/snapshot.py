"""Training step time with host-memory snapshots every step against none, and checksum speed.

    .venv/bin/python bench/snapshot.py [--steps N] [--shapes tiny,small] [--threads T]
                                       [--out bench/results/snapshot.json]

The reference trainer (one process holding every layer; the pipeline executor's integration
comes later) trains the tiny and small shapes. This process plays member 0 of a sharding group
of m for every layer and writes what member 0 writes (its shard plus copy or parity) to
/dev/shm, exactly as `snapshot_writer` does for the executor: `begin` right after the optimizer
step, the write overlapping the next step's forward and backward, `wait` before its optimizer
step. Arms are interleaved A B B A within one process, so drift (other processes on a shared
machine, thermal state) hits both alike; the overhead is the ratio of median step times. The
process's CPU time per step (all threads) is reported too: on a loaded machine it is steadier
than wall-clock time, and its ratio bounds the overhead when no core is spare for the writer.

Also measured: each configuration's snapshot written alone (begin + wait with no training
running; the background work the step hides) and the bytes it writes, and the throughput of the
two checksums the store first supported (bench/snapshot_executor.py measures xxh3, now the
default, beside them).
"""

from __future__ import annotations

import argparse
import hashlib
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

from planaria.agent.state import snapshot_store, snapshot_writer, snapshots
from planaria.agent.training import data, model, reference, semantics
from planaria.contract import plan, shapes
from planaria.wire import messages

Mode = messages.RedundancyMode
# (redundancy, group size m): the whole state unprotected, ARC copies in pairs, AEC in fours.
CONFIGS = ((Mode.NONE, 1), (Mode.COPY, 2), (Mode.XOR, 4))
GLOBAL_BATCH, MICRO_BATCH = 8, 4
GOAL_OVERHEAD = 0.03
NOTE = (
    "reference trainer in one process, member 0 of each group written to /dev/shm; the "
    "pipeline executor's integration comes later"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    shape: str
    redundancy: str
    group_size: int
    snapshot_bytes: int
    snapshot_alone_s: float
    steps_per_arm: int
    off_median_s: float
    on_median_s: float
    overhead: float
    off_cpu_median_s: float
    on_cpu_median_s: float
    cpu_overhead: float


class Bench:
    """One reference trainer and one snapshot writer, stepping with or without a snapshot."""

    def __init__(self, shape: shapes.ModelShape, tokens: data.Tokens, mode: Mode, m: int) -> None:
        config = semantics.TrainingConfig(
            shape=shape, seed=0, global_batch_size=GLOBAL_BATCH, micro_batch_size=MICRO_BATCH
        )
        self.trainer = reference.ReferenceTrainer(config, tokens)
        self.base = Path(tempfile.mkdtemp(prefix="planaria-bench-", dir="/dev/shm"))
        store = snapshot_store.SnapshotStore(snapshot_store.store_root("bench", 0, self.base))
        settings = snapshot_writer.WriterConfig(
            job="bench", worker=plan.WorkerId(0), redundancy=mode
        )
        self.writer = snapshot_writer.SnapshotWriter(store, settings)
        members = tuple(plan.WorkerId(w) for w in range(m))
        self.groups = {i: members for i in range(shape.num_planner_layers)}
        self.step_index = 0

    def live(self) -> list[model.LayerState]:
        pairs = zip(self.trainer.layers, self.trainer.optimizers, strict=True)
        return [snapshots.live_layer_state(i, layer, opt) for i, (layer, opt) in enumerate(pairs)]

    def step(self, snapshot: bool) -> tuple[float, float]:
        """One training step, overlapping a snapshot of the previous step's result if asked;
        its wall-clock seconds and this process's CPU seconds (all threads), begin and wait
        included."""
        trainer, i = self.trainer, self.step_index
        start, start_cpu = time.perf_counter(), time.process_time()
        if snapshot:
            self.writer.begin(step=i + 1, epoch=1, states=self.live(), groups=self.groups)
        (micro_batches,) = trainer.sampler.split(i, MICRO_BATCH, [GLOBAL_BATCH // MICRO_BATCH])
        for samples in micro_batches:
            inputs, targets = trainer.dataset.batch(samples)
            logits = model.run_layers(trainer.layers, inputs)
            torch.autograd.backward(model.micro_batch_loss(logits, targets, GLOBAL_BATCH))
        self.writer.wait(60)  # the contract: before the optimizer step changes the state
        for optimizer in trainer.optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        self.step_index += 1
        return time.perf_counter() - start, time.process_time() - start_cpu

    def snapshot_alone(self, repeats: int = 5) -> tuple[float, int]:
        """Median seconds of a snapshot with nothing else running, and the bytes it writes."""
        times, held = [], 0
        for r in range(repeats):
            start = time.perf_counter()
            self.writer.begin(step=10_000 + r, epoch=1, states=self.live(), groups=self.groups)
            manifest = self.writer.wait(60)
            times.append(time.perf_counter() - start)
            held = manifest.held_bytes if manifest else 0
        return statistics.median(times), held

    def close(self) -> None:
        self.writer.close()
        snapshot_store.remove_job("bench", self.base)
        self.base.rmdir()


def measure(shape: shapes.ModelShape, tokens: data.Tokens, mode: Mode, m: int, steps: int) -> Row:
    bench = Bench(shape, tokens, mode, m)
    try:
        for _ in range(4):  # warm-up: first steps allocate optimizer state and caches
            bench.step(snapshot=True)
        alone_s, held = bench.snapshot_alone()
        arms: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for i in range(2 * steps):
            snapshot = (i % 4) in (1, 2)  # A B B A
            arms[snapshot].append(bench.step(snapshot=snapshot))
    finally:
        bench.close()
    off_s, on_s = (statistics.median(t for t, _ in arms[arm]) for arm in (False, True))
    off_cpu, on_cpu = (statistics.median(c for _, c in arms[arm]) for arm in (False, True))
    return Row(
        shape=shape.name,
        redundancy=mode.value,
        group_size=m,
        snapshot_bytes=held,
        snapshot_alone_s=alone_s,
        steps_per_arm=steps,
        off_median_s=off_s,
        on_median_s=on_s,
        overhead=on_s / off_s - 1,
        off_cpu_median_s=off_cpu,
        on_cpu_median_s=on_cpu,
        cpu_overhead=on_cpu / off_cpu - 1,
    )


def checksum_speeds(size_bytes: int = 64 << 20) -> dict[str, float]:
    """GB/s of each checksum (and of a plain copy, for scale) over random bytes."""
    buffer = np.random.default_rng(0).integers(0, 256, size=size_bytes, dtype=np.uint8)
    view = buffer.data
    candidates: dict[str, Callable[[], object]] = {
        "crc32": lambda: zlib.crc32(view),
        "blake2b": lambda: hashlib.blake2b(view, digest_size=16).digest(),
        "memcpy": lambda: buffer.copy(),
    }
    speeds = {}
    for name, run in candidates.items():
        run()
        start = time.perf_counter()
        for _ in range(3):
            run()
        speeds[name] = 3 * size_bytes / (time.perf_counter() - start) / 1e9
    return speeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24, help="steps per arm (default 24)")
    parser.add_argument("--shapes", default="tiny,small", help="comma-separated shape names")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/snapshot.json"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tokens = data.load_default_corpus(max_bytes=2_000_000)
    rows = [
        measure(shapes.named(name), tokens, mode, m, args.steps)
        for name in args.shapes.split(",")
        for mode, m in CONFIGS
    ]
    speeds = checksum_speeds()
    _print(rows, speeds)
    _write(args.out, rows, speeds)


def _print(rows: list[Row], speeds: dict[str, float]) -> None:
    print(f"Snapshot every step vs none ({NOTE}); torch threads {torch.get_num_threads()}")
    print(
        f"{'shape':6} {'mode':5} {'m':>2} {'MB':>6} {'alone ms':>8} {'off ms':>8} "
        f"{'on ms':>8} {'overhead':>9}"
    )
    for r in rows:
        mark = "ok" if r.overhead <= GOAL_OVERHEAD else "over goal"
        print(
            f"{r.shape:6} {r.redundancy:5} {r.group_size:>2} {r.snapshot_bytes / 1e6:6.2f} "
            f"{r.snapshot_alone_s * 1e3:8.2f} {r.off_median_s * 1e3:8.1f} "
            f"{r.on_median_s * 1e3:8.1f} {r.overhead:+9.2%}  {r.off_cpu_median_s * 1e3:8.1f} "
            f"{r.on_cpu_median_s * 1e3:8.1f} {r.cpu_overhead:+8.2%}  {mark}"
        )
    print("checksums (GB/s): " + ", ".join(f"{k} {v:.2f}" for k, v in speeds.items()))
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")


def _write(out: Path, rows: list[Row], speeds: dict[str, float]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    document: dict[str, Any] = {
        "note": NOTE,
        "goal_overhead": GOAL_OVERHEAD,
        "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "rows": [asdict(r) for r in rows],
        "checksum_gb_per_s": speeds,
    }
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
