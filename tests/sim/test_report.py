"""Reports (planaria.sim.report): the 95% interval, the table, post-recovery efficiency, JSON
and the timeline PNG.

Covers: the half-width of the 95% interval (hand numbers, one value: 0); a study's summaries
name every policy in order, Planaria's ratio to itself is 1 and the ideal's post-recovery
efficiency is 1; the breakdown fractions sum to 1; the table has a row per policy; JSON
round-trips; the PNG is written.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from planaria.sim import policies, report, study
from tests.sim import conftest


def test_half_width_of_the_95_percent_interval() -> None:
    assert report.half_width([5.0]) == 0.0
    # two values 1 and 3: stdev sqrt(2), t(1) = 12.706
    assert report.half_width([1.0, 3.0]) == pytest.approx(12.706 * math.sqrt(2) / math.sqrt(2))
    assert report.half_width([2.0] * 40) == 0.0


@pytest.fixture(scope="module")
def result() -> study.Study:
    return study.run(conftest.tiny_scenario(), [0, 1])


def test_summaries_cover_every_policy(result: study.Study) -> None:
    summaries = report.summarise(result.runs, result.planner, result.num_nodes)
    assert [s.policy for s in summaries] == list(policies.POLICIES)
    by_name = {s.policy: s for s in summaries}
    assert by_name["planaria"].planaria_ratio == pytest.approx(1.0)
    assert by_name["ideal"].post_recovery == pytest.approx(1.0)
    for s in summaries:
        assert sum(s.breakdown.values()) == pytest.approx(1.0)
        assert s.post_recovery is None or s.post_recovery <= 1.0 + 1e-9
    lines = report.table(summaries).splitlines()
    assert len(lines) == 1 + len(policies.POLICIES)
    assert lines[0].split()[-7:-2] == ["training", "checkpoint", "recovering", "lost", "idle"]
    assert len({len(line) for line in lines}) == 1  # every column as wide as its whole name
    assert json.loads(json.dumps(report.to_json(summaries)))[0]["policy"] == "planaria"


def test_timeline_png_is_written(result: study.Study, tmp_path: Path) -> None:
    path = tmp_path / "timeline.png"
    first = {name: runs[0] for name, runs in result.runs.items()}
    report.timeline_png(first, [e.time_s for e in result.traces[0].events], path, "tiny")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
