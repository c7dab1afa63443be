"""`planaria simulate` (planaria.cli.simulate).

Covers: a CSV trace with the tiny model prints the scenario line, a row per policy and where
it wrote summary.json and timeline.png (both present, the JSON naming every policy); --json
prints the same document; a named scenario with one seed reports progress on stderr; bad input
(no scenario or trace, unknown scenario or model, --seeds 0, a malformed CSV, --out naming a
file) is one line on stderr with exit status 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planaria.cli import main
from planaria.sim import policies


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text("time,event,node\n60,fail,3\n600,fail,7\n1200,join,3\n1800,fail,0\n")
    return path


def test_a_csv_trace_prints_the_table_and_writes_files(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main.main(["simulate", "--trace", str(trace), "--model", "tiny", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Odyssey §V-B") and "model tiny; 1 trace(s)" in lines[0]
    assert [line.split()[0] for line in lines[2:-1]] == list(policies.POLICIES)
    document = json.loads((out / "summary.json").read_text())
    assert [p["policy"] for p in document["policies"]] == list(policies.POLICIES)
    assert (out / "timeline.png").read_bytes()[:4] == b"\x89PNG"


def test_json_output(trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--trace", str(trace), "--model", "tiny", "--out", str(tmp_path), "--json"]
    assert main.main(args) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["seeds"] == 1 and document["model"] == "tiny"
    assert set(document["runs"]) == set(policies.POLICIES)


def test_a_named_scenario_reports_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["simulate", "--scenario", "odyssey", "--model", "tiny", "--seeds", "1"]
    assert main.main([*args, "--out", str(tmp_path)]) == 0
    assert "simulate: trace 1/1 done" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give --scenario NAME or --trace FILE"),
        (["--scenario", "moon"], "unknown scenario 'moon'"),
        (["--scenario", "odyssey", "--model", "gpt9"], "gpt9"),
        (["--scenario", "odyssey", "--seeds", "0"], "--seeds must be >= 1 (got 0)"),
    ],
    ids=[
        "neither scenario nor trace",
        "an unknown scenario",
        "an unknown model",
        "no seeds",
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main.main(["simulate", *args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("planaria: error: ") and message in err
    assert len(err.splitlines()) == 1


def test_a_bad_csv_names_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("time,event,node\n5,melt,1\n")
    assert main.main(["simulate", "--trace", str(bad), "--out", str(tmp_path)]) == 2
    assert "line 2: event is 'melt'" in capsys.readouterr().err


def test_out_must_be_a_folder(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    args = ["simulate", "--trace", str(trace), "--model", "tiny", "--out", str(afile)]
    assert main.main(args) == 2
    assert "is a file; give a folder" in capsys.readouterr().err
