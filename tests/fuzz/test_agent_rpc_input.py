"""Malformed gRPC requests get INVALID_ARGUMENT naming the field (issue #10, bad input,
campaign 3; tests/fuzz/agent_rpc.py).

Covers, against the agent's real service and runtime on loopback: the well-formed request of
every method is served (a busy agent's Profile is FAILED_PRECONDITION); random bytes to every
method; every proper prefix of every method's well-formed request (a truncated
ConfigureRequest at each of its lengths); single flipped bits of a ConfigureRequest; well-formed
requests with fields anywhere in them cleared, emptied or set to edge values (integer widths,
NaN, infinities, unknown enum numbers, long strings, repeated items dropped or doubled); a
heartbeat interval past any wait (once an UNKNOWN). Each answer is OK, INVALID_ARGUMENT with
one line naming the request message, or FAILED_PRECONDITION where the method allows it; never
UNKNOWN or INTERNAL; the health service still answers SERVING after every campaign.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.v1 import agent_pb2 as pb
from tests import strategies
from tests.fuzz import agent_rpc, verdicts

VALID = agent_rpc.valid_requests()
METHOD_NAMES = sorted(agent_rpc.METHODS)


@pytest.fixture(scope="module")
def agent() -> Iterator[agent_rpc.AgentUnderTest]:
    with agent_rpc.AgentUnderTest() as served:
        yield served
        assert served.healthy()


def _assert_clean(agent: agent_rpc.AgentUnderTest, method: str, raw: bytes) -> None:
    verdict = agent_rpc.judge(agent, method, raw)
    assert verdict.outcome is not verdicts.Outcome.CRASHED, verdict.detail


@pytest.mark.parametrize("method", METHOD_NAMES)
def test_the_well_formed_request_is_served(agent: agent_rpc.AgentUnderTest, method: str) -> None:
    code, details = agent.call(method, VALID[method].SerializeToString())
    expected = "FAILED_PRECONDITION" if method == "Profile" else "OK"
    assert code.name == expected, details


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(METHOD_NAMES), st.binary(max_size=300))
def test_random_bytes_are_refused_cleanly(
    agent: agent_rpc.AgentUnderTest, method: str, raw: bytes
) -> None:
    _assert_clean(agent, method, raw)


@pytest.mark.parametrize("method", METHOD_NAMES)
def test_every_prefix_of_a_request_is_refused_cleanly(
    agent: agent_rpc.AgentUnderTest, method: str
) -> None:
    raw = VALID[method].SerializeToString()
    tally = verdicts.tally_all(
        method, agent_rpc.prefixes(raw), lambda cut: agent_rpc.judge(agent, method, cut)
    )
    assert tally.tried == len(raw) and tally.crashes == 0, tally.examples
    assert agent.healthy()


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_flipped_bit_of_a_configure_request_is_refused_cleanly(
    agent: agent_rpc.AgentUnderTest, data: st.DataObject
) -> None:
    raw = bytearray(VALID["Configure"].SerializeToString())
    bit = data.draw(st.integers(0, len(raw) * 8 - 1))
    raw[bit // 8] ^= 1 << (bit % 8)
    _assert_clean(agent, "Configure", bytes(raw))


_MUTANTS = st.sampled_from(METHOD_NAMES).flatmap(
    lambda method: st.tuples(st.just(method), strategies.mutated_protos(VALID[method]))
)


@settings(max_examples=150, deadline=None)
@given(_MUTANTS)
def test_fields_set_out_of_range_are_refused_naming_the_field(
    agent: agent_rpc.AgentUnderTest, mutant: tuple[str, bytes]
) -> None:
    _assert_clean(agent, *mutant)


def test_a_heartbeat_interval_past_any_wait_is_invalid_argument(
    agent: agent_rpc.AgentUnderTest,
) -> None:
    code, details = agent.call("Watch", pb.WatchRequest(interval_s=1e12).SerializeToString())
    assert code.name == "INVALID_ARGUMENT" and details.startswith("WatchRequest.interval_s")
    assert agent.healthy()
