"""Tied input/output embeddings trained tied (planaria.agent.training.tying, planaria.agent.
execution.tied_embeddings).

Covers: the exchange's routes, for any plan (Hypothesis): a holder of one copy receives the use
it lacks from a holder of that use, whose sends name it, a holder of both receives nothing, a
worker holding neither copy has no part, and no source serves more than its share. In one
process: the reference's tied gradient is the embedding use's total plus the head use's (both
nonzero, so dropping either would show), in exact and fast mode, and an untied model is left
alone. Across real processes (gloo, exact mode), a tiny 2-block GPT-2 (tied, as GPT-2 is)
trains bit for bit like the tied single-process reference (per-step losses, parameters and
AdamW moments) over a 2-stage pipeline, data parallelism over two 1-stage workers, a
heterogeneous plan (2-, 1- and 2-stage pipelines: holders of one copy and of both) and a
rerouted plan (a failed last stage and a failed first stage, their micro-batches on peers);
every holder's two copies stay bit-identical with identical AdamW state; the same run
differs from a reference that drops the tie (each copy trained on its own use alone); a GPT-2
config that says `tie_word_embeddings: false` trains untied, exactly; and in fast mode every
copy on every worker stays bit-identical.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings

from planaria.agent.execution import tied_embeddings
from planaria.agent.harness import local_cluster, run_results
from planaria.agent.training import comparison, data, model, reduction, reference, semantics, tying
from planaria.agent.training import hf_models as hf_layers
from planaria.contract import plan, schedule, shapes
from planaria.wire import messages
from tests import hf_models, plans, strategies

pytest.importorskip("transformers")

STEPS = 3
EXACT, FAST = messages.Reduction.EXACT, messages.Reduction.FAST
Use = tied_embeddings.Use
Stages = list[tuple[int, int, tuple[int, ...]]]


_plan = plans.staged


PLANS = {
    "a 2-stage pipeline": _plan(([(0, 2, (0,)), (2, 4, (1,))], 3)),
    "data parallel over two 1-stage workers": _plan(([(0, 4, (0,))], 2), ([(0, 4, (1,))], 1)),
    "heterogeneous pipelines of 2, 1 and 2 stages": _plan(
        ([(0, 2, (0,)), (2, 4, (1,))], 2),
        ([(0, 4, (2,))], 1),
        ([(0, 1, (3,)), (1, 4, (4,))], 2),
    ),
    # Pipeline 1 lost its last stage, pipeline 2 its first: their micro-batches run on
    # pipeline 0's workers 1 and 0 (ReCycle).
    "a failed last and a failed first stage rerouted": _plan(
        ([(0, 2, (0,)), (2, 4, (1,))], 2),
        ([(0, 2, (2,)), (2, 4, ())], 2),
        ([(0, 2, ()), (2, 4, (3,))], 1),
        reroutes=(
            plan.Reroute(pipeline=1, stage=1, peer_pipeline=0, micro_batches=(0, 1)),
            plan.Reroute(pipeline=2, stage=0, peer_pipeline=0, micro_batches=(0,)),
        ),
    ),
}


# --- the routes, for any plan -------------------------------------------------------------


def _holders(sched: schedule.Schedule) -> dict[Use, set[plan.WorkerId]]:
    head = sched.num_layers - 1
    return {
        Use.EMBEDDING: {s.worker for s in sched.streams if 0 in s.layers},
        Use.HEAD: {s.worker for s in sched.streams if head in s.layers},
    }


@settings(max_examples=200, deadline=None)
@given(strategies.plans())
def test_every_holder_of_one_copy_gets_the_use_it_lacks_from_a_holder_of_it(p: plan.Plan) -> None:
    sched = schedule.compile_schedule(p)
    holders = _holders(sched)
    routes = {s.worker: tied_embeddings.route(sched, s.worker) for s in sched.streams}
    served: dict[tuple[plan.WorkerId, Use], int] = {}
    for worker, mine in routes.items():
        holds = {use for use, workers in holders.items() if worker in workers}
        if mine is None:
            assert not holds
            continue
        assert mine.holds == holds
        lacked = set(Use) - holds
        if not lacked:
            assert mine.source is None
        else:
            (use,) = lacked
            assert mine.source in holders[use]
            source = routes[mine.source]
            assert source is not None and (worker, use) in source.sends
        for receiver, use in mine.sends:
            assert use in holds and routes[receiver] is not None
            assert routes[receiver].source == worker  # type: ignore[union-attr]
            served[(worker, use)] = served.get((worker, use), 0) + 1
    for (_, use), count in served.items():  # round robin over the holders of the use
        receivers = len(holders[Use.HEAD if use is Use.EMBEDDING else Use.EMBEDDING])
        assert count <= -(-receivers // len(holders[use]))


# --- the reference, in one process --------------------------------------------------------


@pytest.fixture(scope="module")
def tokens() -> data.Tokens:
    return data.load_default_corpus(max_bytes=50_000)


def _config(
    p: plan.Plan, family: str = "gpt2", reduction_: messages.Reduction = EXACT
) -> semantics.TrainingConfig:
    return semantics.TrainingConfig(
        shape=hf_models.shape(family),
        seed=hf_models.SEED,
        global_batch_size=p.global_batch_size,
        micro_batch_size=p.micro_batch_size,
        optimizer=model.OptimizerConfig(lr=3e-3, eps=1e-6),
        reduction=reduction_,
    )


@pytest.mark.parametrize("mode", [EXACT, FAST], ids=["exact", "fast"])
def test_the_tied_gradient_is_the_sum_of_both_uses(tokens: data.Tokens, mode: object) -> None:
    assert isinstance(mode, messages.Reduction)
    config = _config(PLANS["a 2-stage pipeline"], reduction_=mode)
    job = semantics.Job.from_tokens(config, tokens)
    layers = model.build_layers(config.shape, config.seed)
    copies = [hf_layers.tied_matrix(layers[0]), hf_layers.tied_matrix(layers[-1])]
    sums = reduction.GradientSums(mode)
    for g in range(2):  # two micro-batches, summed as the reference does
        inputs, targets = job.dataset.batch(job.sampler.global_batch(0)[2 * g : 2 * g + 2])
        logits = model.run_layers(layers, inputs)
        torch.autograd.backward(model.micro_batch_loss(logits, targets, 4))
        sums.absorb(copies)
    embedding_use, head_use = (sums.total(p).clone() for p in copies)
    assert embedding_use.count_nonzero() > 0 and head_use.count_nonzero() > 0
    tying.tie_gradients(config.shape, layers, sums)
    sums.settle(copies)
    want = (embedding_use + head_use).to(torch.float32)
    assert all(torch.equal(p.grad, want) for p in copies)  # type: ignore[arg-type]
    assert not torch.equal(want, embedding_use.to(torch.float32))


def test_an_untied_model_is_left_alone() -> None:
    shape = hf_models.shape("llama")
    assert not tying.ties(shape) and tying.ties(hf_models.shape("gpt2"))
    layers = model.build_layers(shape, hf_models.SEED)
    sums = reduction.GradientSums(EXACT)
    head = hf_layers.tied_matrix(layers[-1])
    sums.replace(head, torch.ones_like(head, dtype=torch.float64))
    tying.tie_gradients(shape, layers, sums)
    assert torch.equal(sums.total(head), torch.ones_like(head, dtype=torch.float64))
    assert sums.total(hf_layers.tied_matrix(layers[0])).count_nonzero() == 0


# --- across processes ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tokens: data.Tokens) -> Iterator[local_cluster.LocalCluster]:
    with local_cluster.LocalCluster(workers=range(5), tokens=tokens, timeout_s=60.0) as pool:
        yield pool


def _reference(config: semantics.TrainingConfig, tokens: data.Tokens) -> reference.ReferenceTrainer:
    trainer = reference.ReferenceTrainer(config, tokens)
    trainer.losses = [trainer.step(step) for step in range(STEPS)]  # type: ignore[attr-defined]
    return trainer


def _copies_equal(state: model.LayerState, head: model.LayerState) -> bool:
    """Whether layer 0's `state` and the head's hold the tied matrix with the same AdamW
    state, bit for bit."""

    def of(s: model.LayerState, name: str) -> tuple[torch.Tensor, ...]:
        i = s.names.index(name)
        return s.parameters[i], s.exp_avg[i], s.exp_avg_sq[i]

    pairs = zip(of(state, "wte.weight"), of(head, "lm_head.weight"), strict=True)
    return all(torch.equal(a, b) for a, b in pairs)


def _run_states(run: run_results.RunResult) -> dict[int, model.LayerState]:
    return {index: run.layer_state(index) for index in range(4)}


@pytest.mark.parametrize("name", list(PLANS))
def test_tied_training_equals_the_tied_reference(
    cluster: local_cluster.LocalCluster, tokens: data.Tokens, name: str
) -> None:
    p = PLANS[name]
    config = _config(p)
    run = cluster.run(config, p, range(STEPS))
    assert run.ok, (run.errors, run.lost)
    trainer = _reference(config, tokens)
    assert list(run.losses) == trainer.losses  # type: ignore[attr-defined]
    want = {index: trainer.layer_state(index) for index in range(4)}
    assert _copies_equal(want[0], want[3])
    for worker, states in run.states.items():
        for index, state in states.items():
            found = comparison.compare({index: state}, {index: want[index]})
            assert found.equal, f"worker {worker}, layer {index}: {found.describe()}"


def test_a_run_differs_from_a_reference_that_drops_the_tie(
    cluster: local_cluster.LocalCluster,
    tokens: data.Tokens,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = PLANS["heterogeneous pipelines of 2, 1 and 2 stages"]
    config = _config(p)
    run = cluster.run(config, p, range(STEPS))
    assert run.ok, (run.errors, run.lost)
    got = _run_states(run)
    assert _copies_equal(got[0], got[3])
    monkeypatch.setattr(tying, "tie_gradients", lambda *_: None)  # each copy its own use
    untied = _reference(config, tokens)
    want = {index: untied.layer_state(index) for index in range(4)}
    assert not _copies_equal(want[0], want[3])
    assert comparison.compare(got, want).num_differing > 0


def test_an_untied_config_of_the_same_model_trains_untied_exactly(
    cluster: local_cluster.LocalCluster, tokens: data.Tokens
) -> None:
    p = PLANS["a 2-stage pipeline"]
    untied = shapes.hf_reference("gpt2", {**hf_models.GPT2, "tie_word_embeddings": False})
    config = dataclasses.replace(_config(p), shape=shapes.resolve(untied))
    run = cluster.run(config, p, range(STEPS))
    assert run.ok, (run.errors, run.lost)
    trainer = _reference(config, tokens)
    want = {index: trainer.layer_state(index) for index in range(4)}
    assert comparison.compare(_run_states(run), want).equal
    assert not _copies_equal(want[0], want[3])


def test_in_fast_mode_every_copy_of_the_tied_matrix_stays_the_same(
    cluster: local_cluster.LocalCluster,
) -> None:
    """(Fast mode sums in the plan's order, so it is compared with itself, not the reference.)"""
    p = PLANS["heterogeneous pipelines of 2, 1 and 2 stages"]
    run = cluster.run(_config(p, reduction_=FAST), p, range(STEPS))
    assert run.ok, (run.errors, run.lost)
    first = _run_states(run)
    assert _copies_equal(first[0], first[3])
    for worker, states in run.states.items():
        for index, state in states.items():
            found = comparison.compare({index: state}, {index: first[index]})
            assert found.equal, f"worker {worker}, layer {index}: {found.describe()}"
