"""What each recovery tier costs one worker to find a whole model's layers, on this machine.

    .venv/bin/python bench/recovery_tiers.py [--shapes tiny,small] [--repeats 5]
                                             [--out bench/results/recovery_tiers.json]

One process plays a worker that must find every planner layer of a shape at step 1 through
`epoch_setup.Locator` (the runtime's tier order), with its cheaper tiers made to fail so the
measured tier serves:

    LOCAL_SNAPSHOT   its own store holds the layers (member 0 of groups of 2, COPY: its shard
                     plus its copy of the peer's rebuild each layer)
    PEER_SNAPSHOT    its own store is empty; worker 0, another process, sends its pieces (its
                     shard and its copy of the peer's: COPY in groups of 2) over the epoch's
                     gloo process group on loopback (`snapshot_exchange`), verified on arrival,
                     and they rebuild each layer: the path a pod on another node takes
    CHECKPOINT       no snapshot anywhere; the persistent checkpoint (on this machine's disk)
    INITIAL          every layer built from the seed with its AdamW (what step 0 needs)
    copy (local)     LIVE_REPLICA's in-process part: flatten on the source, pour into the
                     destination's template (no network; layer_transfer.flatten / fill)

and what the mirrors cost a snapshot (issue #20): two processes, one pipeline of two stages
(worker 0 the first half of the layers, worker 1 the rest, one node each, COPY), each snapshot
its stage with `snapshot_writer` (begin, then wait: the whole background write), once without
mirrors and once with them (`snapshot_mirrors.Link`: each sends its stage's files to the other,
which verifies and stores them). Reported for worker 1: the median write seconds of each, and
the bytes its mirror received (the other stage's snapshot).

Stores live under /dev/shm when it exists (as the agents' do), the checkpoint under a temporary
directory. Reported: the median seconds over `repeats`, the bytes of layer state found and the
throughput (state bytes found per second). Live-replica copies between processes are not
measured here (the runtime tests run them; bench/recovery.py is the end-to-end figure).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import multiprocessing
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch._C import _distributed_c10d as c10d

from planaria.agent.execution import groups, held_layers
from planaria.agent.recovery import epoch_setup, layer_transfer, snapshot_exchange, snapshot_mirrors
from planaria.agent.state import checkpoints, snapshot_store, snapshot_writer
from planaria.agent.training import data, model, semantics
from planaria.contract import plan, shapes
from planaria.wire import messages

Tier = messages.RecoveryTier
STEP = 1
PAIR = (plan.WorkerId(0), plan.WorkerId(7))
COPY = messages.RedundancyMode.COPY  # the holder, and the worker that holds nothing
LOOPBACK = "127.0.0.1"


def _trained(config: semantics.TrainingConfig) -> dict[int, model.LayerState]:
    """Every layer after one AdamW step on a constant gradient (moments are non-zero)."""
    states = {}
    for i in range(config.shape.num_planner_layers):
        module = model.build_layer(config.shape, config.seed, i)
        optimizer = model.make_optimizer(module, config.optimizer)
        for p in module.parameters():
            p.grad = torch.full_like(p, 1e-3)
        optimizer.step()
        states[i] = model.extract_layer_state(i, module, optimizer)
    return states


def _write(base: Path, states: dict[int, model.LayerState], ckpt: Path) -> None:
    """Workers 0 and 1 snapshot every layer at STEP (groups of 2, COPY) and checkpoint it."""
    group = (plan.WorkerId(0), plan.WorkerId(1))
    for worker in group:
        store = snapshot_store.SnapshotStore(snapshot_store.store_root("bench", worker, base))
        config = snapshot_writer.WriterConfig(
            job="bench", worker=worker, redundancy=messages.RedundancyMode.COPY
        )
        writer = snapshot_writer.SnapshotWriter(store, config)
        writer.begin(
            step=STEP, epoch=1, states=list(states.values()), groups=dict.fromkeys(states, group)
        )
        writer.wait()
        writer.close()
        saver = checkpoints.CheckpointWriter(
            checkpoints.CheckpointConfig(root=ckpt, worker=worker, interval_steps=1)
        )
        saver.begin(store, STEP)
        saver.wait()
        saver.close()


def _finder(
    job: semantics.Job,
    base: Path,
    own: int,
    checkpoint: str,
    epoch: groups.Epoch | None = None,
) -> Callable[[], dict[int, Tier]]:
    """One worker finding every layer at STEP; with `epoch`, after an exchange round with
    its peers (which must run theirs: `_holder`)."""
    store = snapshot_store.SnapshotStore(snapshot_store.store_root("bench", own, base))
    stores = epoch_setup.Stores(own=store, checkpoint_dir=checkpoint)
    layers = range(job.config.shape.num_planner_layers)

    def find() -> dict[int, Tier]:
        nothing = epoch_setup.Holding(layers=None, step=-1)
        locator = epoch_setup.Locator(job=job, holding=nothing, stores=stores, step=STEP)
        if epoch is not None:
            locator.peers = snapshot_exchange.exchange(
                epoch=epoch, step=STEP, wanted=locator.wanted(layers), own=store, workers=PAIR
            )
        return {i: locator.find(i)[0] for i in layers}

    return find


def _form(port: int, rank: int) -> groups.Epoch:
    store = c10d.TCPStore(LOOPBACK, port, None, False, datetime.timedelta(seconds=60))
    return groups.form_epoch(store, 1, rank, len(PAIR), messages.Backend.GLOO, 120.0)


def _holder(base: str, port: int, rounds: int) -> None:
    """Worker 0's process: serve `rounds` exchange rounds from its store, wanting nothing."""
    torch.set_num_threads(1)
    epoch = _form(port, 0)
    store = snapshot_store.SnapshotStore(snapshot_store.store_root("bench", PAIR[0], Path(base)))
    for _ in range(rounds):
        snapshot_exchange.exchange(epoch=epoch, step=STEP, wanted=[], own=store, workers=PAIR)
    groups.leave_epoch(epoch)


def _peer_arm(job: semantics.Job, base: Path, repeats: int) -> tuple[float, object]:
    """Median seconds for worker 7 (an empty store) to find every layer from worker 0's
    pieces over gloo on loopback; the holder runs in its own process."""
    server = c10d.TCPStore(LOOPBACK, 0, None, True, datetime.timedelta(seconds=60))
    context = multiprocessing.get_context("spawn")
    holder = context.Process(target=_holder, args=(str(base), server.port, repeats))
    holder.start()
    epoch = _form(server.port, 1)
    try:
        return _median_s(_finder(job, base, PAIR[1], "", epoch), repeats)
    finally:
        groups.leave_epoch(epoch)
        holder.join(60)


def _stage_plan(num_layers: int) -> plan.Plan:
    half = num_layers // 2
    stages = (
        plan.Stage(layer_start=0, layer_stop=half, workers=(plan.WorkerId(0),)),
        plan.Stage(layer_start=half, layer_stop=num_layers, workers=(plan.WorkerId(1),)),
    )
    return plan.Plan(
        pipelines=(plan.Pipeline(stages=stages, num_micro_batches=1),), micro_batch_size=1
    )


def _mirror_side(shape: str, base: str, port: int, rank: int, repeats: int) -> list[float]:
    """Worker `rank`'s snapshots of its stage: `repeats` without mirrors, then `repeats`
    with them; the seconds of each (begin to complete)."""
    torch.set_num_threads(1)
    config = semantics.TrainingConfig(
        shape=shapes.named(shape), seed=1, global_batch_size=2, micro_batch_size=1
    )
    stage_plan = _stage_plan(config.shape.num_planner_layers)
    worker = plan.WorkerId(rank)
    held = stage_plan.pipelines[0].stages[rank].layers
    mine = [s for i, s in _trained(config).items() if i in held]
    groups_of = {s.index: (worker,) for s in mine}
    epoch = _form(port, rank)
    link = snapshot_mirrors.Link(
        epoch=epoch, plan=stage_plan, worker=worker, job="bench", redundancy=COPY
    )
    times = []
    for mirrors in (None, link):
        label = "plain" if mirrors is None else "mirrored"
        root = snapshot_store.store_root("bench", rank, Path(base) / label)
        writer = snapshot_writer.SnapshotWriter(
            snapshot_store.SnapshotStore(root),
            snapshot_writer.WriterConfig(job="bench", worker=worker, redundancy=COPY),
            mirrors=mirrors,
        )
        for step in range(1, repeats + 1):
            started = time.perf_counter()
            writer.begin(step=step, epoch=1, states=mine, groups=groups_of)
            manifest = writer.wait()
            times.append(time.perf_counter() - started)
            assert manifest is not None
        writer.close()
    groups.leave_epoch(epoch)
    return times


def _mirror_child(shape: str, base: str, port: int, repeats: int) -> None:
    _mirror_side(shape, base, port, 0, repeats)


def _mirror_arm(shape: str, base: Path, repeats: int) -> tuple[float, float, int]:
    """Worker 1's median snapshot seconds without and with mirrors, and the bytes it
    mirrors (worker 0's stage), worker 0 in its own process."""
    server = c10d.TCPStore(LOOPBACK, 0, None, True, datetime.timedelta(seconds=60))
    context = multiprocessing.get_context("spawn")
    other = context.Process(target=_mirror_child, args=(shape, str(base), server.port, repeats))
    other.start()
    try:
        times = _mirror_side(shape, str(base), server.port, 1, repeats)
    finally:
        other.join(120)
    root = snapshot_store.store_root("bench", 1, base / "mirrored")
    latest = snapshot_store.SnapshotStore(root).latest()
    mirrored = sum(
        f.stop - f.start for e in latest.layers if e.group[e.member] != 1 for f in e.files
    )
    return statistics.median(times[:repeats]), statistics.median(times[repeats:]), mirrored


def _median_s(run: Callable[[], object], repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def _copy(config: semantics.TrainingConfig, states: dict[int, model.LayerState]) -> None:
    for i, state in states.items():
        template = model.initial_state(config.shape, config.seed, i, config.optimizer)
        layer_transfer.fill(template, layer_transfer.flatten(state))


def measure(shape: str, repeats: int, root: Path) -> list[dict[str, object]]:
    config = semantics.TrainingConfig(
        shape=shapes.named(shape), seed=1, global_batch_size=2, micro_batch_size=1
    )
    job = semantics.Job.from_tokens(config, data.load_default_corpus(max_bytes=50_000))
    states = _trained(config)
    total = sum(s.nbytes for s in states.values())
    base, empty, ckpt = root / "shm", root / "empty", root / "ckpt"
    _write(base, states, ckpt)
    (empty / "bench").mkdir(parents=True)

    def timed(run: Callable[[], object]) -> Callable[[], tuple[float, object]]:
        return lambda: _median_s(run, repeats)

    arms: list[tuple[str, Callable[[], tuple[float, object]]]] = [
        ("local_snapshot", timed(_finder(job, base, 0, ""))),
        ("peer_snapshot", lambda: _peer_arm(job, base, repeats)),
        ("checkpoint", timed(_finder(job, empty, 0, str(ckpt)))),
        ("initial", timed(lambda: held_layers.HeldLayers.build(config, states))),
        ("copy (local)", timed(lambda: _copy(config, states))),
    ]
    rows = []
    for name, arm in arms:
        seconds, tiers = arm()
        if isinstance(tiers, dict):  # the arm was served by the tier it measures
            assert set(tiers.values()) == {Tier(name)}, (name, tiers)
        rows.append(
            {
                "shape": shape,
                "tier": name,
                "seconds": seconds,
                "bytes": total,
                "mb_per_s": total / seconds / 1e6,
            }
        )
    plain_s, mirrored_s, mirrored = _mirror_arm(shape, root, repeats)
    for name, seconds in (("snapshot, own", plain_s), ("snapshot+mirror", mirrored_s)):
        rows.append(
            {
                "shape": shape,
                "tier": name,
                "seconds": seconds,
                "bytes": mirrored,
                "mb_per_s": mirrored / seconds / 1e6,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="tiny,small")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="bench/results/recovery_tiers.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.ERROR)  # the tiers below the measured one log their misses
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    rows = []
    for shape in args.shapes.split(","):
        root = Path(tempfile.mkdtemp(prefix="planaria-tiers-", dir=shm))
        try:
            rows += measure(shape, args.repeats, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{'shape':<8}{'tier':<16}{'seconds':>10}{'MB':>9}{'MB/s':>9}")
    for row in rows:
        print(
            f"{row['shape']:<8}{row['tier']:<16}{row['seconds']:>10.4f}"
            f"{row['bytes'] / 1e6:>9.2f}{row['mb_per_s']:>9.0f}"  # type: ignore[operator]
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"repeats": args.repeats, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
