"""What a bad-input campaign counts: each input is accepted, rejected cleanly, or a crash.

The campaigns (tests/fuzz/*) judge one input at a time and return a `Verdict`; the tests assert
that no verdict is a crash (Hypothesis then shrinks the input), and bench/fuzz.py runs the same
judges over many more inputs and adds them up in a `Tally`. A rejection that is not clear (an
error of the wrong type, a message without the field's path, a traceback-sized text) counts as a
crash: "bad input gets a clear error" is the property under test, not merely "no exception".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

_T = TypeVar("_T")


class Outcome(StrEnum):
    ACCEPTED = "accepted"
    REJECTED = "rejected"  # cleanly: the expected error type, one line naming the field
    CRASHED = "crashed"  # anything else


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """The outcome of one input; `detail` is the error line or what went wrong."""

    outcome: Outcome
    detail: str = ""


ACCEPTED = Verdict(outcome=Outcome.ACCEPTED)


def rejected(detail: str) -> Verdict:
    return Verdict(outcome=Outcome.REJECTED, detail=detail)


def crashed(detail: str, exc: BaseException | None = None) -> Verdict:
    """A crash: `detail` says where; `exc`, when given, is named with its message."""
    if exc is not None:
        detail = f"{detail}: {type(exc).__name__}: {str(exc)[:300]}"
    return Verdict(outcome=Outcome.CRASHED, detail=detail)


@dataclass(slots=True, kw_only=True)
class Tally:
    """A campaign's counts; `crashes` keeps the first few crash details (and `input` of each,
    shortened) so a report can show them."""

    campaign: str
    tried: int = 0
    accepted: int = 0
    rejected: int = 0
    crashes: int = 0
    examples: list[str] = dataclasses.field(default_factory=list)

    def add(self, verdict: Verdict, given_input: object = None) -> None:
        self.tried += 1
        if verdict.outcome is Outcome.ACCEPTED:
            self.accepted += 1
        elif verdict.outcome is Outcome.REJECTED:
            self.rejected += 1
        else:
            self.crashes += 1
            if len(self.examples) < 5:
                self.examples.append(f"{verdict.detail} <- input {repr(given_input)[:200]}")

    def row(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def tally_all(campaign: str, inputs: Iterable[_T], judge: Callable[[_T], Verdict]) -> Tally:
    """Judge every input of an exhaustive campaign (every bit, every prefix)."""
    tally = Tally(campaign=campaign)
    for value in inputs:
        tally.add(judge(value), value)
    return tally


def tally_drawn(
    campaign: str, strategy: st.SearchStrategy[_T], judge: Callable[[_T], Verdict], examples: int
) -> Tally:
    """Judge `examples` inputs drawn by Hypothesis (fewer when the strategy runs out of
    distinct inputs). Crashes are counted, not raised, so nothing is shrunk or stopped."""
    tally = Tally(campaign=campaign)

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def one(value: _T) -> None:
        tally.add(judge(value), value)

    one()
    return tally
