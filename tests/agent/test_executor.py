"""The schedule executor (planaria.agent.execution.executor) against the reference trainer, its
oracle.

Covers, in this process (a one-rank epoch): a one-worker plan reproduces the reference bit for
bit; a communication failure aborts the step with a latched PeerLostError naming the step, the
instruction and the peer, later steps re-raise it and the layers keep their committed state;
inputs that do not fit (model, batch, worker, layers, rank, backend, a tensor-parallel stage)
are refused with a message that says what to change.

Across real processes (gloo on loopback, planaria.agent.harness.local_cluster), lossless training in
exact mode (`messages.Reduction.EXACT`), compared bit for bit (`comparison.compare`, no tolerance):
symmetric (2x2), heterogeneous ([3,2], [2,2,1]), rerouted (a failed stage's micro-batches run on
peers), a 3-stage pipeline, data parallel over 3 workers and 50 hypothesis-drawn plans of 2-8
workers equal the reference's per-step losses, parameters and AdamW moments, with a reference
trained at 2 torch threads (the workers run 1) and, for the named plans, one that sums its
micro-batches in reverse order; fast mode (float32 sums in the plan's order) does differ from the
reference on those plans, within the bound derived from the reference's own sensitivity to summation
order (`comparison.SensitivityBounds`); two epochs in the same processes, the second with fewer
ranks (a worker leaves, its micro-batches rerouted), continue the run bit for bit; a worker asked to
keep layers it does not hold reports an invalid configuration; a worker killed mid-step makes every
survivor report a latched PeerLostError (not a timeout), and the survivors then regroup with fewer
ranks and continue bit for bit; a worker killed right before its optimizer step (before the commit
barrier) leaves every survivor at the same committed step."""

from __future__ import annotations

import dataclasses
import datetime
import signal
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._C import _distributed_c10d as c10d

from planaria.agent.execution import executor, failures, groups, held_layers
from planaria.agent.harness import local_cluster, run_results
from planaria.agent.training import comparison, data, model, reference, semantics
from planaria.contract import errors, instructions, plan, schedule, shapes
from planaria.wire import messages
from tests import plans, strategies

SEED = 11
CORPUS_BYTES = 200_000
EXACT, FAST = messages.Reduction.EXACT, messages.Reduction.FAST
STEPS = 5
Stages = list[tuple[int, int, tuple[int, ...]]]


def _shape(num_planner_layers: int) -> shapes.ModelShape:
    """A micro GPT with this many planner layers (embedding + blocks + head)."""
    return shapes.ModelShape(
        name="micro",
        num_layers=num_planner_layers - 2,
        d_model=32,
        num_heads=4,
        seq_len=16,
        vocab_size=256,
    )


def _config(p: plan.Plan, reduction: messages.Reduction = EXACT) -> semantics.TrainingConfig:
    return semantics.TrainingConfig(
        shape=_shape(p.num_layers),
        seed=SEED,
        global_batch_size=p.global_batch_size,
        micro_batch_size=p.micro_batch_size,
        # eps 1e-6, not 1e-8: the attention key bias has a zero gradient in exact arithmetic,
        # so its computed gradient is rounding noise (~1e-10) whose value depends on the order
        # of summation; AdamW divides by sqrt(v) + eps, and a tiny eps would turn that noise
        # into steps of about lr that differ between any two summation orders, the reference's
        # own micro-batch splits included. With 1e-6 the noise stays noise.
        optimizer=model.OptimizerConfig(lr=3e-3, eps=1e-6),
        reduction=reduction,
    )


_plan = plans.staged


SYMMETRIC = _plan(([(0, 2, (0,)), (2, 5, (1,))], 3), ([(0, 2, (2,)), (2, 5, (3,))], 2))
# Worker 3 (pipeline 1, stage 1) is gone: its micro-batches run on worker 1 (ReCycle).
REROUTED = _plan(
    ([(0, 2, (0,)), (2, 5, (1,))], 3),
    ([(0, 2, (2,)), (2, 5, ())], 2),
    reroutes=(plan.Reroute(pipeline=1, stage=1, peer_pipeline=0, micro_batches=(0, 1)),),
)
NAMED_PLANS = {
    "a symmetric 2x2 plan": SYMMETRIC,
    "heterogeneous pipelines of 3 and 2 stages": _plan(
        ([(0, 1, (0,)), (1, 3, (1,)), (3, 5, (2,))], 2), ([(0, 2, (3,)), (2, 5, (4,))], 3)
    ),
    "heterogeneous pipelines of 2, 2 and 1 stages": _plan(
        ([(0, 2, (0,)), (2, 4, (1,))], 2),
        ([(0, 3, (2,)), (3, 4, (3,))], 1),
        ([(0, 4, (4,))], 2),
    ),
    "a failed stage rerouted to its peer": REROUTED,
    "one pipeline of three stages": _plan(([(0, 1, (0,)), (1, 4, (1,)), (4, 6, (2,))], 4)),
    "data parallel over three workers": _plan(
        ([(0, 4, (0,))], 1), ([(0, 4, (1,))], 2), ([(0, 4, (2,))], 1), micro=1
    ),
}


@pytest.fixture(scope="module")
def tokens() -> data.Tokens:
    return data.load_default_corpus(max_bytes=CORPUS_BYTES)


@pytest.fixture(scope="module")
def cluster(tokens: data.Tokens) -> Iterator[local_cluster.LocalCluster]:
    with local_cluster.LocalCluster(workers=range(8), tokens=tokens, timeout_s=20.0) as pool:
        yield pool


def _reference(
    config: semantics.TrainingConfig,
    tokens: data.Tokens,
    steps: int,
    *,
    threads: int = 1,
    reverse: bool = False,
) -> tuple[dict[int, model.LayerState], list[float]]:
    """The reference's layer states after `steps` and its losses, trained with `threads` torch
    threads (exact mode computes with one whatever the process has: `reduction`)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        trainer = reference.ReferenceTrainer(config, tokens, reverse_micro_batches=reverse)
        losses = [trainer.step(step) for step in range(steps)]
    finally:
        torch.set_num_threads(before)
    layers = range(config.shape.num_planner_layers)
    return {i: trainer.layer_state(i) for i in layers}, losses


def _final_states(run: run_results.RunResult, num_layers: int) -> dict[int, model.LayerState]:
    """Every layer's state in `run` (its first holder's), with every replica checked equal to
    it bit for bit (the all-reduce leaves them identical)."""
    states = {}
    for index in range(num_layers):
        replicas = {w: s[index] for w, s in run.states.items() if index in s}
        first = run.layer_state(index)
        for worker, replica in replicas.items():
            same = comparison.compare({index: replica}, {index: first})
            assert same.equal, f"worker {worker}'s replica of layer {index}: {same.describe()}"
        states[index] = first
    return states


def _assert_lossless(
    run: run_results.RunResult,
    config: semantics.TrainingConfig,
    want: tuple[dict[int, model.LayerState], list[float]],
) -> None:
    """Bit for bit: the run's states and losses equal the reference's (exact mode)."""
    assert run.ok, (run.errors, run.lost)
    states, losses = want
    assert list(run.losses) == losses[-len(run.losses) :]
    got = _final_states(run, config.shape.num_planner_layers)
    result = comparison.compare(got, states)
    assert result.equal, result.describe()


def _check_lossless(
    cluster: local_cluster.LocalCluster, tokens: data.Tokens, p: plan.Plan, *, threads: int = 1
) -> None:
    config = _config(p)
    run = cluster.run(config, p, range(STEPS))
    _assert_lossless(run, config, _reference(config, tokens, STEPS, threads=threads))


# --- in this process: one rank -------------------------------------------------------------


@pytest.fixture
def solo(tokens: data.Tokens) -> Iterator[tuple[semantics.Job, groups.Epoch]]:
    """A one-rank epoch in this process and the job of a one-worker, one-stage plan."""
    store = c10d.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=5), False)
    epoch = groups.form_epoch(store, 1, 0, 1, messages.Backend.GLOO, 2.0)
    config = _config(_plan(([(0, 5, (0,))], 3)))
    yield semantics.Job.from_tokens(config, tokens), epoch
    groups.leave_epoch(epoch)


def _solo_executor(
    job: semantics.Job, epoch: groups.Epoch, sched: schedule.Schedule
) -> executor.Executor:
    layers = held_layers.HeldLayers.build(job.config, range(job.config.shape.num_planner_layers))
    return executor.Executor(
        job=job, sched=sched, worker=plan.WorkerId(0), epoch=epoch, layers=layers
    )


def test_one_worker_reproduces_the_reference_bit_for_bit(
    solo: tuple[semantics.Job, groups.Epoch], tokens: data.Tokens
) -> None:
    job, epoch = solo
    runner = _solo_executor(job, epoch, schedule.compile_schedule(_plan(([(0, 5, (0,))], 3))))
    trainer = reference.ReferenceTrainer(job.config, tokens)
    for step in range(3):
        result = runner.run_step(step)
        assert result.loss == trainer.step(step)
        assert (result.num_losses, result.snapshot_layers) == (3, (0, 1, 2, 3, 4))
    for index, state in runner.layers.states().items():
        want = trainer.layer_state(index)
        assert all(map(torch.equal, state.tensors(), want.tensors()))


def test_a_communication_failure_aborts_the_step_and_is_latched(
    solo: tuple[semantics.Job, groups.Epoch],
) -> None:
    job, epoch = solo
    whole = {"layer_start": 0, "layer_stop": 5}
    # A receive from itself: gloo has no connection to the rank itself, so the wait fails.
    stream = (
        instructions.Forward(micro_batch=0, **whole),
        instructions.Backward(micro_batch=0, **whole),
        instructions.RecvGrad(source=plan.WorkerId(0), micro_batch=0, tag=0),
        instructions.OptimizerStep(layers=(0, 1, 2, 3, 4)),
    )
    sched = schedule.Schedule(
        num_layers=5,
        num_micro_batches=3,
        gpus_per_node=1,
        num_rounds=0,
        streams=(
            schedule.WorkerStream(
                worker=plan.WorkerId(0),
                pipeline=0,
                stage=0,
                layer_start=0,
                layer_stop=5,
                stage_workers=(plan.WorkerId(0),),
                instructions=stream,
            ),
        ),
    )
    runner = _solo_executor(job, epoch, sched)
    before = runner.layers.states()
    with pytest.raises(failures.PeerLostError, match=r"step 4 aborted at instruction #2 RecvGrad"):
        runner.run_step(4)
    latched = runner.latched
    assert latched is not None and (latched.step, latched.index, latched.peer) == (4, 2, 0)
    assert latched.latched().kind is messages.ErrorKind.PEER_LOST
    with pytest.raises(failures.PeerLostError) as again:
        runner.run_step(5)
    assert again.value is latched
    for index, state in runner.layers.states().items():  # no optimizer step happened
        assert all(map(torch.equal, state.tensors(), before[index].tensors()))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("model", "the schedule has 5 layers but model 'micro' has 6 planner layers"),
        ("batch", "runs 3 micro-batches of 2 = 6 samples but the global batch is 8"),
        ("worker", r"worker 9 has no stream in this schedule \(its workers are \[0\]\)"),
        ("layers", r"computes layers \[0, 1, 2, 3, 4\] but holds \[0, 1\]; transfer or build"),
        ("rank", "is rank 0 of 2 in this schedule but joined epoch 1 as rank 0 of 1"),
        ("backend", "layers on cpu need the gloo backend but the epoch uses nccl"),
    ],
    ids=[
        "a plan for another model",
        "a plan for another batch",
        "a worker outside the plan",
        "missing layers",
        "the wrong epoch size",
        "the wrong backend",
    ],
)
def test_inputs_that_do_not_fit_are_refused(
    solo: tuple[semantics.Job, groups.Epoch], change: str, message: str
) -> None:
    job, epoch = solo
    sched = schedule.compile_schedule(_plan(([(0, 5, (0,))], 3)))
    config, worker = job.config, plan.WorkerId(0)
    layers = held_layers.HeldLayers.build(config, range(5))
    if change == "model":
        job = semantics.Job(
            config=_config(_plan(([(0, 6, (0,))], 3))), dataset=job.dataset, sampler=job.sampler
        )
    elif change == "batch":
        job = dataclasses.replace(job, config=dataclasses.replace(config, global_batch_size=8))
    elif change == "worker":
        worker = plan.WorkerId(9)
    elif change == "layers":
        layers = held_layers.HeldLayers.build(config, range(2))
    elif change == "rank":
        sched = schedule.compile_schedule(_plan(([(0, 5, (0,))], 2), ([(0, 5, (1,))], 1)))
    else:
        epoch = dataclasses.replace(epoch, backend=messages.Backend.NCCL)
    with pytest.raises(failures.ExecutorInputError, match=message):
        executor.Executor(job=job, sched=sched, worker=worker, epoch=epoch, layers=layers)


def test_a_stage_of_several_workers_is_refused(solo: tuple[semantics.Job, groups.Epoch]) -> None:
    job, epoch = solo
    tensor_parallel = plan.Plan(
        pipelines=(
            plan.Pipeline(
                stages=(
                    plan.Stage(
                        layer_start=0, layer_stop=5, workers=(plan.WorkerId(0), plan.WorkerId(1))
                    ),
                ),
                num_micro_batches=3,
            ),
        ),
        micro_batch_size=2,
        gpus_per_node=2,
    )
    sched = schedule.compile_schedule(tensor_parallel)
    layers = held_layers.HeldLayers.build(job.config, range(5))
    with pytest.raises(errors.PlanInputError, match="runs on 2 workers"):
        executor.Executor(job=job, sched=sched, worker=plan.WorkerId(0), epoch=epoch, layers=layers)


# --- across processes -------------------------------------------------------------------------


@pytest.mark.parametrize("p", list(NAMED_PLANS.values()), ids=list(NAMED_PLANS))
def test_named_plans_train_exactly_like_the_reference(
    cluster: local_cluster.LocalCluster, tokens: data.Tokens, p: plan.Plan
) -> None:
    config = _config(p)
    run = cluster.run(config, p, range(STEPS))
    want = _reference(config, tokens, STEPS)
    _assert_lossless(run, config, want)
    # The same reference with 2 torch threads, and with its micro-batches summed last to
    # first: other kernels' blocking and another summation order change nothing.
    for other in (
        _reference(config, tokens, STEPS, threads=2),
        _reference(config, tokens, STEPS, reverse=True),
    ):
        result = comparison.compare(other[0], want[0])
        assert result.equal and other[1] == want[1], result.describe()


@pytest.mark.parametrize(
    "p",
    [p for name, p in NAMED_PLANS.items() if name != "one pipeline of three stages"],
    ids=[name for name in NAMED_PLANS if name != "one pipeline of three stages"],
)
def test_fast_mode_differs_from_the_reference_within_its_summation_sensitivity(
    cluster: local_cluster.LocalCluster, tokens: data.Tokens, p: plan.Plan
) -> None:
    # Float32 sums in the plan's order: not bitwise equal (so exact mode is not vacuous), but
    # every element within the bound the reference's own reordering gives.
    config = _config(p, FAST)
    run = cluster.run(config, p, range(STEPS))
    want, _ = _reference(config, tokens, STEPS)
    reordered, _ = _reference(config, tokens, STEPS, reverse=True)
    got = _final_states(run, config.shape.num_planner_layers)
    assert comparison.compare(got, want).num_differing > 0
    bounds = comparison.SensitivityBounds.measure(want, reordered)
    result = comparison.compare(got, want, bounds)
    assert result.equal, result.describe()


@settings(max_examples=50, deadline=None)
@given(
    st.sampled_from([(2, 2), (3, 2), (2, 2, 1), (1, 1), (3, 3), (2, 2, 2, 2), (4, 3, 1)])
    .flatmap(
        lambda counts: strategies.shaped_plans(
            counts, aligned=len(set(counts)) == 1, max_holes=1, max_micro_batches=3
        )
    )
    .filter(lambda p: p.num_layers >= 3)
)
def test_drawn_plans_train_exactly_like_the_reference(
    cluster: local_cluster.LocalCluster, tokens: data.Tokens, p: plan.Plan
) -> None:
    _check_lossless(cluster, tokens, p, threads=2)


def test_a_second_epoch_with_fewer_ranks_continues_losslessly(
    cluster: local_cluster.LocalCluster, tokens: data.Tokens
) -> None:
    config = _config(SYMMETRIC)
    first = cluster.run(config, SYMMETRIC, range(3))
    second = cluster.run(config, REROUTED, range(3, 6), fresh=False)
    assert (first.ok, second.ok, second.epoch) == (True, True, first.epoch + 1)
    assert sorted(second.committed) == [0, 1, 2]
    want = _reference(config, tokens, 6)
    assert list(first.losses) == want[1][:3]
    _assert_lossless(second, config, want)


def test_keeping_layers_a_worker_does_not_hold_is_an_invalid_configuration(
    cluster: local_cluster.LocalCluster,
) -> None:
    config = _config(SYMMETRIC)
    cluster.run(config, SYMMETRIC, range(1))
    swapped = _plan(([(0, 2, (1,)), (2, 5, (0,))], 3), ([(0, 2, (2,)), (2, 5, (3,))], 2))
    run = cluster.run(config, swapped, range(1, 2), fresh=False)
    assert run.errors[plan.WorkerId(0)].kind is messages.ErrorKind.INVALID_CONFIG
    assert "transfer or build layers [2, 3, 4] first" in run.errors[plan.WorkerId(0)].message
    assert run.steps == ()


def test_a_killed_worker_is_reported_by_every_survivor_who_then_regroup(
    tokens: data.Tokens,
) -> None:
    config = _config(SYMMETRIC)
    with local_cluster.LocalCluster(workers=range(4), tokens=tokens, timeout_s=30.0) as four:
        crash = local_cluster.Fault(step=2, index=1, signal=signal.SIGKILL)
        failed = four.run(config, SYMMETRIC, range(100), faults={3: crash})
        assert failed.lost == (3,)
        assert sorted(failed.errors) == [0, 1, 2]
        # PEER_LOST, not TIMEOUT: every survivor learnt of the death from the closed
        # connection, not by waiting out the 30 s timeout (no wall-clock bound needed)
        assert all(e.kind is messages.ErrorKind.PEER_LOST for e in failed.errors.values())
        assert all(e.step == 2 for e in failed.errors.values())
        assert failed.steps == (0, 1) and set(failed.committed.values()) == {2}
        recovered = four.run(config, REROUTED, range(2, 5), fresh=False)
    _assert_lossless(recovered, config, _reference(config, tokens, 5))


def test_a_death_before_the_commit_barrier_leaves_every_survivor_at_the_same_step(
    tokens: data.Tokens,
) -> None:
    # One pipeline of three stages: the first stages finish their work of a step long before
    # the last one's optimizer step. Without the commit barrier they would commit step 2 while
    # the last stage dies right before its update; with it, nobody commits step 2.
    p = NAMED_PLANS["one pipeline of three stages"]
    stream = schedule.compile_schedule(p).stream(plan.WorkerId(2))
    update = next(
        i for i, op in enumerate(stream.instructions) if isinstance(op, instructions.OptimizerStep)
    )
    crash = local_cluster.Fault(step=2, index=update, signal=signal.SIGKILL)
    with local_cluster.LocalCluster(workers=range(3), tokens=tokens, timeout_s=30.0) as three:
        failed = three.run(_config(p), p, range(5), faults={2: crash})
    assert failed.lost == (2,)
    assert sorted(failed.errors) == [0, 1]
    assert all(e.step == 2 for e in failed.errors.values())
    assert set(failed.committed.values()) == {2}  # steps 0 and 1, on both survivors
