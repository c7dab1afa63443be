"""The data plane on a CUDA GPU (issue #16): these run only where torch sees a GPU (never in CI;
`bench/gpu.py`'s machine runs them, one GPU, so every NCCL epoch here has one rank).

Covers: a one-rank NCCL epoch all-reduces on the GPU, is released by aborting its communicators
(`Epoch.release`, what a survivor does when a peer dies) and left, and a new epoch forms in the
same process afterwards and all-reduces again (what every recovery needs); the CUDA copier's
staging copy is ordered after the compute stream's work before the launch and before the
compute stream's work after `release`, without the host waiting: a copy launched behind a slow
kernel still reads the updated tensor, and an in-place update enqueued right after `release`
never reaches the staged bytes; a bf16 job trained by the executor in an NCCL epoch with the
snapshot writer's contract (begin after the commit, release before the next optimizer step)
leaves in the store float32 master state equal to the live GPU tensors bit for bit.
"""

from __future__ import annotations

import datetime
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from planaria.agent.execution import executor as executors
from planaria.agent.execution import groups, held_layers
from planaria.agent.runtime import epoch_writers
from planaria.agent.state import snapshot_store, snapshot_writer, snapshots, staging
from planaria.agent.training import data, model, semantics
from planaria.contract import instructions, plan, schedule
from planaria.wire import messages
from tests.agent import test_executor as lossless
from tests.agent import test_precision as precise

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

NCCL = messages.Backend.NCCL
FORM_S = 60.0
ONE_WORKER = precise.ONE_WORKER
WORKER = plan.WorkerId(0)
STEPS = 3


def _store() -> c10d.TCPStore:
    return c10d.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=FORM_S), False)


@pytest.fixture
def epoch() -> Iterator[groups.Epoch]:
    formed = groups.form_epoch(_store(), 1, 0, 1, NCCL, FORM_S)
    yield formed
    groups.leave_epoch(formed)


def _all_reduced(value: float) -> float:
    tensor = torch.full((4,), value, device="cuda")
    dist.all_reduce(tensor)
    return float(tensor.sum().item())


def test_an_nccl_epoch_is_released_by_abort_and_another_forms_after_it() -> None:
    store = _store()
    first = groups.form_epoch(store, 1, 0, 1, NCCL, FORM_S)
    assert _all_reduced(2.0) == 8.0
    first.release()  # what a survivor does when the controller flags the epoch failed
    groups.leave_epoch(first)
    assert not dist.is_initialized()
    second = groups.form_epoch(store, 2, 0, 1, NCCL, FORM_S)
    try:
        assert _all_reduced(3.0) == 12.0
    finally:
        groups.leave_epoch(second)


def test_the_cuda_copy_is_ordered_by_events_not_by_the_host() -> None:
    device = torch.device("cuda")
    live = torch.zeros(1 << 22, device=device)  # 16 MiB of float32
    stage = staging.Staging(staging.copier_for(device))
    moments = (torch.zeros_like(live),), (torch.zeros_like(live),)
    state = model.LayerState(
        index=0,
        names=("w",),
        parameters=(live,),
        exp_avg=moments[0],
        exp_avg_sq=moments[1],
        steps=(torch.tensor(1.0),),
    )
    prepared = stage.prepare(state, [range(0, live.nbytes)])
    big = torch.randn(4096, 4096, device=device)
    for _ in range(20):  # a slow kernel queue ahead of the update the copy must see
        big = big @ big / 4096
    live.add_(1)  # enqueued on the compute stream, not yet run
    ticket = stage.copier.launch([prepared.copy])
    ticket.release()  # the compute stream waits for the copy: the host does not
    live.add_(1)  # after release: must not reach the staged bytes
    ticket.complete()
    staged = torch.frombuffer(bytearray(prepared.staged.copy(0, live.nbytes)), dtype=torch.float32)
    assert torch.equal(staged, torch.ones_like(staged))
    assert torch.equal(live.cpu(), torch.full_like(staged, 2.0))


def test_a_bf16_job_on_the_gpu_snapshots_its_fp32_master_state_bit_for_bit(
    epoch: groups.Epoch,
) -> None:
    config = precise._config(ONE_WORKER, messages.Precision.BF16)  # exact mode
    tokens = data.load_default_corpus(max_bytes=lossless.CORPUS_BYTES)
    layers = held_layers.HeldLayers.build(config, range(config.shape.num_planner_layers), "cuda")
    runner = executors.Executor(
        job=semantics.Job.from_tokens(config, tokens),
        sched=schedule.compile_schedule(ONE_WORKER),
        worker=WORKER,
        epoch=epoch,
        layers=layers,
    )
    with tempfile.TemporaryDirectory() as base:
        store = snapshot_store.SnapshotStore(snapshot_store.store_root("cuda", 0, Path(base)))
        writer = snapshot_writer.SnapshotWriter(
            store,
            snapshot_writer.WriterConfig(
                job="cuda", worker=WORKER, redundancy=messages.RedundancyMode.NONE
            ),
            staging.copier_for(torch.device("cuda")),
        )
        try:

            def before(step: int, index: int, op: instructions.Instruction) -> None:
                if isinstance(op, instructions.OptimizerStep):  # the writer's contract
                    writer.release()

            for step in range(STEPS):
                runner.run_step(step, before)
                writer.wait()  # the previous snapshot, before the next begins
                groups_of = {i: (WORKER,) for i in layers.indices}
                states = epoch_writers.live_states(layers)
                writer.begin(step=step + 1, epoch=1, states=states, groups=groups_of)
            manifest = writer.wait()
        finally:
            writer.close()
        assert manifest is not None and manifest.step == STEPS
        for index in layers.indices:
            saved = snapshots.load_layer([store], STEPS, index)
            live = epoch_writers.live_states(layers)[layers.indices.index(index)]
            assert {t.dtype for t in saved.tensors()} == {torch.float32}
            pairs = zip(saved.tensors(), live.tensors(), strict=True)
            assert all(torch.equal(s, t.cpu()) for s, t in pairs)
