"""Process groups per epoch (planaria.agent.execution.groups), in this process and on pure data.

Covers: ranks follow worker ids; the subgroups of a schedule are its distinct all-reduce groups
as sorted rank tuples (symmetric, heterogeneous and rerouted plans), and exactly the groups its
streams use; a one-rank epoch forms, refuses a second epoch until left, and forms the next
epoch after leaving; unknown subgroups are an error; arguments out of range name the argument;
a rendezvous a member never joins fails within its timeout with EpochFormationError, and the
next epoch then meets a peer process that never failed (torch's group counter, part of every
rendezvous key, is not left advanced by the failure); a rendezvous whose epoch is flagged failed
while a member is missing ends at once, saying it was given up (EpochGivenUpError, which a
wait that ran out is not).
Multi-process epochs (subgroups on every rank, a second epoch with fewer ranks, regrouping after
a failure) are exercised through the harness in test_executor.py and test_harness.py.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._C import _distributed_c10d as c10d

from planaria.agent.execution import groups
from planaria.contract import instructions, plan, rendezvous, schedule
from planaria.wire import messages
from tests import plans, strategies

GLOO = messages.Backend.GLOO


def _plan(*pipelines: tuple[plans.Stages, int]) -> plan.Plan:
    return plans.staged(*pipelines, micro=1)


@pytest.fixture
def store() -> Iterator[c10d.Store]:
    server = c10d.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=5), False)
    yield server


def test_ranks_follow_worker_ids() -> None:
    sched = schedule.compile_schedule(_plan(([(0, 2, (7,)), (2, 4, (3,))], 2)))
    assert groups.worker_ranks(sched) == {3: 0, 7: 1}


def test_a_symmetric_plan_reduces_each_stage_over_its_replicas() -> None:
    p = _plan(([(0, 2, (0,)), (2, 4, (1,))], 2), ([(0, 2, (2,)), (2, 4, (3,))], 2))
    assert groups.subgroup_ranks(schedule.compile_schedule(p)) == ((0, 2), (1, 3))


def test_a_heterogeneous_plan_has_layer_granular_groups() -> None:
    p = _plan(([(0, 1, (0,)), (1, 2, (1,)), (2, 4, (2,))], 2), ([(0, 2, (3,)), (2, 4, (4,))], 2))
    # layer 0: {0, 3}, layer 1: {1, 3}, layers 2-3: {2, 4} (Oobleck §6.1)
    assert groups.subgroup_ranks(schedule.compile_schedule(p)) == ((0, 3), (1, 3), (2, 4))


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from([(2, 2), (3, 2), (2, 2, 1), (1, 1, 1)]).flatmap(
        lambda counts: strategies.shaped_plans(counts, max_holes=1)
    )
)
def test_subgroups_are_exactly_the_groups_the_streams_use(p: plan.Plan) -> None:
    sched = schedule.compile_schedule(p)
    ranks = groups.worker_ranks(sched)
    used = {
        groups.ranks_of(op.group, ranks)
        for stream in sched.streams
        for op in stream.instructions
        if isinstance(op, instructions.AllReduce)
    }
    found = groups.subgroup_ranks(sched)
    assert list(found) == sorted(used)
    assert all(len(g) >= 2 and list(g) == sorted(set(g)) for g in found)


def test_one_process_forms_leaves_and_forms_the_next_epoch(store: c10d.Store) -> None:
    first = groups.form_epoch(store, 1, 0, 1, GLOO, 5.0)
    try:
        assert (first.number, first.rank, first.world_size) == (1, 0, 1)
        assert first.group((0,)) is first.world
        assert first.timeout == datetime.timedelta(seconds=5)
        with pytest.raises(groups.GroupsError, match=r"no subgroup of ranks \[0, 1\]"):
            first.group((0, 1))
        with pytest.raises(groups.EpochInputError, match="still in an epoch; leave it first"):
            groups.form_epoch(store, 2, 0, 1, GLOO, 5.0)
    finally:
        groups.leave_epoch(first)
    second = groups.form_epoch(store, 2, 0, 1, GLOO, 5.0)
    groups.leave_epoch(second)
    groups.leave_epoch(second)  # leaving twice is harmless


@pytest.mark.parametrize(
    ("epoch", "rank", "world_size", "timeout_s", "subgroups", "message"),
    [
        (0, 0, 1, 1.0, (), "epoch numbers start at 1"),
        (1, 2, 2, 1.0, (), "rank 2 of world size 2"),
        (1, 0, 0, 1.0, (), "need world size >= 1"),
        (1, 0, 1, 0.0, (), "timeout_s must be > 0"),
        (1, 0, 2, 1.0, ((1, 0),), r"subgroup \[1, 0\] must list two or more distinct ranks"),
        (1, 0, 2, 1.0, ((0,),), r"subgroup \[0\] must list two or more"),
        (1, 0, 2, 1.0, ((0, 2),), r"subgroup \[0, 2\] names ranks outside 0..1"),
    ],
    ids=[
        "epoch zero",
        "a rank beyond the world",
        "an empty world",
        "no timeout",
        "an unsorted subgroup",
        "a one-rank subgroup",
        "a subgroup beyond the world",
    ],
)
def test_arguments_out_of_range_are_named(
    store: c10d.Store,
    epoch: int,
    rank: int,
    world_size: int,
    timeout_s: float,
    subgroups: tuple[tuple[int, ...], ...],
    message: str,
) -> None:
    with pytest.raises(groups.EpochInputError, match=message):
        groups.form_epoch(store, epoch, rank, world_size, GLOO, timeout_s, subgroups=subgroups)


def test_a_member_that_never_comes_fails_the_rendezvous_in_time(store: c10d.Store) -> None:
    started = time.monotonic()
    with pytest.raises(groups.EpochFormationError, match="rank 0 could not form epoch 1") as e:
        groups.form_epoch(store, 1, 0, 2, GLOO, 1.0)
    assert not isinstance(e.value, groups.EpochGivenUpError)  # its wait ran out
    assert time.monotonic() - started < 10
    groups.leave_epoch(groups.form_epoch(store, 2, 0, 1, GLOO, 1.0))  # the process recovered


def test_a_rendezvous_flagged_failed_while_a_member_is_missing_ends_at_once(
    store: c10d.TCPStore,
) -> None:
    # The controller gave the epoch up (a planned switch that came too late, a lost member)
    # while this rank waited for a peer that will never come: it leaves now, not after its
    # 60 s timeout, and says why (chaos seed 10, docs/chaos.md).
    def flag() -> None:
        client = c10d.TCPStore("127.0.0.1", store.port, None, False, datetime.timedelta(seconds=60))
        epoch_store = c10d.PrefixStore(rendezvous.key_prefix(3), client)
        epoch_store.wait([rendezvous.ARRIVED_KEY])  # rank 0 waits for rank 1 now
        rendezvous.flag_failed(epoch_store, 2, "controller")

    flagger = threading.Thread(target=flag)
    flagger.start()
    try:
        with pytest.raises(groups.EpochGivenUpError, match="epoch 3 was given up"):
            groups.form_epoch(store, 3, 0, 2, GLOO, 60.0)
    finally:
        flagger.join()
    groups.leave_epoch(groups.form_epoch(store, 4, 0, 1, GLOO, 1.0))  # the process recovered


# The peer leaves with os._exit: what is tested is that it met the epoch (its exit status says
# so), not the interpreter's teardown, which once aborted it in CI after it had met the epoch
# and left ("terminate called without an active exception": a C++ thread of torch's still
# joinable when static destructors ran).
_FRESH_PEER = """
import datetime, os, sys
from torch._C import _distributed_c10d as c10d
from planaria.agent.execution import groups
from planaria.wire import messages
import torch
import torch.distributed as dist
store = c10d.TCPStore("127.0.0.1", int(sys.argv[1]), None, False, datetime.timedelta(seconds=30))
epoch = groups.form_epoch(store, 2, 1, 2, messages.Backend.GLOO, 30.0)
met = torch.tensor([2.0])
dist.all_reduce(met, group=epoch.world)
groups.leave_epoch(epoch)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0 if met.item() == 3.0 else 1)
"""


def test_after_a_failed_rendezvous_the_next_epoch_meets_a_peer_that_never_failed(
    store: c10d.TCPStore,
) -> None:
    with pytest.raises(groups.EpochFormationError, match="could not form epoch 1"):
        groups.form_epoch(store, 1, 0, 2, GLOO, 1.0)
    peer = subprocess.Popen([sys.executable, "-c", _FRESH_PEER, str(store.port)])
    try:
        # Both sides all-reduce before leaving: that is the meeting, and a rank leaving the
        # moment its own init returns can close gloo's connection while the peer is still in
        # its half of the handshake (CI saw that peer fail with "connection closed by peer").
        epoch = groups.form_epoch(store, 2, 0, 2, GLOO, 30.0)
        met = torch.tensor([1.0])
        dist.all_reduce(met, group=epoch.world)
        groups.leave_epoch(epoch)
        assert met.item() == 3.0
    finally:
        assert peer.wait(60) == 0
