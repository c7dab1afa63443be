"""The restart policy of local agents (planaria.local.restarts), pure: the back-off starts at the
initial wait, doubles per restart up to the cap and is never above it, and ends (None) exactly
when the worker has had its restarts; a policy that makes no sense is refused with the fix;
exit 0 and kills on purpose are not restarted, every other exit is (an adopted process's
unknown status too); the give-up cause is one line naming the exit, the restarts and the log."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planaria.contract import plan
from planaria.local import restarts

policies = st.builds(
    lambda count, first, factor: restarts.RestartPolicy(
        max_restarts=count, initial_backoff_s=first, max_backoff_s=first * factor
    ),
    st.integers(0, 40),
    st.floats(1e-3, 60.0),
    st.floats(1.0, 1e4),
)


@given(policies)
def test_the_back_off_doubles_from_the_first_wait_up_to_the_cap(
    policy: restarts.RestartPolicy,
) -> None:
    waits = [policy.backoff_s(done) for done in range(policy.max_restarts)]
    assert all(w is not None for w in waits)
    if waits:
        assert waits[0] == policy.initial_backoff_s
    for before, after in zip(waits, waits[1:], strict=False):
        assert before is not None and after is not None
        assert after == min(policy.max_backoff_s, 2 * before)
    assert all(w is not None and w <= policy.max_backoff_s for w in waits)


@given(policies, st.integers(0, 10_000))
def test_no_restart_is_left_once_the_worker_had_its_restarts(
    policy: restarts.RestartPolicy, extra: int
) -> None:
    assert policy.backoff_s(policy.max_restarts + extra) is None


def test_the_default_is_one_second_doubling_to_thirty_five_times() -> None:
    waits = [restarts.DEFAULT.backoff_s(done) for done in range(6)]
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, None]
    assert restarts.NEVER.backoff_s(0) is None


@pytest.mark.parametrize(
    ("changes", "fix"),
    [
        pytest.param({"max_restarts": -1}, "give 0 or more", id="negative restarts"),
        pytest.param({"initial_backoff_s": 0.0}, "seconds > 0", id="no first wait"),
        pytest.param(
            {"initial_backoff_s": 5.0, "max_backoff_s": 1.0}, "at least", id="a cap below it"
        ),
        pytest.param({"reset_after_s": -1.0}, "seconds >= 0", id="a negative reset"),
        pytest.param({"reset_after_s": float("nan")}, "seconds >= 0", id="a reset that is nan"),
    ],
)
def test_a_policy_that_makes_no_sense_is_refused(changes: dict[str, float], fix: str) -> None:
    with pytest.raises(ValueError, match=fix):
        restarts.RestartPolicy(**changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("code", "on_purpose", "restarted"),
    [
        pytest.param(0, False, False, id="exit 0 is an agent told to stop"),
        pytest.param(3, False, True, id="an error exit restarts"),
        pytest.param(-9, False, True, id="a signal from outside restarts"),
        pytest.param(-9, True, False, id="a kill on purpose does not"),
        pytest.param(None, False, True, id="an adopted process's unknown status restarts"),
        pytest.param(None, True, False, id="an adopted process killed on purpose does not"),
    ],
)
def test_which_exits_restart(code: int | None, on_purpose: bool, restarted: bool) -> None:
    assert restarts.unexpected(code, on_purpose=on_purpose) is restarted


def test_the_cause_is_one_line_with_the_exit_the_restarts_and_the_log() -> None:
    log = Path("runs/tiny/workers/worker-2.log")
    said = restarts.cause(plan.WorkerId(2), 5, "process 41 exited with exit code 3", log)
    assert said == (
        "worker 2's agent process 41 exited with exit code 3 after 5 restart(s); not restarted "
        "again (see runs/tiny/workers/worker-2.log)"
    )


@given(
    st.integers(min_value=0, max_value=100),
    st.floats(min_value=0.0, max_value=1e6),
    st.floats(min_value=0.0, max_value=1e6),
)
def test_a_process_that_ran_the_reset_time_starts_the_count_afresh(
    done: int, ran_s: float, reset_after_s: float
) -> None:
    policy = restarts.RestartPolicy(reset_after_s=reset_after_s)
    assert policy.counted(done, ran_s) == (0 if ran_s >= reset_after_s else done)


def test_kubelets_ten_minutes_are_the_default_and_infinity_never_forgives() -> None:
    assert restarts.DEFAULT.reset_after_s == 600.0
    assert restarts.DEFAULT.counted(5, 599.9) == 5 and restarts.DEFAULT.counted(5, 600.0) == 0
    never = restarts.RestartPolicy(reset_after_s=float("inf"))
    assert never.counted(3, 1e300) == 3
