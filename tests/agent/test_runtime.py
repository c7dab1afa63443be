"""The agent runtime (planaria.agent.runtime.runtime) against the reference trainer, its oracle.

Covers, across worker processes (gloo on loopback, tests/agent/runtime_cluster.py): a first
epoch from the seed (INITIAL) trains exactly like the reference (exact mode: every comparison is
bit for bit, `comparison.compare`, losses included); a data-parallel worker killed (SIGKILL)
before its update leaves both survivors FAILED with PEER_LOST at the same committed step, and
they go on over the survivors with their layers KEPT, losslessly; a re-split of 2x2 stages into
1x3 copies exactly the missing layers' bytes from live replicas (LIVE_REPLICA, one layer from
two sources) and goes on losslessly; a killed pipeline stage restarted as a fresh process
reloads its own snapshot (LOCAL_SNAPSHOT) while the survivor rolls back from its own,
losslessly; with RECOMPUTE redundancy a restarted data-parallel replica rebuilds its layers from
its own shard plus its host-recomputed copy of the peer's (LOCAL_SNAPSHOT), losslessly. Both
resume at the snapshot step the survivor's heartbeat reports, as the controller does: one
complete on every worker, the killed one included, though writes run in the background. In this
process (a one-rank epoch): a corrupted snapshot shard is caught by its checksum and the
persistent checkpoint is used instead (CHECKPOINT), losslessly; with no tier left the agent
latches SNAPSHOT_UNAVAILABLE and is FAILED; an error of the agent's own is latched with the kind
the controller acts on (a missing corpus INVALID_DATA, an unknown model INVALID_CONFIG, memory
running out in a step OUT_OF_MEMORY, a step's ValueError INTERNAL); configure refusals (wrong
worker, stale epoch, a running agent asked to resume at or before its step), pause/resume and
stop; a Configure accepted during a set-up that then fails is taken up after it, not dropped as
a planned switch; a set-up released at its rendezvous because the epoch was given up latches
PEER_LOST, saying so, not TIMEOUT. Final states are read from the snapshot stores
(runtime_states.read_final_states).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch._C import _distributed_c10d as c10d

from planaria.agent.execution import executor
from planaria.agent.runtime import runtime, runtime_states, training_thread
from planaria.agent.state import snapshot_store
from planaria.agent.training import comparison, data, model
from planaria.contract import plan, rendezvous
from planaria.wire import messages
from tests.agent import runtime_cluster

State = messages.AgentState
PATIENCE_S = 60.0  # only ever reached when the code under test is broken
Tier = messages.RecoveryTier
W = plan.WorkerId
Stages = list[tuple[int, int, int]]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_bytes(data.load_default_corpus(max_bytes=100_000).tobytes())
    return path


def _settings(corpus: Path, **changes: object) -> messages.TrainingSettings:
    values: dict[str, object] = {
        "model": "tiny",
        "seed": 5,
        "optimizer": messages.OptimizerSettings(lr=3e-3, eps=1e-6),  # eps: see test_executor
        "global_batch_size": 4,
        "data": messages.DataSettings(corpus_paths=(str(corpus),)),
        "device": messages.Device.CPU,
        "snapshot_interval_steps": 1,
        "redundancy": messages.RedundancyMode.XOR,
        "reduction": messages.Reduction.EXACT,  # every comparison below is bit for bit
    }
    values.update(changes)
    return messages.TrainingSettings(**values)  # type: ignore[arg-type]


def _plan(*pipelines: tuple[Stages, int]) -> plan.Plan:
    return plan.Plan(
        pipelines=tuple(
            plan.Pipeline(
                stages=tuple(
                    plan.Stage(layer_start=a, layer_stop=b, workers=(W(w),)) for a, b, w in stages
                ),
                num_micro_batches=n,
            )
            for stages, n in pipelines
        ),
        micro_batch_size=1,
    )


def _config(
    rendezvous: messages.Rendezvous,
    p: plan.Plan,
    worker: int,
    settings: messages.TrainingSettings,
    *,
    epoch: int,
    resume: int,
    stop: int | None,
    transfers: tuple[plan.LayerTransfer, ...] = (),
) -> messages.WorkerConfig:
    mine = tuple(t for t in transfers if worker == t.destination or worker in t.sources)
    return messages.WorkerConfig(
        epoch=epoch,
        worker=W(worker),
        plan=p,
        resume_step=resume,
        rendezvous=rendezvous,
        transfers=mine,
        settings=settings,
        stop_step=stop,
    )


def _assert_like_reference(
    job: str, base: Path, p: plan.Plan, settings: messages.TrainingSettings, step: int
) -> None:
    got = runtime_states.read_final_states(job, base, p, step)
    want, _ = runtime_states.reference_states(settings, p.micro_batch_size, step)
    result = comparison.compare(got, want)  # step counts included
    assert result.equal, result.describe()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[runtime_cluster.RuntimeCluster]:
    pool = runtime_cluster.RuntimeCluster(job="job", base=tmp_path / "shm")
    yield pool
    pool.close()


def _start_epoch(
    cluster: runtime_cluster.RuntimeCluster,
    p: plan.Plan,
    settings: messages.TrainingSettings,
    **kwargs: object,
) -> None:
    epoch = kwargs["epoch"]
    assert isinstance(epoch, int)
    for w in p.workers:
        rendezvous = cluster.rendezvous(p, w, epoch)
        ack = cluster.configure(w, _config(rendezvous, p, w, settings, **kwargs))  # type: ignore[arg-type]
        assert ack.accepted, ack.reason
    if epoch > 1:  # until an agent takes the Configure up, it shows the old epoch's FAILED
        cluster.wait(p.workers, lambda beat: beat.epoch == epoch)


def _finished(beat: messages.Heartbeat) -> bool:
    assert beat.state is not State.FAILED, beat.errors
    return beat.state is State.FINISHED


def _failed(beat: messages.Heartbeat) -> bool:
    return beat.state is State.FAILED


# --- across processes ---------------------------------------------------------------------


def test_a_first_epoch_from_the_seed_trains_like_the_reference(
    cluster: runtime_cluster.RuntimeCluster, corpus: Path
) -> None:
    settings = _settings(corpus)
    p = _plan(([(0, 3, 0), (3, 6, 1)], 4))
    cluster.start([0, 1])
    _start_epoch(cluster, p, settings, epoch=1, resume=0, stop=4)
    beats = cluster.wait([0, 1], _finished)
    _, losses = runtime_states.reference_states(settings, 1, 4)
    for beat in beats.values():
        assert beat.last_committed_step == 4 and beat.samples_processed == 16
        assert beat.loss == losses[-1]
        assert beat.setup is not None and beat.setup.tier is Tier.INITIAL
        assert beat.snapshot.latest_step == 4
    _assert_like_reference("job", cluster.base, p, settings, 4)


def test_survivors_of_a_killed_data_parallel_worker_keep_their_layers_and_go_on(
    cluster: runtime_cluster.RuntimeCluster, corpus: Path
) -> None:
    settings = _settings(corpus)
    three = _plan(([(0, 6, 0)], 2), ([(0, 6, 1)], 1), ([(0, 6, 2)], 1))
    cluster.start([0, 1, 2], kills={2: runtime_cluster.Kill(step=3)})
    _start_epoch(cluster, three, settings, epoch=1, resume=0, stop=6)
    started = time.monotonic()
    beats = cluster.wait([0, 1], _failed)
    assert time.monotonic() - started < 5.0  # the epoch's timeout is 6 s
    cluster.wait_dead(2)
    assert {b.last_committed_step for b in beats.values()} == {2}
    # One survivor sees the dead peer's connection close; gloo may never fail the other's wait
    # on the dead peer, which gives up when the first flags the epoch's failure: both at once.
    assert all(b.errors[-1].kind is messages.ErrorKind.PEER_LOST for b in beats.values())
    two = _plan(([(0, 6, 0)], 2), ([(0, 6, 1)], 2))
    _start_epoch(cluster, two, settings, epoch=2, resume=2, stop=5)
    beats = cluster.wait([0, 1], _finished)
    assert all(b.setup is not None and b.setup.tier is Tier.KEPT for b in beats.values())
    assert all(b.setup is not None and b.setup.received_bytes == 0 for b in beats.values())
    _assert_like_reference("job", cluster.base, two, settings, 5)


def test_survivors_of_a_killed_pipeline_stage_replica_re_plan_onto_one_pipeline(
    cluster: runtime_cluster.RuntimeCluster, corpus: Path
) -> None:
    """Two pipelines of two stages: each rank is outside the other stage's all-reduce group
    (torch's non-member placeholder), which a failed step's abort must skip, not crash on."""
    settings = _settings(corpus)
    grid = _plan(([(0, 3, 0), (3, 6, 1)], 2), ([(0, 3, 2), (3, 6, 3)], 2))
    cluster.start([0, 1, 2, 3], kills={3: runtime_cluster.Kill(step=3)})
    _start_epoch(cluster, grid, settings, epoch=1, resume=0, stop=6)
    beats = cluster.wait([0, 1, 2], _failed)
    cluster.wait_dead(3)
    assert {b.last_committed_step for b in beats.values()} == {2}
    assert all(b.errors[-1].kind is messages.ErrorKind.PEER_LOST for b in beats.values())
    one = _plan(([(0, 3, 0), (3, 6, 1)], 4))
    _start_epoch(cluster, one, settings, epoch=2, resume=2, stop=5)
    cluster.wait([0, 1], _finished)
    _assert_like_reference("job", cluster.base, one, settings, 5)


def test_a_re_split_copies_exactly_the_missing_layers_from_live_replicas(
    cluster: runtime_cluster.RuntimeCluster, corpus: Path
) -> None:
    settings = _settings(corpus)
    before = _plan(([(0, 3, 0), (3, 6, 1)], 2), ([(0, 3, 2), (3, 6, 3)], 2))
    cluster.start([0, 1, 2, 3])
    _start_epoch(cluster, before, settings, epoch=1, resume=0, stop=2)
    cluster.wait([0, 1, 2, 3], _finished)
    after = _plan(([(0, 2, 0), (2, 4, 1), (4, 6, 2)], 4))
    transfers = (
        plan.LayerTransfer(layer=2, destination=W(1), sources=(W(0), W(2))),
        plan.LayerTransfer(layer=4, destination=W(2), sources=(W(1),)),
        plan.LayerTransfer(layer=5, destination=W(2), sources=(W(1),)),
    )
    _start_epoch(cluster, after, settings, epoch=2, resume=2, stop=4, transfers=transfers)
    beats = cluster.wait([0, 1, 2], _finished)
    config = training_thread.training_config(settings, 1)
    size = {
        i: model.initial_state(config.shape, config.seed, i, config.optimizer).nbytes
        for i in (2, 4, 5)
    }
    setups = {w: b.setup for w, b in beats.items()}
    assert all(s is not None for s in setups.values())
    tiers = {w: s.tier for w, s in setups.items() if s is not None}
    assert tiers == {0: Tier.KEPT, 1: Tier.LIVE_REPLICA, 2: Tier.LIVE_REPLICA}
    received = {w: s.received_bytes for w, s in setups.items() if s is not None}
    sent = {w: s.sent_bytes for w, s in setups.items() if s is not None}
    assert received == {0: 0, 1: size[2], 2: size[4] + size[5]}
    assert sent == {0: size[2] // 2, 1: size[4] + size[5], 2: size[2] - size[2] // 2}
    _assert_like_reference("job", cluster.base, after, settings, 4)


def test_a_restarted_stage_reloads_its_snapshot_and_the_survivor_rolls_back(
    cluster: runtime_cluster.RuntimeCluster, corpus: Path
) -> None:
    # Killed at step 8, not earlier: snapshots are written in the background, and on a loaded
    # machine (load 10-14) none was yet confirmed on both workers by step 4.
    settings = _settings(corpus)
    p = _plan(([(0, 3, 0), (3, 6, 1)], 4))
    cluster.start([0, 1], kills={1: runtime_cluster.Kill(step=8)})
    _start_epoch(cluster, p, settings, epoch=1, resume=0, stop=10)
    (beat,) = cluster.wait([0], _failed).values()
    assert beat.last_committed_step == 7
    resume = _complete_everywhere(beat)
    cluster.wait_dead(1)
    cluster.start([1])  # a fresh agent process: it holds nothing but its store
    _start_epoch(cluster, p, settings, epoch=2, resume=resume, stop=9)
    beats = cluster.wait([0, 1], _finished)
    assert all(b.setup is not None and b.setup.tier is Tier.LOCAL_SNAPSHOT for b in beats.values())
    _assert_like_reference("job", cluster.base, p, settings, 9)


def _flip_a_byte_of(base: Path, job: str, worker: int, step: int, name: str) -> None:
    """Damage file `name` of `worker`'s snapshot of `step` (one flipped byte mid-file)."""
    root = snapshot_store.store_root(job, worker, base)
    for slot in root.glob("slot-*"):
        if (slot / "manifest.json").exists() and snapshot_store.read_manifest(slot).step == step:
            path = slot / name
            raw = bytearray(path.read_bytes())
            raw[len(raw) // 2] ^= 0xFF
            path.write_bytes(bytes(raw))
            return
    raise AssertionError(f"worker {worker} holds no snapshot of step {step}")


@pytest.mark.parametrize(
    "damaged",
    [False, True],
    ids=[
        "a replica on a new node rebuilds every layer from its peer's shard and parity",
        "a peer's damaged shard is rejected on arrival and the checkpoint serves that layer",
    ],
)
def test_a_replacement_with_an_empty_store_rebuilds_from_peer_snapshots_over_the_network(
    cluster: runtime_cluster.RuntimeCluster, corpus: Path, tmp_path: Path, damaged: bool
) -> None:
    """DP=2, XOR: worker 1 is SIGKILLed and its store wiped (its node is gone). The epoch
    resumes at a step no live replica holds (worker 0 is past it), so worker 1's layers come
    only from worker 0's snapshot pieces, sent over the epoch's process group and rebuilt with
    the parity; never from worker 0's files directly (there is no filesystem path to them)."""
    settings = _settings(corpus, checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_interval_steps=1)
    p = _plan(([(0, 6, 0)], 2), ([(0, 6, 1)], 2))
    cluster.start([0, 1], kills={1: runtime_cluster.Kill(step=4)})
    _start_epoch(cluster, p, settings, epoch=1, resume=0, stop=6)
    (beat,) = cluster.wait([0], _failed).values()
    resume = _rolled_back(cluster.base, tmp_path / "ckpt", beat.last_committed_step)
    cluster.wait_dead(1)
    shutil.rmtree(snapshot_store.store_root("job", 1, cluster.base))
    if damaged:
        _flip_a_byte_of(cluster.base, "job", 0, resume, "layer-2.shard")
    cluster.start([1])
    _start_epoch(cluster, p, settings, epoch=2, resume=resume, stop=5)
    beats = cluster.wait([0, 1], _finished)
    setup = beats[1].setup
    assert setup is not None and setup.received_bytes > 0  # the pieces came over the network
    if damaged:  # both fall to the checkpoint for layer 2 (worker 0's own copy is damaged too)
        assert {b.setup.tier for b in beats.values() if b.setup} == {Tier.CHECKPOINT}
    else:
        assert setup.tier is Tier.PEER_SNAPSHOT
        assert beats[0].setup is not None and beats[0].setup.tier is Tier.LOCAL_SNAPSHOT
    _assert_like_reference("job", cluster.base, p, settings, 5)


@pytest.mark.parametrize(
    "damaged",
    [False, True],
    ids=[
        "every replica of a stage lost: its layers come back from the mirrors on other nodes",
        "both mirrors of a layer damaged: rejected on arrival, the checkpoint serves that layer",
    ],
)
def test_losing_every_replica_of_a_stage_rebuilds_it_from_the_mirrors_over_the_network(
    cluster: runtime_cluster.RuntimeCluster, corpus: Path, tmp_path: Path, damaged: bool
) -> None:
    """2 pipelines x 2 stages, XOR: workers 1 and 3, every replica of layers 3-5, are SIGKILLed
    and their stores wiped (their nodes are gone). The mirrors of their members sit on workers
    0 and 2 (`snapshot_placement`), which send them over the epoch's process group to the
    replacements: PEER_SNAPSHOT, equal to the reference. With both mirrored copies of layer 4
    damaged (the holders killed after a finished epoch, so that their checkpoint of the step is
    surely written), layer 4 falls to the checkpoint."""
    ckpt = tmp_path / "ckpt"
    settings = _settings(corpus, checkpoint_dir=str(ckpt), checkpoint_interval_steps=1)
    p = _plan(([(0, 3, 0), (3, 6, 1)], 2), ([(0, 3, 2), (3, 6, 3)], 2))
    if damaged:  # the snapshot and checkpoint of the stop step are complete everywhere
        cluster.start([0, 1, 2, 3])
        _start_epoch(cluster, p, settings, epoch=1, resume=0, stop=4)
        cluster.wait([0, 1, 2, 3], _finished)
        for w in (1, 3):
            os.kill(cluster._processes[w].pid, signal.SIGKILL)
    else:  # killed mid-step, before their update of step 4
        kills = {w: runtime_cluster.Kill(step=4) for w in (1, 3)}
        cluster.start([0, 1, 2, 3], kills=kills)
        _start_epoch(cluster, p, settings, epoch=1, resume=0, stop=6)
        cluster.wait([0, 2], _failed)
    for w in (1, 3):
        cluster.wait_dead(w)
        shutil.rmtree(snapshot_store.store_root("job", w, cluster.base))
    resume = 4 if damaged else _held_by_both(cluster.base, (0, 2), at_most=3)
    if damaged:
        assert (ckpt / "step-4" / "worker-1").is_dir()  # layer 4's checkpoint: the next tier
        for w in (0, 2):
            _flip_a_byte_of(cluster.base, "job", w, resume, "layer-4.shard")
    cluster.start([1, 3])
    _start_epoch(cluster, p, settings, epoch=2, resume=resume, stop=5)
    beats = cluster.wait([0, 1, 2, 3], _finished)
    for w in (1, 3):
        setup = beats[w].setup
        assert setup is not None and setup.received_bytes > 0  # over the network
        assert setup.tier is (Tier.CHECKPOINT if damaged else Tier.PEER_SNAPSHOT)
    _assert_like_reference("job", cluster.base, p, settings, 5)


def _held_by_both(base: Path, workers: tuple[int, ...], at_most: int) -> int:
    """The newest snapshot step every one of `workers` holds complete, at or before `at_most`
    (where the controller resumes: `membership.Roster.snapshot_step`). A snapshot whose mirror
    swap failed (its peer died) is not complete, so every held step has its mirrors."""
    stores = [
        snapshot_store.SnapshotStore(snapshot_store.store_root("job", w, base)) for w in workers
    ]
    held = set.intersection(*({m.step for m in s.complete_manifests()} for s in stores))
    steps = [s for s in held if 1 <= s <= at_most]
    assert steps, f"workers {workers} share no snapshot at or before {at_most}: {sorted(held)}"
    return max(steps)


def _rolled_back(base: Path, checkpoints: Path, failed_at: int) -> int:
    """A step before `failed_at` of which worker 0 holds a complete snapshot and has written
    its part of the checkpoint (in the background; with XOR it alone rebuilds every layer, so
    the checkpoint tier can serve). Worker 1's store is wiped, so worker 0's is the only one
    that counts. Which step depends on the writers' speed under load (a busy writer skips)."""
    store = snapshot_store.SnapshotStore(snapshot_store.store_root("job", 0, base))
    deadline = time.monotonic() + 60.0
    while True:
        held = [m.step for m in store.complete_manifests() if 1 <= m.step < failed_at]
        done = [s for s in held if (checkpoints / f"step-{s}" / "worker-0").is_dir()]
        if done:
            return max(done)
        assert time.monotonic() < deadline, f"no checkpointed snapshot before {failed_at}: {held}"
        time.sleep(0.05)


def _complete_everywhere(beat: messages.Heartbeat) -> int:
    """The snapshot step a survivor reports, where the controller resumes a roll-back: one
    complete on every worker of the epoch, the dead included (docs/resilience.md). Writes run
    in the background, so the killed worker may not have finished its newest one: which
    earlier step it is depends on the writers' speed, but it is before the failed step."""
    step = beat.snapshot.latest_step
    assert step is not None and 1 <= step < beat.last_committed_step
    return step


# --- in this process: one rank ------------------------------------------------------------


@pytest.fixture
def store() -> c10d.TCPStore:
    return c10d.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=10))


def _solo_config(
    store: c10d.TCPStore,
    settings: messages.TrainingSettings,
    *,
    epoch: int,
    resume: int,
    stop: int | None,
    worker: int = 0,
) -> messages.WorkerConfig:
    p = _plan(([(0, 6, 0)], 4))
    rendezvous = messages.Rendezvous(
        store_host="127.0.0.1",
        store_port=store.port,
        key_prefix=f"epoch-{epoch}",
        rank=0,
        world_size=1,
        backend=messages.Backend.GLOO,
        timeout_s=5.0,
    )
    return _config(rendezvous, p, worker, settings, epoch=epoch, resume=resume, stop=stop)


def _wait(
    agent: runtime.Runtime,
    done: Callable[[messages.Heartbeat], bool],
    timeout_s: float = 30.0,
) -> messages.Heartbeat:
    deadline = time.monotonic() + timeout_s
    while not done(beat := agent.heartbeat()):
        assert time.monotonic() < deadline, beat
        time.sleep(0.02)
    return beat


def _run_solo(
    base: Path,
    store: c10d.TCPStore,
    settings: messages.TrainingSettings,
    *,
    epoch: int,
    resume: int,
    stop: int,
) -> messages.Heartbeat:
    agent = runtime.Runtime(worker=W(0), job="solo", snapshot_base=base)
    agent.start()
    try:
        assert agent.configure(
            _solo_config(store, settings, epoch=epoch, resume=resume, stop=stop)
        ).accepted
        return _wait(agent, lambda b: b.state in (State.FINISHED, State.FAILED))
    finally:
        agent.close()


def _flip_a_byte(base: Path, step: int, name: str) -> None:
    root = snapshot_store.store_root("solo", 0, base)
    for slot in root.glob("slot-*"):
        with_manifest = (slot / "manifest.json").exists()
        if with_manifest and snapshot_store.read_manifest(slot).step == step:
            path = slot / name
            raw = bytearray(path.read_bytes())
            raw[len(raw) // 2] ^= 0xFF
            path.write_bytes(bytes(raw))
            return
    raise AssertionError(f"no snapshot of step {step}")


def test_a_corrupted_shard_falls_back_to_the_checkpoint_and_then_to_nothing(
    tmp_path: Path, store: c10d.TCPStore, corpus: Path
) -> None:
    base, ckpt = tmp_path / "shm", tmp_path / "ckpt"
    settings = _settings(corpus, checkpoint_dir=str(ckpt), checkpoint_interval_steps=2)
    beat = _run_solo(base, store, settings, epoch=1, resume=0, stop=4)
    assert beat.state is State.FINISHED and beat.checkpoint_step == 4
    assert beat.snapshot.latest_step == 4  # FINISHED: its own last snapshot, waited for
    assert beat.snapshot.achieved_interval_steps >= 1.0  # steps 1 and 4 at least (interval 1)
    _flip_a_byte(base, 4, "layer-0.shard")
    beat = _run_solo(base, store, settings, epoch=2, resume=4, stop=6)  # a fresh agent
    assert beat.state is State.FINISHED, beat.errors
    assert beat.setup is not None and beat.setup.tier is Tier.CHECKPOINT
    _assert_like_reference("solo", base, _plan(([(0, 6, 0)], 4)), settings, 6)
    _flip_a_byte(base, 6, "layer-3.shard")
    no_checkpoint = _settings(corpus)
    beat = _run_solo(base, store, no_checkpoint, epoch=3, resume=6, stop=8)
    assert beat.state is State.FAILED
    (error,) = beat.errors
    assert error.kind is messages.ErrorKind.SNAPSHOT_UNAVAILABLE
    assert "layer 3" in error.message and "step 6" in error.message


def _raise_at(step: int, error: Exception) -> executor.Hook:
    """A hook raising `error` while step `step` trains (the executor counts steps from 0)."""

    def hook(at: int, index: int, op: object) -> None:
        if at + 1 == step:
            raise error

    return hook


@pytest.mark.parametrize(
    ("changes", "hook", "kind", "said", "step"),
    [
        (
            {"data": messages.DataSettings(corpus_paths=("/planaria-missing/corpus.txt",))},
            None,
            messages.ErrorKind.INVALID_DATA,
            "corpus path '/planaria-missing/corpus.txt' does not exist; name a file or directory",
            0,
        ),
        (
            {"model": "nope"},
            None,
            messages.ErrorKind.INVALID_CONFIG,
            "PlanInputError: unknown model 'nope'; choose one of: ",
            0,
        ),
        (
            {},
            _raise_at(2, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")),
            messages.ErrorKind.OUT_OF_MEMORY,
            "OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB (at ",
            2,
        ),
        (
            {},
            _raise_at(2, ValueError("a bug")),
            messages.ErrorKind.INTERNAL,
            "ValueError: a bug (at ",
            2,
        ),
    ],
    ids=[
        "a corpus path that does not exist is invalid data, said as the data module says it",
        "a model the agent does not know is an invalid configuration",
        "memory running out in a step is out of memory",
        "a ValueError in a step is internal, not the configuration's",
    ],
)
def test_an_error_of_the_agents_own_is_latched_with_its_kind(
    tmp_path: Path,
    store: c10d.TCPStore,
    corpus: Path,
    changes: dict[str, object],
    hook: executor.Hook | None,
    kind: messages.ErrorKind,
    said: str,
    step: int,
) -> None:
    settings = dataclasses.replace(_settings(corpus), **changes)  # type: ignore[arg-type]
    agent = runtime.Runtime(worker=W(0), job="solo", snapshot_base=tmp_path, hook=hook)
    agent.start()
    try:
        assert agent.configure(_solo_config(store, settings, epoch=1, resume=0, stop=4)).accepted
        beat = _wait(agent, lambda b: b.state in (State.FINISHED, State.FAILED))
    finally:
        agent.close()
    assert beat.state is State.FAILED
    (error,) = beat.errors
    assert (error.kind, error.step) == (kind, step)
    assert error.message.startswith(said), error.message
    assert beat.last_committed_step == max(0, step - 1)


def test_configure_refusals_pause_resume_and_stop(
    tmp_path: Path, store: c10d.TCPStore, corpus: Path
) -> None:
    settings = _settings(corpus, snapshot_interval_steps=0)
    agent = runtime.Runtime(worker=W(0), job="solo", snapshot_base=tmp_path)
    agent.start()
    try:
        wrong = agent.configure(
            _solo_config(store, settings, epoch=1, resume=0, stop=None, worker=1)
        )
        assert not wrong.accepted and "not 1" in wrong.reason
        assert agent.configure(_solo_config(store, settings, epoch=1, resume=0, stop=None)).accepted
        stale = agent.configure(_solo_config(store, settings, epoch=1, resume=0, stop=None))
        assert not stale.accepted and "stale" in stale.reason
        _wait(agent, lambda b: b.state is State.RUNNING and b.last_committed_step >= 1)
        early = agent.configure(_solo_config(store, settings, epoch=2, resume=0, stop=None))
        assert not early.accepted and "running at step" in early.reason
        assert not agent.pause(2).accepted
        assert agent.pause(1).accepted
        paused = _wait(agent, lambda b: b.state is State.PAUSED)
        time.sleep(0.2)
        assert agent.heartbeat().last_committed_step == paused.last_committed_step
        assert agent.resume(1).accepted
        _wait(agent, lambda b: b.last_committed_step > paused.last_committed_step)
        with pytest.raises(ValueError, match="running"):
            agent.profile(messages.ProfileOrder(model="tiny", micro_batch_size=1, repeats=1))
        assert agent.stop(1.0).accepted
        assert agent.wait_stopped(30.0)
        assert agent.heartbeat().state is State.STOPPED
        assert not agent.configure(
            _solo_config(store, settings, epoch=3, resume=0, stop=None)
        ).accepted
    finally:
        agent.close()


def test_state_layout_is_model_state_layout() -> None:
    # the helper that sizes transfers agrees with LayerState's own count of bytes
    config = training_thread.training_config(_settings(Path("unused")), 1)
    for index in range(config.shape.num_planner_layers):
        built = model.build_layer(config.shape, config.seed, index)
        state = model.extract_layer_state(
            index, built, model.make_optimizer(built, config.optimizer)
        )
        assert (
            model.initial_state(config.shape, config.seed, index, config.optimizer).nbytes
            == state.nbytes
        )


def test_a_running_agent_switches_epochs_at_the_planned_step(
    tmp_path: Path, store: c10d.TCPStore, corpus: Path
) -> None:
    settings = _settings(corpus)
    agent = runtime.Runtime(worker=W(0), job="solo", snapshot_base=tmp_path)
    agent.start()
    try:
        assert agent.configure(_solo_config(store, settings, epoch=1, resume=0, stop=None)).accepted
        at = _wait(agent, lambda b: b.state is State.RUNNING and b.last_committed_step >= 1)
        switch = at.last_committed_step + 8  # a planned switch, as for a preemption notice
        later = _solo_config(store, settings, epoch=2, resume=switch, stop=switch + 2)
        assert agent.configure(later).accepted
        beat = _wait(agent, lambda b: b.state is State.FINISHED)
        assert beat.epoch == 2 and beat.last_committed_step == switch + 2
        assert beat.setup is not None and beat.setup.tier is Tier.KEPT
    finally:
        agent.close()
    _assert_like_reference("solo", tmp_path, _plan(([(0, 6, 0)], 4)), settings, switch + 2)


def _set_up_without_its_peer(
    agent: runtime.Runtime,
    store: c10d.TCPStore,
    settings: messages.TrainingSettings,
    *,
    timeout_s: float,
) -> None:
    """Configure `agent` as worker 0 of epoch 1, a pair whose worker 1 never comes, and wait
    until it sets the epoch up (waiting at the rendezvous, at most `timeout_s`)."""
    pair = _plan(([(0, 6, 0)], 2), ([(0, 6, 1)], 2))
    absent = messages.Rendezvous(
        store_host="127.0.0.1",
        store_port=store.port,
        key_prefix=rendezvous.key_prefix(1),
        rank=0,
        world_size=2,  # worker 1 never comes
        backend=messages.Backend.GLOO,
        timeout_s=timeout_s,
    )
    assert agent.configure(_config(absent, pair, 0, settings, epoch=1, resume=0, stop=None))
    _wait(agent, lambda b: b.epoch == 1 and b.state is State.CONFIGURING)


def test_a_configure_that_came_during_a_failed_set_up_is_taken_up_after_it(
    tmp_path: Path, store: c10d.TCPStore, corpus: Path
) -> None:
    # Chaos pipeline seed 33 (docs/chaos.md): a spare worker set up a scale-up its peers had
    # refused, waiting for them at the rendezvous, when the controller's next scale-up reached
    # it. Its set-up failed (TIMEOUT), and the agent dropped the second Configure as a planned
    # switch at a step it would never reach, though it was not running: its new peers waited
    # for it in vain. A Configure accepted while not running is due at once, failure or not.
    settings = _settings(corpus, snapshot_interval_steps=0)
    agent = runtime.Runtime(worker=W(0), job="solo", snapshot_base=tmp_path)
    agent.start()
    try:
        _set_up_without_its_peer(agent, store, settings, timeout_s=2.0)
        later = _solo_config(store, settings, epoch=2, resume=3, stop=None)  # a future step
        assert agent.configure(later).accepted
        beat = _wait(agent, lambda b: b.epoch == 2 and b.state is State.FAILED)
    finally:
        agent.close()
    # It took the Configure up: with no store, snapshot or checkpoint of step 3 (the peers'
    # copies of a real scale-up are not there), its set-up says so.
    assert [e.kind for e in beat.errors] == [messages.ErrorKind.SNAPSHOT_UNAVAILABLE]


def test_a_set_up_released_by_its_given_up_epoch_latches_a_lost_peer(
    tmp_path: Path, store: c10d.TCPStore, corpus: Path
) -> None:
    # The controller gave the epoch up (a planned switch that came too late, a member lost)
    # while this worker waited at its rendezvous for a peer that will never come: the failure
    # keys release it at once (its 60 s timeout never runs out), and it says so as a lost
    # peer, as a step released by the same keys does; before, it latched TIMEOUT.
    settings = _settings(corpus, snapshot_interval_steps=0)
    agent = runtime.Runtime(worker=W(0), job="solo", snapshot_base=tmp_path)
    agent.start()
    try:
        _set_up_without_its_peer(agent, store, settings, timeout_s=60.0)
        rendezvous.flag_failed(c10d.PrefixStore(rendezvous.key_prefix(1), store), 2, "controller")
        beat = _wait(agent, lambda b: b.state is State.FAILED)
    finally:
        agent.close()
    (error,) = beat.errors
    assert (error.kind, error.step) == (messages.ErrorKind.PEER_LOST, 0)
    assert "epoch 1 was given up before every rank came" in error.message, error.message


def test_load_snapshot_rolls_the_layers_back_to_a_snapshot(
    tmp_path: Path, store: c10d.TCPStore, corpus: Path
) -> None:
    settings = _settings(corpus)
    agent = runtime.Runtime(worker=W(0), job="solo", snapshot_base=tmp_path)
    agent.start()
    try:
        idle = agent.profile(messages.ProfileOrder(model="tiny", micro_batch_size=1, repeats=1))
        assert len(idle.layers) == 6
        assert agent.configure(_solo_config(store, settings, epoch=1, resume=0, stop=4)).accepted
        _wait(agent, lambda b: b.state is State.FINISHED)
        # The store's older snapshot: 3 unless the writer fell behind and steps were skipped.
        held = snapshot_store.SnapshotStore(snapshot_store.store_root("solo", 0, tmp_path))
        older = min(m.step for m in held.complete_manifests())
        assert 1 <= older < 4
        assert not agent.load_snapshot(messages.SnapshotLoad(epoch=2, step=older)).accepted
        assert agent.load_snapshot(messages.SnapshotLoad(epoch=1, step=older)).accepted
        _wait(agent, lambda b: b.last_committed_step == older)
        config = _solo_config(store, settings, epoch=2, resume=older, stop=5)
        assert agent.configure(config).accepted
        beat = _wait(agent, lambda b: b.state is State.FINISHED and b.epoch == 2)
        assert beat.setup is not None and beat.setup.tier is Tier.KEPT
    finally:
        agent.close()
    _assert_like_reference("solo", tmp_path, _plan(([(0, 6, 0)], 4)), settings, 5)


def test_a_restarted_replica_rebuilds_from_its_shard_and_its_recomputed_copy(
    cluster: runtime_cluster.RuntimeCluster, corpus: Path, tmp_path: Path
) -> None:
    # RECOMPUTE (REFT AOR): each member keeps its peer's shard with optimizer moments replayed
    # from the gradients on the host, so a restarted member's own store holds the whole layer.
    # A checkpoint due at step 2 makes every worker wait for snapshot 2 (it is never skipped),
    # so a snapshot is complete everywhere before the kill at step 4 however slow the writers
    # are; without it, on a loaded machine every barrier could find a writer busy (all skipped
    # but the first, none confirmed) and the survivor report none (seen twice under load).
    settings = _settings(
        corpus,
        redundancy=messages.RedundancyMode.RECOMPUTE,
        checkpoint_dir=str(tmp_path / "ckpt"),
        checkpoint_interval_steps=2,
    )
    p = _plan(([(0, 6, 0)], 2), ([(0, 6, 1)], 2))
    cluster.start([0, 1], kills={1: runtime_cluster.Kill(step=4)})
    _start_epoch(cluster, p, settings, epoch=1, resume=0, stop=6)
    (beat,) = cluster.wait([0], _failed).values()
    assert beat.last_committed_step == 3
    resume = _complete_everywhere(beat)
    cluster.wait_dead(1)
    cluster.start([1])
    _start_epoch(cluster, p, settings, epoch=2, resume=resume, stop=5)
    beats = cluster.wait([0, 1], _finished)
    tiers = {w: b.setup.tier for w, b in beats.items() if b.setup is not None}
    assert tiers == {0: Tier.LOCAL_SNAPSHOT, 1: Tier.LOCAL_SNAPSHOT}  # 0 rolls back too
    _assert_like_reference("job", cluster.base, p, settings, 5)


def test_a_stop_past_its_grace_releases_a_step_blocked_on_a_hung_peer(
    cluster: runtime_cluster.RuntimeCluster, corpus: Path
) -> None:
    """Worker 0's step waits point to point on worker 1, which hangs (SIGSTOP). A Stop whose
    grace ran out (close: grace 0) releases the epoch's transport (`Training.abandon`), so the
    step ends as abandoned at once instead of by the epoch's timeout (the error text tells
    which: gloo's timeout says "Timed out waiting")."""
    settings = _settings(corpus)
    p = _plan(([(0, 3, 0), (3, 6, 1)], 4))
    cluster.start([0, 1])
    _start_epoch(cluster, p, settings, epoch=1, resume=0, stop=10_000)
    cluster.wait([0, 1], lambda beat: beat.last_committed_step >= 2)
    hung = cluster._processes[1]
    os.kill(hung.pid, signal.SIGSTOP)
    try:
        beat = cluster.ask(0, "stop")  # Runtime.close
    finally:
        os.kill(hung.pid, signal.SIGKILL)
        cluster.wait_dead(1)
    assert beat.state is State.STOPPED
    # Worker 0 is usually blocked on worker 1 by then: its step fails as abandoned. When the
    # Stop lands first at a step boundary, it stops with no error. Never by the timeout.
    texts = [e.message for e in beat.errors]
    assert all("this wait was abandoned" in t for t in texts), texts
    assert not any("Timed out" in t for t in texts), texts


def test_a_failed_training_thread_stops_the_runtime_as_crashed_and_a_stop_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stopped = runtime.Runtime(worker=W(0), job="solo", snapshot_base=tmp_path)
    stopped.start()
    assert stopped.stop(0.0).accepted
    assert stopped.wait_stopped(PATIENCE_S) and not stopped.crashed

    def bug(self: runtime.Runtime) -> None:
        raise RuntimeError("a bug in the training thread")

    monkeypatch.setattr(runtime.Runtime, "_next", bug)
    failed = runtime.Runtime(worker=W(0), job="solo", snapshot_base=tmp_path)
    failed.start()
    assert failed.wait_stopped(PATIENCE_S) and failed.crashed
    assert failed.heartbeat().state is State.STOPPED
