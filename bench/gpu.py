"""Benchmark for a machine with one GPU (issue #16 item 7): profile, precision, snapshots.

    .venv/bin/python bench/gpu.py [--device cuda] [--model gpt3-medium] [--steps 10]
                                  [--out bench/results/gpu.json]
    .venv/bin/python bench/gpu.py --device cpu --model tiny --steps 3    # a smoke check

Meant to finish in under 8 minutes on one H100 with the defaults. It measures:

1. `planaria profile --model M --device D --precision P` for fp32 and bf16 (a subprocess, the
   command a user runs): the wall time of the command, and the profile's forward + backward
   seconds and state and activation bytes summed over the layers.
2. A 1-worker job of the model (micro-batch 1, global batch 4: 4 micro-batches a step) on the
   device, run by the agent's own executor in a one-rank epoch (NCCL on cuda, gloo on cpu), in
   fp32 and bf16, with host-memory snapshots off, every 5 steps and every step, written by the
   agent's snapshot writer to /dev/shm as a worker does: begun right after a step commits, the
   write overlapping the next step, waited for before that step's optimizer step. Per arm:
   median step time, goodput (the arm's steps times the snapshot-free median step, over the
   arm's wall time), the time the optimizer step waited for the snapshot, and the achieved
   interval (steps per completed snapshot).
3. For each precision, one snapshot's work split into its parts, each timed alone on the live
   state: device-to-host copy into fresh pageable memory (what `snapshots.host_bytes` does),
   zlib.crc32 of the bytes (the store's checksum) and the write of the bytes to a file in
   /dev/shm.

Prints a table and writes JSON with the GPU named. Not a timed test; nothing is asserted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch._C import _distributed_c10d as c10d

from planaria.agent.execution import executor, groups, held_layers
from planaria.agent.state import snapshot_store, snapshot_writer, snapshots
from planaria.agent.training import data, model, semantics
from planaria.contract import instructions, plan, schedule, shapes
from planaria.spec import profile_file
from planaria.wire import messages

RESULTS = Path(__file__).parent / "results" / "gpu.json"
PLANARIA = str(Path(sys.executable).parent / "planaria")
MICRO_BATCH, GLOBAL_BATCH = 1, 4
WARMUP_STEPS = 2
INTERVALS = (0, 5, 1)  # snapshots off, every 5 steps, every step
PRECISIONS = (messages.Precision.FP32, messages.Precision.BF16)
WAIT_S = 600.0
WORKER = plan.WorkerId(0)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileRow:
    precision: str
    command_s: float
    forward_backward_s: float  # one micro-batch through every layer, forward and backward
    state_bytes: int
    activation_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ArmRow:
    precision: str
    interval_steps: int
    steps: int
    median_step_s: float
    goodput: float
    median_wait_s: float  # the optimizer step waiting for the snapshot
    snapshots: int
    achieved_interval: float | None
    snapshot_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Breakdown:
    precision: str
    snapshot_bytes: int
    copy_s: float
    checksum_s: float
    write_s: float


def profile_row(model: str, device: str, precision: messages.Precision, out: Path) -> ProfileRow:
    """Run `planaria profile` for `precision` and sum its layers."""
    command = [PLANARIA, "profile", "--model", model, "--micro-batch", str(MICRO_BATCH)]
    command += ["--device", device, "--precision", precision.value, "--repeats", "3"]
    command += ["--warmup", "1", "--out", str(out)]
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    layers = profile_file.load_profile(out).layers
    return ProfileRow(
        precision=precision.value,
        command_s=elapsed,
        forward_backward_s=sum(layer.forward_s[0] + layer.backward_s[0] for layer in layers),
        state_bytes=sum(layer.state_bytes for layer in layers),
        activation_bytes=sum(layer.activation_bytes for layer in layers),
    )


class Job:
    """A 1-worker job on `device`: one executor in a one-rank epoch and a snapshot writer."""

    def __init__(
        self, shape: shapes.ModelShape, tokens: data.Tokens, device: str, p: messages.Precision
    ) -> None:
        config = semantics.TrainingConfig(
            shape=shape,
            seed=0,
            global_batch_size=GLOBAL_BATCH,
            micro_batch_size=MICRO_BATCH,
            precision=p,
        )
        layers = range(shape.num_planner_layers)
        one = plan.Plan(
            pipelines=(
                plan.Pipeline(
                    stages=(plan.Stage(layer_start=0, layer_stop=len(layers), workers=(WORKER,)),),
                    num_micro_batches=GLOBAL_BATCH // MICRO_BATCH,
                ),
            ),
            micro_batch_size=MICRO_BATCH,
        )
        backend = messages.Backend.NCCL if device.startswith("cuda") else messages.Backend.GLOO
        timeout = datetime.timedelta(seconds=WAIT_S)
        store = c10d.TCPStore("127.0.0.1", 0, None, True, timeout, False)
        self.epoch = groups.form_epoch(store, 1, 0, 1, backend, WAIT_S)
        self.layers = held_layers.HeldLayers.build(config, layers, device)
        self.runner = executor.Executor(
            job=semantics.Job.from_tokens(config, tokens),
            sched=schedule.compile_schedule(one),
            worker=WORKER,
            epoch=self.epoch,
            layers=self.layers,
        )
        self.base = Path(tempfile.mkdtemp(prefix="planaria-gpu-bench-", dir="/dev/shm"))
        store_root = snapshot_store.store_root("gpubench", 0, self.base)
        writer_config = snapshot_writer.WriterConfig(
            job="gpubench", worker=WORKER, redundancy=messages.RedundancyMode.NONE
        )
        self.writer = snapshot_writer.SnapshotWriter(
            snapshot_store.SnapshotStore(store_root), writer_config
        )
        self.step_index = 0
        self.waited_s = 0.0

    def live(self) -> list[model.LayerState]:
        layers = self.layers
        return [
            snapshots.live_layer_state(i, layers.modules[i], layers.optimizers[i])
            for i in layers.indices
        ]

    def _before(self, step: int, index: int, op: instructions.Instruction) -> None:
        if isinstance(op, instructions.OptimizerStep):  # the writer's contract
            started = time.perf_counter()
            self.writer.wait(WAIT_S)
            self.waited_s += time.perf_counter() - started

    def step(self, interval: int) -> tuple[float, float, int]:
        """One step, then a snapshot begun when due; (seconds, optimizer's wait, bytes)."""
        self.waited_s = 0.0
        started = time.perf_counter()
        self.runner.run_step(self.step_index, self._before)  # commits: the loss syncs a GPU
        self.step_index += 1
        held = 0
        if interval and self.step_index % interval == 0:
            groups_of = {i: (WORKER,) for i in self.layers.indices}
            states = self.live()
            held = sum(s.nbytes for s in states)
            self.writer.begin(step=self.step_index, epoch=1, states=states, groups=groups_of)
        return time.perf_counter() - started, self.waited_s, held

    def finish(self) -> int:
        """Wait for the last snapshot; 1 if one was pending and completed, else 0."""
        return 1 if self.writer.wait(WAIT_S) is not None else 0

    def close(self) -> None:
        self.writer.close()
        groups.leave_epoch(self.epoch)
        snapshot_store.remove_job("gpubench", self.base)
        self.base.rmdir()


def run_arm(job: Job, p: messages.Precision, interval: int, steps: int, base_s: float) -> ArmRow:
    for _ in range(WARMUP_STEPS):
        job.step(interval)
    job.finish()
    times, waits, taken, nbytes = [], [], 0, 0
    started = time.perf_counter()
    for _ in range(steps):
        seconds, waited, held = job.step(interval)
        times.append(seconds)
        waits.append(waited)
        taken += held > 0
        nbytes = max(nbytes, held)
    job.finish()
    wall = time.perf_counter() - started
    median = statistics.median(times)
    return ArmRow(
        precision=p.value,
        interval_steps=interval,
        steps=steps,
        median_step_s=median,
        goodput=steps * (base_s or median) / wall,
        median_wait_s=statistics.median(waits),
        snapshots=taken,
        achieved_interval=steps / taken if taken else None,
        snapshot_bytes=nbytes,
    )


def breakdown(job: Job, p: messages.Precision) -> Breakdown:
    """One snapshot's parts timed alone on the live state (module docstring, item 3)."""
    tensors = [t for state in job.live() for t in state.tensors()]
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # the step's kernels are not part of the copy
    started = time.perf_counter()
    host = [snapshots.host_bytes(t) for t in tensors]
    copy_s = time.perf_counter() - started
    started = time.perf_counter()
    crc = 0
    for array in host:
        crc = zlib.crc32(array.data, crc)
    checksum_s = time.perf_counter() - started
    with tempfile.NamedTemporaryFile(dir="/dev/shm", prefix="planaria-gpu-bench-") as file:
        started = time.perf_counter()
        for array in host:
            file.write(array.data)
        file.flush()
        write_s = time.perf_counter() - started
    return Breakdown(
        precision=p.value,
        snapshot_bytes=sum(a.nbytes for a in host),
        copy_s=copy_s,
        checksum_s=checksum_s,
        write_s=write_s,
    )


def train_arms(
    shape: shapes.ModelShape, tokens: data.Tokens, device: str, steps: int
) -> tuple[list[ArmRow], list[Breakdown]]:
    arms, parts = [], []
    for p in PRECISIONS:
        job = Job(shape, tokens, device, p)
        try:
            base = 0.0
            for interval in INTERVALS:
                row = run_arm(job, p, interval, steps, base)
                base = base or row.median_step_s  # the snapshot-free arm comes first
                arms.append(row)
            parts.append(breakdown(job, p))
        finally:
            job.close()
    return arms, parts


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu for a smoke run")
    parser.add_argument("--model", default="gpt3-medium", help="named model (default gpt3-medium)")
    parser.add_argument("--steps", type=int, default=10, help="measured steps per arm (default 10)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"JSON (default {RESULTS})")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: this machine has no CUDA device; use --device cpu")
    shape = shapes.named(args.model)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        profiles = [
            profile_row(args.model, args.device, p, Path(scratch) / f"{p}.json") for p in PRECISIONS
        ]
    tokens = data.load_default_corpus(max_bytes=4_000_000)
    arms, parts = train_arms(shape, tokens, args.device, args.steps)
    report = {
        "device": device_name(args.device),
        "torch": torch.__version__,
        "model": args.model,
        "micro_batch": MICRO_BATCH,
        "global_batch": GLOBAL_BATCH,
        "cpu_count": os.cpu_count(),
        "total_s": time.perf_counter() - started,
        "profiles": [asdict(row) for row in profiles],
        "arms": [asdict(row) for row in arms],
        "snapshot_breakdown": [asdict(row) for row in parts],
    }
    _print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


def _print(report: dict[str, Any]) -> None:
    print(
        f"{report['model']} on {report['device']} (torch {report['torch']}), "
        f"micro-batch {report['micro_batch']}, global batch {report['global_batch']}"
    )
    print("\nplanaria profile      command s   fwd+bwd s   state GiB   activations GiB")
    for row in report["profiles"]:
        print(
            f"  {row['precision']:<19} {row['command_s']:9.1f}   {row['forward_backward_s']:9.4f}"
            f"   {row['state_bytes'] / 2**30:9.3f}   {row['activation_bytes'] / 2**30:15.3f}"
        )
    print("\nprecision  snapshots   step s   goodput   wait s   achieved interval   GiB")
    for row in report["arms"]:
        every = "off" if not row["interval_steps"] else f"every {row['interval_steps']}"
        achieved = "-" if row["achieved_interval"] is None else f"{row['achieved_interval']:.1f}"
        print(
            f"  {row['precision']:<8} {every:<9} {row['median_step_s']:8.3f}"
            f"   {row['goodput']:7.1%}   {row['median_wait_s']:6.3f}   {achieved:>17}"
            f"   {row['snapshot_bytes'] / 2**30:5.2f}"
        )
    print("\none snapshot, parts timed alone   GiB   copy s   crc32 s   write s")
    for row in report["snapshot_breakdown"]:
        print(
            f"  {row['precision']:<30} {row['snapshot_bytes'] / 2**30:5.2f}   "
            f"{row['copy_s']:6.3f}   {row['checksum_s']:7.3f}   {row['write_s']:7.3f}"
        )
    print(f"\ntotal {report['total_s']:.0f} s")


if __name__ == "__main__":
    main()
