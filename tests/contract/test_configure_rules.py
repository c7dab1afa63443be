"""The Configure rules (planaria.contract.configure_rules), as properties.

Covers: `judge` refuses for exactly the first broken rule in the documented order (an oracle
that lists every broken rule independently), accepts with an empty reason otherwise, AT_STEP
exactly for a running agent; an accepted Configure sent again is refused as stale; `due` holds
a planned switch until its step and takes anything else up at once; `ranks` is a bijection of
any distinct worker ids onto 0..n-1 in id order and refuses repeated ids; the epoch key prefix
(`planaria.contract.rendezvous.key_prefix`) gives distinct epochs disjoint key spaces. Across
the planes, over drawn plans: the controller's Configures (`epochs.configs`) carry exactly these
ranks, world size and prefix, and the agent's `groups.worker_ranks` of the compiled schedule
agrees with them (for the plans it runs: one worker per stage); the agent and the fake read a
Configure into the rules alike.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planaria.agent.execution import groups
from planaria.agent.runtime import acceptance
from planaria.contract import configure_rules, plan, rendezvous, schedule
from planaria.control import epochs, ports
from planaria.control import settings as job_settings
from planaria.wire import messages
from tests import strategies
from tests.control import fakes, scenarios

Refusal = configure_rules.Refusal
DEVICES = ("cpu", "cuda")
worker_ids = st.integers(min_value=0, max_value=3).map(plan.WorkerId)
epoch_numbers = st.integers(min_value=1, max_value=6)
steps = st.integers(min_value=0, max_value=6)


@st.composite
def offers(draw: st.DrawFn) -> configure_rules.Offer:
    return configure_rules.Offer(
        epoch=draw(epoch_numbers),
        worker=draw(worker_ids),
        resume_step=draw(steps),
        device=draw(st.sampled_from(DEVICES)),
    )


@st.composite
def receivers(draw: st.DrawFn) -> configure_rules.Receiver:
    return configure_rules.Receiver(
        worker=draw(worker_ids),
        device=draw(st.sampled_from(DEVICES)),
        newest_epoch=draw(st.integers(min_value=0, max_value=6)),
        running_step=draw(st.none() | steps),
        stopping=draw(st.booleans()),
        profiling=draw(st.booleans()),
    )


def _broken(offer: configure_rules.Offer, agent: configure_rules.Receiver) -> set[Refusal]:
    """Every rule `offer` breaks at `agent`, each stated on its own."""
    running = agent.running_step
    broken = {
        Refusal.WRONG_WORKER: offer.worker != agent.worker,
        Refusal.STALE_EPOCH: offer.epoch <= agent.newest_epoch,
        Refusal.STOPPING: agent.stopping,
        Refusal.PROFILING: agent.profiling,
        Refusal.WRONG_DEVICE: offer.device != agent.device,
        Refusal.SWITCH_NOT_AHEAD: running is not None and offer.resume_step <= running,
    }
    return {refusal for refusal, hit in broken.items() if hit}


@given(offers(), receivers())
def test_a_configure_is_refused_for_the_first_rule_it_breaks_and_accepted_otherwise(
    offer: configure_rules.Offer, agent: configure_rules.Receiver
) -> None:
    verdict = configure_rules.judge(offer, agent)
    broken = _broken(offer, agent)
    first = next((r for r in Refusal if r in broken), None)  # declaration order is the order
    assert verdict.refusal is first
    assert verdict.accepted is (first is None)
    assert (verdict.reason == "") is verdict.accepted
    if verdict.accepted:
        running = agent.running_step is not None
        timing = configure_rules.Timing.AT_STEP if running else configure_rules.Timing.AT_ONCE
        assert verdict.timing is timing
    else:
        assert verdict.timing is None


@given(offers(), receivers())
def test_an_accepted_configure_sent_again_is_refused_as_stale(
    offer: configure_rules.Offer, agent: configure_rules.Receiver
) -> None:
    if configure_rules.judge(offer, agent).accepted:
        holding = dataclasses.replace(agent, newest_epoch=offer.epoch)
        assert configure_rules.judge(offer, holding).refusal is Refusal.STALE_EPOCH


@given(offers(), receivers())
def test_a_planned_switch_is_due_at_its_step_and_anything_else_at_once(
    offer: configure_rules.Offer, agent: configure_rules.Receiver
) -> None:
    verdict = configure_rules.judge(offer, agent)
    if verdict.timing is configure_rules.Timing.AT_STEP:
        assert agent.running_step is not None
        assert not configure_rules.due(offer.resume_step, agent.running_step)
        assert not configure_rules.due(offer.resume_step, offer.resume_step - 1)
        assert configure_rules.due(offer.resume_step, offer.resume_step)
    elif verdict.timing is configure_rules.Timing.AT_ONCE:
        assert configure_rules.due(offer.resume_step, None)


@given(st.sets(st.integers(min_value=0, max_value=10_000)).map(list), st.randoms())
def test_ranks_number_distinct_workers_0_to_n_in_id_order(
    ids: list[int], shuffle: random.Random
) -> None:
    shuffle.shuffle(ids)
    ranked = configure_rules.ranks(plan.WorkerId(w) for w in ids)
    assert sorted(ranked.values()) == list(range(len(ids)))
    assert sorted(ranked, key=ranked.__getitem__) == sorted(ids)


@given(st.lists(st.integers(min_value=0, max_value=5), min_size=1), st.data())
def test_ranks_refuse_a_repeated_worker(ids: list[int], data: st.DataObject) -> None:
    ids.append(data.draw(st.sampled_from(ids)))
    with pytest.raises(ValueError, match="repeat an id"):
        configure_rules.ranks(plan.WorkerId(w) for w in ids)


@given(epoch_numbers, epoch_numbers)
def test_distinct_epochs_have_disjoint_key_spaces(a: int, b: int) -> None:
    # torch's PrefixStore puts "/" between a prefix and a key
    first, second = rendezvous.key_prefix(a) + "/", rendezvous.key_prefix(b) + "/"
    assert (first == second) is (a == b)
    assert (first.startswith(second) or second.startswith(first)) is (a == b)


def _job(p: plan.Plan) -> job_settings.JobSettings:
    training = scenarios.training(global_batch_size=p.global_batch_size)
    return job_settings.JobSettings(
        name="rules",
        workers=1,
        steps=10,
        micro_batch_size=p.micro_batch_size,
        training=training,
    )


# One GPU per node: one worker per stage, the plans the agent runs (a tensor-parallel stage's
# stream stands for all its workers, and the agent refuses it: `require_one_worker_per_stage`).
@given(
    strategies.plans(max_gpus_per_node=1),
    st.integers(min_value=1, max_value=50),
    st.integers(min_value=0, max_value=20),
)
def test_the_controllers_configures_and_the_agents_schedule_rank_workers_by_the_rules(
    p: plan.Plan, epoch: int, resume: int
) -> None:
    ranked = configure_rules.ranks(p.workers)
    store = ports.StoreAddress(host="127.0.0.1", port=29500)
    sent = epochs.configs(
        epoch=epoch, plan=p, transfers=(), resume_step=resume, job=_job(p), store=store
    )
    assert set(sent) == set(p.workers)
    for worker, config in sent.items():
        sent_rank = (config.rendezvous.rank, config.rendezvous.world_size)
        assert sent_rank == (ranked[worker], len(ranked))
        assert config.rendezvous.key_prefix == rendezvous.key_prefix(epoch)
    assert groups.worker_ranks(schedule.compile_schedule(p)) == ranked


def test_the_agent_and_the_fake_read_a_configure_alike_for_the_rules() -> None:
    """Both map a wire message to the rules' `Offer` the same way, field by field."""
    p = strategies.grid_plan(1, (), 2, 4)
    config = epochs.configs(
        epoch=4,
        plan=p,
        transfers=(),
        resume_step=2,
        job=_job(p),
        store=ports.StoreAddress(host="h", port=1),
    )[plan.WorkerId(0)]
    config = dataclasses.replace(
        config, settings=dataclasses.replace(config.settings, device=messages.Device.CUDA)
    )
    want = configure_rules.Offer(epoch=4, worker=plan.WorkerId(0), resume_step=2, device="cuda")
    assert acceptance.offer(config) == want
    assert fakes.offer(config) == want
