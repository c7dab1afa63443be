"""`planaria simulate` (planaria.cli.simulate).

Covers: a CSV trace with the tiny model prints a first line naming the trace, its events and
the horizon (the scenario's 9 h), a row per policy and where it wrote summary.json and
timeline.png (both present, the JSON naming every policy); --json prints the same document; a
named scenario with one seed and --hours states that horizon and reports progress on stderr; a
trace with only its header is a fault-free run of the horizon: every policy trains at the rate of
the plan it starts on (commit cycle included); bad input (no scenario or trace, unknown scenario
or model, --seeds 0, --hours 0, a malformed CSV, an event on a node outside the cluster, an
empty trace with an open-ended scenario, --out naming a file) is one line on stderr with exit
status 2; every option is documented in docs/simulator.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from planaria.cli import main
from planaria.sim import engine, planning, policies, scenarios

ROOT = Path(__file__).resolve().parents[2]


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
    assert lines[0] == (
        f"trace {trace}: 4 event(s) on the 32 nodes of odyssey; horizon 9 h; model tiny"
    )
    assert [line.split()[0] for line in lines[2:-1]] == list(policies.POLICIES)
    document = json.loads((out / "summary.json").read_text())
    assert [p["policy"] for p in document["policies"]] == list(policies.POLICIES)
    assert (out / "timeline.png").read_bytes()[:4] == b"\x89PNG"


def test_json_output(trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--trace", str(trace), "--model", "tiny", "--out", str(tmp_path), "--json"]
    assert main.main(args) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["seeds"] == 1 and document["model"] == "tiny"
    assert document["horizon_s"] == 9 * 3600.0
    assert set(document["runs"]) == set(policies.POLICIES)


def test_a_named_scenario_states_its_horizon_and_reports_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["simulate", "--scenario", "odyssey", "--model", "tiny", "--seeds", "1"]
    assert main.main([*args, "--hours", "0.5", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0] == (
        "Odyssey §V-B: 32 devices, 10%/device/hour; horizon 0.5 h; 1 trace(s); model tiny"
    )
    progress = [line for line in captured.err.splitlines() if line.startswith("simulate:")]
    assert [line.split(" (")[0] for line in progress] == [
        f"simulate: trace 1/1, {name} done" for name in policies.POLICIES
    ]  # a line per policy's run: a 1,024-node trace takes seconds per policy
    assert progress[-1].startswith(f"simulate: trace 1/1, ideal done ({len(progress)}/")
    assert json.loads((tmp_path / "summary.json").read_text())["horizon_s"] == 1800.0


def test_an_empty_trace_is_a_fault_free_run_of_the_horizon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("time,event,node\n")
    args = ["simulate", "--trace", str(empty), "--model", "tiny", "--hours", "1"]
    assert main.main([*args, "--out", str(tmp_path)]) == 0
    assert "0 event(s) on the 32 nodes of odyssey; horizon 1 h" in capsys.readouterr().out
    runs = json.loads((tmp_path / "summary.json").read_text())["runs"]
    scenario = scenarios.named("odyssey")
    planner = planning.Planner(scenario.job("tiny"))
    everyone = engine.workers(range(scenario.num_nodes), 1)
    for name, factory in policies.POLICIES.items():
        start = factory(planner, scenario.time_to_failure).start(everyone)
        cycle_s = start.steps_per_commit * start.step_s + start.commit_s
        samples_per_cycle = start.steps_per_commit * scenario.global_batch
        (run,) = runs[name]
        assert run["horizon_s"] == 3600.0
        # the horizon ends the run within one commit cycle: its finished steps count
        assert run["throughput"] == pytest.approx(
            samples_per_cycle / cycle_s, abs=samples_per_cycle / 3600.0
        ), name
        assert run["throughput"] > 0 and run["breakdown"]["lost_s"] == 0.0, name


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give --scenario NAME or --trace FILE"),
        (["--scenario", "moon"], "unknown scenario 'moon'"),
        (["--scenario", "odyssey", "--model", "gpt9"], "gpt9"),
        (["--scenario", "odyssey", "--seeds", "0"], "--seeds must be >= 1 (got 0)"),
        (["--scenario", "odyssey", "--hours", "0"], "--hours must be > 0 (got 0)"),
        (["--scenario", "odyssey", "--hours", "nan"], "--hours must be > 0 (got nan)"),
    ],
    ids=[
        "neither scenario nor trace",
        "an unknown scenario",
        "an unknown model",
        "no seeds",
        "no hours",
        "hours that are not a number",
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main.main(["simulate", *args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("planaria: error: ") and message in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("text", "scenario", "message"),
    [
        ("5,melt,1\n", "odyssey", "line 2: event is 'melt'; give fail or join"),
        (
            "60,fail,3\n600,fail,999\n",
            "odyssey",
            "line 3: node 999 is not in the cluster (nodes 0..31); give one of those, or a "
            "scenario with more nodes (--scenario)",
        ),
        (
            "60,fail,30\n",
            "oobleck-1h",
            "line 2: node 30 is not in the cluster (nodes 0..29)",
        ),
        ("60,fail,3\n90,fail,3\n", "odyssey", "line 3: node 3 already failed at line 2"),
        ("60,join,3\n", "odyssey", "line 2: node 3 cannot join, it is live from the start"),
        (
            "40000,fail,3\n",
            "odyssey",
            "line 2: time 40000 s is after the horizon (32400 s = 9 h); give more --hours",
        ),
        ("", "oobleck-1h", "no event after time 0 ends the run; give a horizon in hours (--hours)"),
    ],
    ids=[
        "an unknown event names its line",
        "a failure of a node outside the cluster names its line",
        "a node outside a 30-node scenario names its line",
        "a second failure of a failed node names its line",
        "a join of a live node names its line",
        "an event after the horizon names its line",
        "an empty trace with an open-ended scenario asks for --hours",
    ],
)
def test_a_bad_trace_is_one_line_naming_its_line_and_exit_2(
    text: str, scenario: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("time,event,node\n" + text)
    out = tmp_path / "out"
    args = ["simulate", "--trace", str(bad), "--scenario", scenario, "--out", str(out)]
    assert main.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"planaria: error: {bad}: {message}")
    assert err.count("\n") == 1
    assert not out.exists()


def test_out_must_be_a_folder(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    args = ["simulate", "--trace", str(trace), "--model", "tiny", "--out", str(afile)]
    assert main.main(args) == 2
    assert "is a file; give a folder" in capsys.readouterr().err


def test_every_simulate_option_is_documented() -> None:
    docs = (ROOT / "docs" / "simulator.md").read_text(encoding="utf-8")
    parser = main.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    options = [o for a in subparsers.choices["simulate"]._actions for o in a.option_strings]
    assert "--hours" in options
    for option in options:
        if option not in ("-h", "--help"):
            assert f"`{option}" in docs or f"{option} " in docs, option
