"""Bad job specs get a clear error (issue #10, bad input, campaign 1; tests/fuzz/job_specs.py).

Covers: mutants of valid specs (fields dropped, duplicated as snake_case twins, replaced by
wrong types, signs, integer widths, NaN and infinities, bad durations and enum near-misses,
unknown keys, wrapped in lists, nested deeply; bare specs and whole documents; roots that are
no mapping) through `parse_job` and `to_settings` and, for bare specs, the pydantic model: each
converts or is refused with one line naming the field, and loader and model agree; damaged
texts (cut short, a key repeated, binary junk, tabs, nesting deeper than the YAML parser's
recursion); the CLI (`planaria run bad.yaml`) exits 2 with one line on stderr and no traceback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings

from tests import strategies
from tests.fuzz import job_specs, verdicts

PLANARIA = str(Path(sys.executable).parent / "planaria")


@settings(max_examples=100, deadline=None)
@given(strategies.job_spec_mutants())
def test_a_mutated_spec_converts_or_is_refused_naming_the_field(document: object) -> None:
    verdict = job_specs.judge_object(document)
    assert verdict.outcome is not verdicts.Outcome.CRASHED, verdict.detail


@settings(max_examples=60, deadline=None)
@given(strategies.job_file_texts())
def test_a_damaged_job_file_converts_or_is_refused_naming_the_field(text: str) -> None:
    verdict = job_specs.judge_text(text)
    assert verdict.outcome is not verdicts.Outcome.CRASHED, verdict.detail


@pytest.mark.parametrize(
    "text",
    ["[" * 2_000 + "]" * 2_000, "workers: " + "{a: " * 2_000 + "1" + "}" * 2_000],
    ids=["a list nested 2000 deep", "a field nested 2000 deep"],
)
def test_nesting_deeper_than_the_parser_recurses_is_refused(text: str) -> None:
    verdict = job_specs.judge_text(text)
    assert verdict.outcome is verdicts.Outcome.REJECTED, verdict.detail
    assert "nested too deeply" in verdict.detail


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("workers: [1, 2]\n", "workers: must be a whole number"),
        ("[" * 2_000 + "]" * 2_000, "nested too deeply"),
    ],
    ids=["a wrong type", "nesting past the parser"],
)
def test_the_cli_prints_one_line_and_exits_2(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    done = subprocess.run([PLANARIA, "run", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("planaria: error: "), done.stderr
    assert expected in lines[0] and "Traceback" not in done.stderr
