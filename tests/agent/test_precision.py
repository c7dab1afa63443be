"""Mixed precision in the data plane (planaria.agent.training.precision) on the CPU.

Covers: under bf16 the executor really runs its forward under bfloat16 autocast (every Linear's
output inside the forward is bfloat16) while parameters, gradients and AdamW's moments stay
float32, the hidden states between layers stay float32, and it reproduces the bf16 reference
trainer bit for bit; bf16 changes the numbers (not a no-op) and tf32 on the CPU is fp32 bit for
bit; the fp32 master state is what a layer's state (the snapshot and checkpoint payload) carries,
and a snapshot's tensor layout and bytes carry it bit for bit. Across real processes (gloo on
loopback), a bf16 job in exact mode is lossless: a named plan, and a worker killed mid-step whose
survivors regroup with its micro-batches rerouted, equal the fault-free bf16 reference bit for bit
(parameters, AdamW moments, losses). bf16 on cuda without a GPU is refused in one line; the refusal
on a GPU without bfloat16 is tested where a GPU exists (never here).
"""

from __future__ import annotations

import datetime
import signal
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn
from torch._C import _distributed_c10d as c10d

from planaria.agent.execution import executor as executors
from planaria.agent.execution import groups, held_layers
from planaria.agent.harness import local_cluster
from planaria.agent.state import manifests, parity, snapshots
from planaria.agent.training import data, model, precision, reference, semantics
from planaria.contract import instructions, plan, schedule
from planaria.wire import messages
from tests.agent import test_executor as lossless

BF16, FP32, TF32 = messages.Precision.BF16, messages.Precision.FP32, messages.Precision.TF32
ONE_WORKER = lossless._plan(([(0, 5, (0,))], 3))
STEPS = 3


def _config(p: plan.Plan, prec: messages.Precision) -> semantics.TrainingConfig:
    config = lossless._config(p)  # exact mode, the lossless tests' model and optimizer
    return semantics.TrainingConfig(
        shape=config.shape,
        seed=config.seed,
        global_batch_size=config.global_batch_size,
        micro_batch_size=config.micro_batch_size,
        optimizer=config.optimizer,
        reduction=config.reduction,
        precision=prec,
    )


@pytest.fixture(scope="module")
def tokens() -> data.Tokens:
    return data.load_default_corpus(max_bytes=lossless.CORPUS_BYTES)


@pytest.fixture
def epoch() -> Iterator[groups.Epoch]:
    store = c10d.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=5), False)
    formed = groups.form_epoch(store, 1, 0, 1, messages.Backend.GLOO, 2.0)
    yield formed
    groups.leave_epoch(formed)


def _executor(
    config: semantics.TrainingConfig, tokens: data.Tokens, epoch: groups.Epoch
) -> executors.Executor:
    job = semantics.Job.from_tokens(config, tokens)
    layers = held_layers.HeldLayers.build(config, range(config.shape.num_planner_layers))
    return executors.Executor(
        job=job,
        sched=schedule.compile_schedule(ONE_WORKER),
        worker=plan.WorkerId(0),
        epoch=epoch,
        layers=layers,
    )


def _dtypes_seen(runner: executors.Executor) -> dict[str, set[torch.dtype]]:
    """Hooks on every layer and Linear of `runner` recording output dtypes by kind."""
    seen: dict[str, set[torch.dtype]] = {"linear": set(), "layer": set(), "parameter": set()}

    def record(kind: str) -> Callable[[nn.Module, object, torch.Tensor], None]:
        def hook(module: nn.Module, _: object, output: torch.Tensor) -> None:
            seen[kind].add(output.dtype)
            seen["parameter"].update(p.dtype for p in module.parameters())

        return hook

    for index in runner.layers.indices:
        layer = runner.layers.modules[index]
        if not isinstance(layer, model.Head):  # the head's output is logits, not hidden states
            layer.register_forward_hook(record("layer"))
        for module in layer.modules():
            if isinstance(module, nn.Linear):
                module.register_forward_hook(record("linear"))
    return seen


def _master_dtypes(runner: executors.Executor) -> set[torch.dtype]:
    """Dtypes of every parameter, gradient-free state tensor and AdamW moment it holds."""
    states = runner.layers.states().values()
    return {t.dtype for state in states for t in state.tensors()}


def test_bf16_autocasts_the_forward_and_keeps_fp32_master_state(
    tokens: data.Tokens, epoch: groups.Epoch
) -> None:
    runner = _executor(_config(ONE_WORKER, BF16), tokens, epoch)
    seen = _dtypes_seen(runner)
    trainer = reference.ReferenceTrainer(_config(ONE_WORKER, BF16), tokens)
    grads: set[torch.dtype] = set()

    def at_optimizer_step(step: int, index: int, op: instructions.Instruction) -> None:
        if isinstance(op, instructions.OptimizerStep):  # the gradients AdamW steps with
            params = runner.layers.parameters(op.layers)
            grads.update(p.grad.dtype for p in params if p.grad is not None)

    for step in range(STEPS):
        assert runner.run_step(step, at_optimizer_step).loss == trainer.step(step)
    assert grads == {torch.float32}
    assert seen == {
        "linear": {torch.bfloat16},  # autocast is active inside the forward
        "layer": {torch.float32},  # the residual stream: what stages send each other
        "parameter": {torch.float32},
    }
    assert _master_dtypes(runner) == {torch.float32}
    for index, state in runner.layers.states().items():
        want = trainer.layer_state(index)
        assert all(map(torch.equal, state.tensors(), want.tensors()))


def test_fp32_does_not_autocast_and_bf16_changes_the_numbers(
    tokens: data.Tokens, epoch: groups.Epoch
) -> None:
    runner = _executor(_config(ONE_WORKER, FP32), tokens, epoch)
    seen = _dtypes_seen(runner)
    fp32 = [runner.run_step(step).loss for step in range(STEPS)]
    assert seen["linear"] == {torch.float32}
    bf16 = reference.ReferenceTrainer(_config(ONE_WORKER, BF16), tokens)
    assert [bf16.step(step) for step in range(STEPS)] != fp32


def test_tf32_on_the_cpu_trains_exactly_as_fp32(tokens: data.Tokens) -> None:
    trainers = [reference.ReferenceTrainer(_config(ONE_WORKER, p), tokens) for p in (FP32, TF32)]
    losses = [[t.step(step) for step in range(STEPS)] for t in trainers]
    assert losses[0] == losses[1]
    for index in range(trainers[0].config.shape.num_planner_layers):
        pair = [t.layer_state(index).tensors() for t in trainers]
        assert all(map(torch.equal, *pair))


def test_the_forward_context_autocasts_only_in_bf16() -> None:
    a, b = torch.ones(4, 4), torch.ones(4, 4)
    for prec, want in ((FP32, torch.float32), (TF32, torch.float32), (BF16, torch.bfloat16)):
        with precision.forward(prec, torch.device("cpu")):
            assert (a @ b).dtype == want
    assert (a @ b).dtype == torch.float32  # nothing leaks out of the context


def test_every_cpu_can_run_bf16() -> None:
    for prec in messages.Precision:
        precision.check_supported(prec, torch.device("cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_bf16_on_cuda_without_a_gpu_is_refused_in_one_line() -> None:
    with pytest.raises(precision.PrecisionError) as refused:
        precision.check_supported(BF16, torch.device("cuda"))
    message = str(refused.value)
    assert message.startswith("precision: bf16 on cuda needs a CUDA GPU") and "\n" not in message


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_is_refused_on_a_gpu_without_bfloat16() -> None:
    device = torch.device("cuda")
    if torch.cuda.is_bf16_supported(including_emulation=False):
        precision.check_supported(BF16, device)
    else:
        with pytest.raises(precision.PrecisionError, match="^precision: bf16 needs a GPU"):
            precision.check_supported(BF16, device)


# --- across processes: lossless in bf16 --------------------------------------------------------


def test_a_bf16_plan_trains_exactly_like_the_bf16_reference(tokens: data.Tokens) -> None:
    config = _config(lossless.SYMMETRIC, BF16)
    with local_cluster.LocalCluster(workers=range(4), tokens=tokens, timeout_s=30.0) as four:
        run = four.run(config, lossless.SYMMETRIC, range(lossless.STEPS))
    lossless._assert_lossless(run, config, lossless._reference(config, tokens, lossless.STEPS))


def test_a_bf16_job_recovers_from_a_killed_worker_bit_for_bit(tokens: data.Tokens) -> None:
    config = _config(lossless.SYMMETRIC, BF16)
    with local_cluster.LocalCluster(workers=range(4), tokens=tokens, timeout_s=30.0) as four:
        crash = local_cluster.Fault(step=2, index=1, signal=signal.SIGKILL)
        failed = four.run(config, lossless.SYMMETRIC, range(100), faults={3: crash})
        assert failed.lost == (3,) and failed.steps == (0, 1)
        recovered = four.run(config, lossless.REROUTED, range(2, 5), fresh=False)
    want = lossless._reference(config, tokens, 5)
    lossless._assert_lossless(recovered, config, want)
    states = lossless._final_states(recovered, config.shape.num_planner_layers)
    assert {t.dtype for state in states.values() for t in state.tensors()} == {torch.float32}


def test_a_bf16_snapshot_carries_the_fp32_master_state_bit_for_bit(tokens: data.Tokens) -> None:
    trainer = reference.ReferenceTrainer(_config(ONE_WORKER, BF16), tokens)
    for step in range(STEPS):
        trainer.step(step)
    for index in range(trainer.config.shape.num_planner_layers):
        state = trainer.layer_state(index)
        layout = snapshots.tensor_layout(state)
        assert {t.dtype for t in layout} == {"float32"}
        entry = manifests.LayerEntry(
            layer=index,
            names=state.names,
            group=(0,),
            member=0,
            total_bytes=sum(t.nbytes for t in layout),
            tensors=layout,
            files=(),
            tolerated_losses=0,
        )
        restored = snapshots.unflatten(entry, _whole(snapshots.flat_bytes(state)))
        assert all(map(torch.equal, restored.tensors(), state.tensors()))


def _whole(flat: parity.FlatBytes) -> parity.Bytes:
    return flat.copy(0, flat.nbytes)
