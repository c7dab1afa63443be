"""One contract suite for the agent's side of Configure, run against both implementations: the
real agent runtime and the controller tests' fake agent (tests/contract/subjects.py). A fake
that drifted from the real agent would make the controller's tests pass against an agent that
does not exist; here every case must pass on both.

Covers, with Configures built by the controller (`epochs.configs`: ranks and key prefix from
`planaria.contract.configure_rules`): an idle agent accepts a first epoch and runs in it; a
Configure for another worker, for another device, or of an epoch not newer than the agent's is
refused with the reason the rules give, and changes nothing (the same epoch sent again, an
older one, a held planned switch's epoch sent again); a running agent refuses to switch at or
before its committed step, accepts a planned switch at a later step and takes it up exactly
there; a stopped agent refuses. Reasons are checked as literal text (the rules' own,
`planaria.contract.configure_rules`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from planaria.agent.training import data
from planaria.wire import messages
from tests.contract import subjects

State = messages.AgentState
Beat = messages.Heartbeat


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_bytes(data.load_default_corpus(max_bytes=100_000).tobytes())
    return path


@pytest.fixture(
    params=[subjects.RealAgent, subjects.FakeAgent],
    ids=["the real agent runtime", "the controller tests' fake agent"],
)
def agent(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[subjects.Subject]:
    make: Callable[[Path], subjects.Subject] = request.param
    subject = make(tmp_path / "shm")
    yield subject
    subject.close()


def _running_in(epoch: int, *, after: int = 0) -> Callable[[Beat], bool]:
    def done(beat: Beat) -> bool:
        assert beat.state is not State.FAILED, beat.errors
        running = beat.epoch == epoch and beat.state is State.RUNNING
        return running and beat.last_committed_step > after

    return done


def _refused(ack: messages.Acknowledgement, reason: str) -> None:
    assert not ack.accepted and ack.reason == reason, ack


def test_an_idle_agent_accepts_a_first_epoch_built_by_the_controller_and_runs_in_it(
    agent: subjects.Subject, corpus: Path
) -> None:
    config = subjects.config_for(agent, corpus, epoch=1, resume=0)
    rendezvous = config.rendezvous
    assert (rendezvous.key_prefix, rendezvous.rank, rendezvous.world_size) == ("epoch-1", 0, 1)
    assert agent.beat().epoch == 0
    assert agent.configure(config).accepted
    beat = agent.wait(_running_in(1))
    assert beat.setup is not None and beat.setup.epoch == 1
    assert beat.setup.tier is messages.RecoveryTier.INITIAL


def test_a_configure_for_another_worker_is_refused_and_changes_nothing(
    agent: subjects.Subject, corpus: Path
) -> None:
    ack = agent.configure(subjects.config_for(agent, corpus, epoch=1, resume=0, worker=3))
    _refused(ack, "this agent is worker 0, not 3; send it to its own agent")
    beat = agent.beat()
    assert (beat.epoch, beat.state) == (0, State.IDLE)
    assert agent.configure(subjects.config_for(agent, corpus, epoch=1, resume=0)).accepted


def test_settings_for_another_device_are_refused(agent: subjects.Subject, corpus: Path) -> None:
    cuda = subjects.config_for(agent, corpus, epoch=1, resume=0, device=messages.Device.CUDA)
    _refused(
        agent.configure(cuda),
        "settings ask for device cuda but this agent runs on cpu; start the agent with "
        "--device cuda",
    )
    assert agent.beat().epoch == 0


def test_the_same_epoch_sent_again_is_refused_as_stale_and_the_agent_trains_on(
    agent: subjects.Subject, corpus: Path
) -> None:
    config = subjects.config_for(agent, corpus, epoch=1, resume=0)
    assert agent.configure(config).accepted
    _refused(agent.configure(config), "epoch 1 is stale: this agent is at epoch 1")
    first = agent.wait(_running_in(1))
    _refused(agent.configure(config), "epoch 1 is stale: this agent is at epoch 1")
    later = agent.wait(_running_in(1, after=first.last_committed_step))
    assert later.setup == first.setup  # not set up again


def test_an_older_epoch_is_refused_as_stale(agent: subjects.Subject, corpus: Path) -> None:
    assert agent.configure(subjects.config_for(agent, corpus, epoch=3, resume=0)).accepted
    older = subjects.config_for(agent, corpus, epoch=2, resume=0)
    _refused(agent.configure(older), "epoch 2 is stale: this agent is at epoch 3")
    assert agent.wait(_running_in(3)).epoch == 3


def test_a_running_agent_refuses_to_switch_at_its_committed_step(
    agent: subjects.Subject, corpus: Path
) -> None:
    assert agent.configure(subjects.config_for(agent, corpus, epoch=1, resume=0)).accepted
    agent.wait(_running_in(1))
    held = agent.hold()
    step = held.last_committed_step
    at_step = subjects.config_for(agent, corpus, epoch=2, resume=step)
    _refused(
        agent.configure(at_step),
        f"running at step {step}; a running agent switches only at a later step "
        f"(resume_step {step} <= {step})",
    )
    agent.release()
    assert agent.wait(_running_in(1, after=step)).epoch == 1


def test_a_running_agent_takes_a_planned_switch_up_exactly_at_its_step(
    agent: subjects.Subject, corpus: Path
) -> None:
    assert agent.configure(subjects.config_for(agent, corpus, epoch=1, resume=0)).accepted
    agent.wait(_running_in(1))
    held = agent.hold()
    switch = held.last_committed_step + 3
    planned = subjects.config_for(agent, corpus, epoch=2, resume=switch)
    assert agent.configure(planned).accepted
    # The held switch's epoch counts as the agent's newest: sending it again changes nothing.
    _refused(agent.configure(planned), "epoch 2 is stale: this agent is at epoch 2")
    assert agent.beat().epoch == 1  # trains on in its epoch up to the switch step
    agent.release()
    beat = agent.wait(_running_in(2, after=switch))
    # KEPT: the layers it held were at exactly the switch step (snapshots are off, so a
    # switch taken up at any other step would find no tier and fail).
    assert beat.setup is not None and beat.setup.tier is messages.RecoveryTier.KEPT


def test_a_stopped_agent_refuses_every_configure(agent: subjects.Subject, corpus: Path) -> None:
    assert agent.configure(subjects.config_for(agent, corpus, epoch=1, resume=0)).accepted
    agent.wait(_running_in(1))
    agent.stop()
    fresh = subjects.config_for(agent, corpus, epoch=5, resume=0)
    _refused(agent.configure(fresh), "the agent is stopping; start a new agent")
