"""The one duration grammar (planaria.spec.durations).

Covers: every case of tests/spec/duration_cases.py read as its seconds or refused with one
line naming the value and the accepted forms; the CRD's pattern, under the API server's RE2,
accepts exactly the cases the parser accepts; numbers are seconds, negatives, NaN, infinity and
booleans are refused; properties: a duration written from parts (largest unit first, any
subset) reads back as their sum, any text made of duration characters is accepted by the
parser exactly when RE2 matches the CRD pattern, and every text the grammar generates parses.
"""

from __future__ import annotations

import math

import pytest

# google-re2 ships no type information; it is the API server's regular expression engine.
import re2  # type: ignore[import-untyped]
from hypothesis import given
from hypothesis import strategies as st

from planaria.spec import durations
from tests import strategies
from tests.spec.duration_cases import CASES

CRD_RE2 = re2.compile(durations.CRD_PATTERN)


@pytest.mark.parametrize(("text", "seconds"), [c[:2] for c in CASES], ids=[c[2] for c in CASES])
def test_the_parser_reads_each_case_as_its_seconds_or_refuses_it(
    text: str, seconds: float | None
) -> None:
    if seconds is None:
        with pytest.raises(durations.DurationError) as refused:
            durations.parse(text)
        message = str(refused.value)
        assert repr(text) in message and durations.FORMS in message and "\n" not in message
    else:
        assert durations.parse(text) == pytest.approx(seconds, rel=1e-15)


@pytest.mark.parametrize(("text", "seconds"), [c[:2] for c in CASES], ids=[c[2] for c in CASES])
def test_the_crd_pattern_under_re2_accepts_exactly_what_the_parser_accepts(
    text: str, seconds: float | None
) -> None:
    assert (CRD_RE2.search(text) is not None) == (seconds is not None)


@pytest.mark.parametrize("value", [0, 7, 1.5, 86400.0])
def test_numbers_are_seconds(value: float) -> None:
    assert durations.parse(value) == float(value)


@pytest.mark.parametrize("value", [-1, -0.5, math.nan, math.inf, True, None])
def test_negative_non_finite_and_non_numbers_are_refused(value: object) -> None:
    with pytest.raises(durations.DurationError, match="is not a duration"):
        durations.parse(value)  # type: ignore[arg-type]


@given(strategies.durations())
def test_a_duration_written_from_parts_reads_back_as_their_sum(
    written: tuple[str, float],
) -> None:
    text, seconds = written
    assert durations.parse(text) == pytest.approx(seconds, rel=1e-12)
    assert CRD_RE2.search(text) is not None


@given(st.text(alphabet="0123456789.hms -+e", max_size=14))
def test_the_parser_and_the_crd_pattern_agree_on_any_text(text: str) -> None:
    try:
        durations.parse(text)
        parsed = True
    except durations.DurationError:
        parsed = False
    assert parsed == (CRD_RE2.search(text) is not None)


@given(st.from_regex(durations.BODY, fullmatch=True).filter(str.isascii))
def test_every_text_of_the_grammar_parses_to_a_finite_duration(text: str) -> None:
    assert 0 <= durations.parse(text) < math.inf
