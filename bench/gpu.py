"""Benchmark for a machine with one GPU (issue #16 item 7): profile, precision, snapshots.

    .venv/bin/python -m bench.gpu [--device cuda] [--model gpt3-medium] [--steps 5] [--rounds 2]
                                  [--base /dev/shm] [--out bench/results/gpu.json]
    .venv/bin/python -m bench.gpu --device cpu --model tiny --steps 2 --rounds 1   # smoke check

Meant to finish in under 8 minutes on one H100 or H200 with the defaults. It measures:

1. `planaria profile --model M --device D --precision P` for fp32, tf32 and bf16 (a
   subprocess: the command a user runs): the command's wall time, and the profile's forward +
   backward seconds per micro-batch and state and activation bytes, summed over the layers.
2. A 1-worker job of the model (micro-batch 1, global batch 4: 4 micro-batches a step) trained
   by the agent's own training state (`training_thread.Training`, as `bench/snapshot_executor.py`
   drives it: the executor in a one-rank epoch, NCCL on cuda, and the epoch's snapshot writers
   into a store under --base, a tmpfs such as /dev/shm as on a node). fp32 and bf16 with
   snapshots off, every 5 steps and every step; tf32 with snapshots off. Arms are epochs of the
   same run, interleaved in rounds (A B C, then C B A) so that drift hits all alike. Per arm:
   the median step time (the executor's clock; the step's loss read syncs the GPU), the median
   time the step spent on snapshots on its critical path (begin + release, the heartbeat's
   `snapshot_s`), snapshots taken and skipped (a writer still busy at a due step skips it
   rather than block training), the achieved interval, and the overhead against the
   snapshot-free arm of the same precision.
3. Where a snapshot's overhead on a launch-bound (bf16) step comes from: the bf16 job with
   snapshots off while one part of the snapshot path runs beside it on its own, as the writer
   would run it every step: `copy` (after every step, the live state copied by the writer's
   copier into its staging buffers: pinned memory and a side stream on cuda; completed on
   another thread), `hash` (a thread checksumming a staged copy of the state with xxh3 without
   pause), `write` (a thread rewriting that copy into a file under --base without pause: the
   store's write path, its own xxh3 included). Each arm's overhead is against the snapshot-free
   arm of the same precision and round order; the sum of the three is not the whole (they
   contend with each other too), but the largest names what to change. --no-interference skips.
4. One snapshot's parts, each timed alone on the trained state: the staging copy (the writer's
   copier: on cuda pinned buffers and a side stream; first with the buffers allocated, then
   reused as every later snapshot does), the xxh3 checksum of the staged bytes (zlib.crc32 beside
   it, the old checksum), and the store's write of them into a file under --base, first touch
   and rewritten in place (both include the write's own xxh3, as the store does).

Prints a table and writes JSON with the GPU named. Not a timed test; nothing is asserted.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from bench import snapshot_executor
from planaria.agent.runtime import epoch_writers
from planaria.agent.state import durable_files, staging
from planaria.agent.training import data
from planaria.spec import profile_file
from planaria.wire import messages

RESULTS = Path(__file__).parent / "results" / "gpu.json"
MICRO_BATCH, NUM_MICRO_BATCHES = 1, 4
FP32, TF32, BF16 = messages.Precision.FP32, messages.Precision.TF32, messages.Precision.BF16
# Snapshot intervals measured per precision (0 = off); tf32 only for its step time.
ARMS = {FP32: (0, 5, 1), TF32: (0,), BF16: (0, 5, 1)}
# Parts of the snapshot path run alone beside snapshot-free steps (item 3 of the docstring),
# for the precision whose steps are launch-bound.
INTERFERERS = ("copy", "hash", "write")
INTERFERED = BF16


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
    median_snapshot_s: float  # on the step's critical path: begin + release
    snapshots_taken: int
    snapshots_skipped: int
    achieved_interval: float  # 0.0: fewer than two snapshots begun in an epoch
    overhead: float  # median step time over the precision's snapshot-free arm's, minus 1


@dataclass(frozen=True, slots=True, kw_only=True)
class InterferenceRow:
    precision: str
    part: str  # one of INTERFERERS
    steps: int
    median_step_s: float
    overhead: float  # median step time over the snapshot-free arm's, minus 1
    part_rounds: int  # how many times the part ran to completion during the arm


@dataclass(frozen=True, slots=True, kw_only=True)
class Breakdown:
    precision: str
    snapshot_bytes: int
    alloc_s: float  # allocating the staging buffers (pinned on cuda): once per worker now
    copy_first_s: float  # the first copy into them
    copy_s: float  # the buffers reused, as every later snapshot
    xxh3_s: float
    crc32_s: float
    write_first_s: float  # a new file: every page touched for the first time
    write_s: float  # rewritten in place, as the store rewrites its double-buffered files
    file_threads: int  # --file-threads (`snapshot_writer.WriterConfig.file_threads`)
    write_threads_s: float  # one file per layer rewritten in place by that many threads


def profile_row(model: str, device: str, precision: messages.Precision, out: Path) -> ProfileRow:
    """Run `planaria profile` for `precision` and sum its layers."""
    command = [sys.executable, "-m", "planaria", "profile", "--model", model]
    command += ["--micro-batch", str(MICRO_BATCH), "--device", device]
    command += ["--precision", precision.value, "--repeats", "3", "--warmup", "1"]
    command += ["--out", str(out)]
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


def _sync(device: messages.Device) -> None:
    if device is messages.Device.CUDA:
        torch.cuda.synchronize()


def breakdown(
    worker: snapshot_executor.Worker, p: messages.Precision, base: Path, threads: int
) -> Breakdown:
    """One snapshot's parts timed alone on the trained state (module docstring, item 3)."""
    layers = worker.training.holding.layers
    assert layers is not None
    states = epoch_writers.live_states(layers)
    stage = staging.Staging(staging.copier_for(torch.device(worker.device.value)))
    started = time.perf_counter()
    copies = [stage.prepare(s, [range(0, sum(t.nbytes for t in s.tensors()))]) for s in states]
    alloc_s = time.perf_counter() - started  # the staging buffers (pinned on cuda)
    timed = []
    for _ in range(2):  # the first copy, then again
        _sync(worker.device)
        started = time.perf_counter()
        stage.copier.launch([c.copy for c in copies]).complete()
        timed.append(time.perf_counter() - started)
    chunks = [view for c in copies for view in c.staged.views(0, c.staged.nbytes)]
    started = time.perf_counter()
    durable_files.checksum_of("xxh3", chunks)
    xxh3_s = time.perf_counter() - started
    started = time.perf_counter()
    crc = 0
    for chunk in chunks:
        crc = zlib.crc32(chunk.data, crc)
    crc32_s = time.perf_counter() - started
    writes = []
    with tempfile.TemporaryDirectory(prefix="planaria-gpu-bench-", dir=base) as scratch:
        path = Path(scratch) / "snapshot"
        for reuse in (False, True):
            started = time.perf_counter()
            durable_files.write_private_file(path, chunks, "xxh3", reuse=reuse)
            writes.append(time.perf_counter() - started)
        path.unlink()
        layer_files = [
            (Path(scratch) / f"layer-{i}", list(c.staged.views(0, c.staged.nbytes)))
            for i, c in enumerate(copies)
        ]

        def write(pair: tuple[Path, list[Any]]) -> str:
            return durable_files.write_private_file(pair[0], pair[1], "xxh3", reuse=True)

        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(write, layer_files))  # first touch, as the store's first snapshot
            started = time.perf_counter()
            list(pool.map(write, layer_files))
            writes.append(time.perf_counter() - started)
    return Breakdown(
        precision=p.value,
        snapshot_bytes=sum(c.staged.nbytes for c in copies),
        alloc_s=alloc_s,
        copy_first_s=timed[0],
        copy_s=timed[1],
        xxh3_s=xxh3_s,
        crc32_s=crc32_s,
        write_first_s=writes[0],
        write_s=writes[1],
        file_threads=threads,
        write_threads_s=writes[2],
    )


class Interferer:
    """One part of the snapshot path (`INTERFERERS`) run beside training on the worker's live
    state, without the rest of the writer: `between_steps` is called on the training thread
    after every step (the copy is launched there, as `SnapshotWriter.begin` launches it); the
    hash and write parts run on their own thread until `stop`."""

    def __init__(
        self, part: str, worker: snapshot_executor.Worker, base: Path, copier: staging.Copier
    ) -> None:
        """`copier`: shared by the arms, so that its pool's (pinned) buffers are allocated
        once, not per arm (4.3 s for gpt3-medium's 4.9 GB on the H200 host)."""
        layers = worker.training.holding.layers
        assert layers is not None
        self.part, self.rounds = part, 0
        self._stage = staging.Staging(copier)
        states = epoch_writers.live_states(layers)
        self._copies = [
            self._stage.prepare(s, [range(0, sum(t.nbytes for t in s.tensors()))]) for s in states
        ]
        self._stage.copier.launch([c.copy for c in self._copies]).complete()
        self._chunks = [v for c in self._copies for v in c.staged.views(0, c.staged.nbytes)]
        self._file = base / f"interference-{part}"
        self._ticket: staging.Ticket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._completer = concurrent.futures.ThreadPoolExecutor(1)
        self._completed: concurrent.futures.Future[None] | None = None
        if part in ("hash", "write"):
            if part == "write":  # first touch outside the measurement, as a store's first write
                durable_files.write_private_file(self._file, self._chunks, "xxh3")
            self._thread = threading.Thread(target=self._loop, name=f"interfere-{part}")
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self.part == "hash":
                durable_files.checksum_of("xxh3", self._chunks)
            else:
                durable_files.write_private_file(self._file, self._chunks, "xxh3", reuse=True)
            self.rounds += 1

    def between_steps(self) -> None:
        if self.part != "copy":
            return
        if self._completed is not None:
            self._completed.result()  # the last copy (one snapshot in flight, as the writer)
        self._ticket = self._stage.copier.launch([c.copy for c in self._copies])
        self._completed = self._completer.submit(self._complete, self._ticket)

    def _complete(self, ticket: staging.Ticket) -> None:
        ticket.complete()
        self.rounds += 1

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._completed is not None:
            self._completed.result()
        self._completer.shutdown()
        self._stage.close()
        self._file.unlink(missing_ok=True)


def interference_arm(
    worker: snapshot_executor.Worker,
    part: str,
    steps: int,
    base: Path,
    copier: staging.Copier,
    arm: list[float],
) -> int:
    """Snapshot-free steps of `worker` with the part `part` running beside them; appends the
    step times to `arm` and returns how many times the part ran to completion."""
    worker.arm(0)
    worker.training.run_step()  # warm-up: the epoch's first step allocates
    interferer = Interferer(part, worker, base, copier)
    try:
        interferer.between_steps()
        for _ in range(steps):
            arm.append(worker.training.run_step().timings.step_s)
            interferer.between_steps()
    finally:
        interferer.stop()
        worker.training.end_epoch()
    return interferer.rounds


def train_arms(
    args: argparse.Namespace, corpus: Path, base: Path
) -> tuple[list[ArmRow], list[InterferenceRow], list[Breakdown]]:
    device = messages.Device(args.device)
    rows: list[ArmRow] = []
    interfered: list[InterferenceRow] = []
    parts: list[Breakdown] = []
    for p, intervals in ARMS.items():
        stores = Path(tempfile.mkdtemp(prefix=f"planaria-gpu-bench-{p.value}-", dir=base))
        worker = snapshot_executor.Worker(
            args.model,
            corpus,
            stores,
            device=device,
            precision=p,
            micro_batch=MICRO_BATCH,
            num_micro_batches=NUM_MICRO_BATCHES,
        )
        arms = {i: snapshot_executor.Arm(step_s=[], snapshot_s=[]) for i in intervals}
        parts_of = INTERFERERS if p is INTERFERED and not args.no_interference else ()
        beside: dict[str, list[float]] = {part: [] for part in parts_of}
        completions = dict.fromkeys(parts_of, 0)
        order: list[int | str] = [*intervals, *parts_of]
        copier = staging.copier_for(torch.device(device.value))
        try:
            for r in range(args.rounds):
                for which in order if r % 2 == 0 else reversed(order):
                    if isinstance(which, int):
                        worker.run(which, args.steps, arms[which])
                        print(f"  {p.value} every {which or '-'}: done", flush=True)
                    else:
                        completions[which] += interference_arm(
                            worker, which, args.steps, stores, copier, beside[which]
                        )
                        print(f"  {p.value} beside {which}: done", flush=True)
            if len(intervals) > 1:
                parts.append(breakdown(worker, p, base, args.file_threads))
        finally:
            worker.close()
            copier.trim()  # the interference arms' staging buffers
            del worker, copier
            shutil.rmtree(stores)  # a precision's double-buffered store: twice its state
            gc.collect()
            if device is messages.Device.CUDA:
                torch.cuda.empty_cache()
        off = statistics.median(arms[0].step_s)
        for part, times in beside.items():
            interfered.append(
                InterferenceRow(
                    precision=p.value,
                    part=part,
                    steps=len(times),
                    median_step_s=statistics.median(times),
                    overhead=statistics.median(times) / off - 1,
                    part_rounds=completions[part],
                )
            )
        for interval, arm in arms.items():
            step = statistics.median(arm.step_s)
            achieved = [a for a in arm.achieved or [] if a]
            rows.append(
                ArmRow(
                    precision=p.value,
                    interval_steps=interval,
                    steps=len(arm.step_s),
                    median_step_s=step,
                    median_snapshot_s=statistics.median(arm.snapshot_s),
                    snapshots_taken=arm.taken,
                    snapshots_skipped=arm.skipped,
                    achieved_interval=statistics.mean(achieved) if achieved else 0.0,
                    overhead=step / off - 1,
                )
            )
    return rows, interfered, parts


def _nccl_version() -> str:
    version = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
    return ".".join(map(str, version))


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--model", default="gpt3-medium", help="named model (default gpt3-medium)")
    parser.add_argument("--steps", type=int, default=5, help="measured steps per arm and round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the arms (default 2)")
    parser.add_argument("--base", type=Path, default=Path("/dev/shm"), help="tmpfs for stores")
    parser.add_argument("--no-profile", action="store_true", help="skip `planaria profile`")
    parser.add_argument(
        "--no-interference", action="store_true", help="skip the snapshot parts run alone"
    )
    parser.add_argument(
        "--file-threads", type=int, default=4, help="threads of the parallel write (default 4)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"JSON (default {RESULTS})")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: this machine has no CUDA device; use --device cpu")
    started = time.perf_counter()
    profiles = []
    with tempfile.TemporaryDirectory(prefix="planaria-gpu-bench-", dir=args.base) as scratch:
        for p in () if args.no_profile else (FP32, TF32, BF16):
            profiles.append(profile_row(args.model, args.device, p, Path(scratch) / f"{p}.json"))
            print(f"  profile {p.value}: {profiles[-1].command_s:.1f} s", flush=True)
        corpus = Path(scratch) / "corpus.txt"
        corpus.write_bytes(data.decode(data.load_default_corpus(max_bytes=4_000_000)).encode())
        arms, interfered, parts = train_arms(args, corpus, Path(scratch))
    report = {
        "device": device_name(args.device),
        "torch": torch.__version__,
        "nccl": _nccl_version() if args.device == "cuda" else None,
        "model": args.model,
        "micro_batch": MICRO_BATCH,
        "global_batch": MICRO_BATCH * NUM_MICRO_BATCHES,
        "steps_per_arm": args.steps * args.rounds,
        "cpu_count": os.cpu_count(),
        "total_s": time.perf_counter() - started,
        "profiles": [asdict(row) for row in profiles],
        "arms": [asdict(row) for row in arms],
        "interference": [asdict(row) for row in interfered],
        "snapshot_breakdown": [asdict(row) for row in parts],
    }
    _print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


def _print(report: dict[str, Any]) -> None:
    print(
        f"{report['model']} on {report['device']} (torch {report['torch']}, NCCL "
        f"{report['nccl']}), micro-batch {report['micro_batch']}, global batch "
        f"{report['global_batch']}, {report['steps_per_arm']} measured steps per arm"
    )
    print("\nplanaria profile  command s   fwd+bwd s   state GiB   activations GiB")
    for row in report["profiles"]:
        print(
            f"  {row['precision']:<15} {row['command_s']:9.1f}   {row['forward_backward_s']:9.4f}"
            f"   {row['state_bytes'] / 2**30:9.3f}   {row['activation_bytes'] / 2**30:15.3f}"
        )
    print("\nprecision  snapshots   step s   snap s   taken  skipped  achieved  overhead")
    for row in report["arms"]:
        every = "off" if not row["interval_steps"] else f"every {row['interval_steps']}"
        print(
            f"  {row['precision']:<8} {every:<9} {row['median_step_s']:7.4f}"
            f"  {row['median_snapshot_s']:7.4f}  {row['snapshots_taken']:5}"
            f"  {row['snapshots_skipped']:7}  {row['achieved_interval']:8.2f}"
            f"  {row['overhead']:+8.1%}"
        )
    if report["interference"]:
        print("\nsnapshots off, one part beside   step s   overhead   part ran")
        for row in report["interference"]:
            print(
                f"  {row['precision']:<8} {row['part']:<22} {row['median_step_s']:7.4f}"
                f"   {row['overhead']:+8.1%}   {row['part_rounds']:8}"
            )
    print(
        "\none snapshot, timed alone  GiB  alloc s  copy 1st s  copy s  xxh3 s  crc32 s"
        "  write 1st s  write s  threads  write s"
    )
    for row in report["snapshot_breakdown"]:
        print(
            f"  {row['precision']:<22} {row['snapshot_bytes'] / 2**30:5.2f}"
            f"  {row['alloc_s']:7.3f}  {row['copy_first_s']:10.3f}  {row['copy_s']:6.3f}"
            f"  {row['xxh3_s']:6.3f}"
            f"  {row['crc32_s']:7.3f}  {row['write_first_s']:11.3f}  {row['write_s']:7.3f}"
            f"  {row['file_threads']:7}  {row['write_threads_s']:7.3f}"
        )
    print(f"\ntotal {report['total_s']:.0f} s")


if __name__ == "__main__":
    main()
