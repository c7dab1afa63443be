"""`planaria plan` (planaria.cli.plan, .plan_report), through `planaria.cli.main.main` and the
console script.

Covers: the text report lists the templates, the chosen instantiation with its batch split and
the runner-up, and with --failed the reinstantiated plan; --json prints the documented document
(every field of docs/planner.md present, numbers consistent with the planner's own result);
--gpu-memory-gib changes n0; each plan's guarantee against node failures (one line, and
`nodeFailures` in JSON) on a 2 x 2 plan where it is stated by hand (3 nodes with the job spec's
default redundancy, copy; 1 with none), on one pipeline of two nodes (0 with none, 1 with
its mirrors) and, with --failed, for the plan after the failure, the
same as the planner's; --redundancy takes the job spec's values and default; every bad input
(malformed options, a redundancy the job spec does not name, a micro-batch that is not the
profile's, failed nodes outside the cluster or repeated, a missing profile file, an
undistributable global batch, too few nodes for the fault tolerance) is one line on stderr with
exit status 2 and no traceback, also from a real subprocess; the required options are required in
the usage, and all missing ones are named in one argparse error with exit status 2; every
option is documented in docs/planner.md (the --explain family in docs/policy.md).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from planaria.cli import main
from planaria.planner import instantiation, node_failures, templates
from planaria.spec import job, profile_file

PLANARIA = str(Path(sys.executable).parent / "planaria")
ROOT = Path(__file__).resolve().parents[2]


def _args(path: Path, *extra: str) -> list[str]:
    base = ["plan", "--profile", str(path), "--nodes", "5", "--gpus-per-node", "2"]
    return [*base, "--fault-tolerance", "1", "--global-batch", "64", "--micro-batch", "2", *extra]


def test_the_report_shows_templates_plan_and_the_plan_after_failures(
    profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main.main(_args(profile_path, "--failed", "1,3")) == 0
    out = capsys.readouterr().out
    assert out.startswith("templates (Oobleck §4.1): n0 = 1, sizes 1..4")
    assert re.search(r"^  nodes  stages +mapped for +T  stages: layers x GPUs", out, re.MULTILINE)
    assert "plan (Oobleck §4.2):" in out and "samples/s" in out and "chose" in out
    assert re.search(r"^  pipeline  nodes +stages  micro-batches +time$", out, re.MULTILINE)
    assert re.search(r"^ +0  [0-9,]+ +[0-9]+ +[0-9]+ +[0-9.]+ s$", out, re.MULTILINE)
    assert "after nodes 1,3 fail (Oobleck §5.1):" in out and "lost node(s) [1, 3]" in out


def test_pipelines_alike_fold_into_one_row_at_scale(
    profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 200 one-node pipelines of the same shape: one row naming them all, not 200 rows
    args = ["plan", "--profile", str(profile_path), "--nodes", "200", "--gpus-per-node", "2"]
    args += ["--fault-tolerance", "1", "--global-batch", "400", "--micro-batch", "2"]
    assert main.main(args) == 0
    out = capsys.readouterr().out
    table = out[out.index("  pipeline  nodes") :].splitlines()[2:]
    rows = [line.split() for line in table if not line.lstrip().startswith("survives")]
    assert rows == [["0-199", "0-199", rows[0][2], "1", rows[0][4], "s"]], table
    assert main.main([*args, "--json"]) == 0  # the JSON keeps one entry per pipeline
    assert len(json.loads(capsys.readouterr().out)["plan"]["pipelines"]) == 200


def test_json_has_every_documented_field_and_matches_the_planner(
    profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main.main(_args(profile_path, "--failed", "0", "--json")) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["format"] == "planaria.plan-output" and document["version"] == 2
    assert set(document) == {
        "format",
        "version",
        "redundancy",
        "templates",
        "plan",
        "reinstantiation",
    }
    assert document["redundancy"] == "copy"
    assert set(document["templates"]) == {"minNodes", "sizes", "reason", "items"}
    item = document["templates"]["items"][0]
    assert set(item) == {"nodes", "iterationTimeS", "plannedMicroBatches", "stages"}
    assert set(item["stages"][0]) == {"layers", "node", "gpus", "timeS"}
    chosen = document["plan"]
    assert set(chosen) == {
        "instantiation",
        "throughputSamplesPerS",
        "iterationTimeS",
        "reason",
        "runnerUp",
        "globalBatch",
        "microBatchSize",
        "gpusPerNode",
        "pipelines",
        "nodeFailures",
    }
    assert set(chosen["nodeFailures"]) == {
        "tolerated",
        "smallestFatalNodes",
        "layerWithoutReplica",
        "layerWithoutSnapshot",
        "members",
        "mirroredMembers",
        "reason",
    }
    assert set(after_plan := document["reinstantiation"]["plan"]) >= {"pipelines", "nodeFailures"}
    assert set(after_plan["nodeFailures"]) == set(chosen["nodeFailures"])
    assert set(chosen["pipelines"][0]) == {"nodes", "microBatches", "timeS", "stages"}
    assert set(chosen["pipelines"][0]["stages"][0]) == {"layers", "workers"}
    assert sum(p["microBatches"] for p in chosen["pipelines"]) * 2 == chosen["globalBatch"] == 64
    after = document["reinstantiation"]
    assert set(after) == {
        "failedNodes",
        "path",
        "steps",
        "reason",
        "throughputSamplesPerS",
        "movedBytes",
        "alternatives",
        "plan",
    }
    assert after["failedNodes"] == [0]
    assert after["path"] in {"simple", "borrow", "merge", "re-optimised"}
    assert 0 not in {n for p in after["plan"]["pipelines"] for n in p["nodes"]}

    source = profile_file.load_profile(profile_path)
    template_set = templates.generate_templates(
        source, num_nodes=5, gpus_per_node=2, fault_tolerance=1
    )
    expected = instantiation.choose_plan(template_set, list(range(5)), 64)
    assert chosen["throughputSamplesPerS"] == expected.chosen.throughput
    assert [p["microBatches"] for p in chosen["pipelines"]] == [
        p.num_micro_batches for p in expected.plan.pipelines
    ]
    guarantee = node_failures.tolerated_node_failures(expected.plan, protected=True)
    assert chosen["nodeFailures"]["tolerated"] == guarantee.failures
    assert chosen["nodeFailures"]["smallestFatalNodes"] == list(guarantee.smallest)
    assert chosen["nodeFailures"]["reason"] == guarantee.reason


def _two_by_two(profile_path: Path, *extra: str) -> list[str]:
    """4 one-GPU nodes, fault tolerance 1, and memory for layers 0-2 or 3-9 per GPU: two
    pipelines of two stages, nodes 0, 1 and 2, 3 (layers 0-2 on nodes 0 and 2)."""
    args = ["plan", "--profile", str(profile_path), "--nodes", "4", "--gpus-per-node", "1"]
    args += ["--fault-tolerance", "1", "--global-batch", "64", "--micro-batch", "2"]
    return [*args, "--gpu-memory-gib", "0.03125", *extra]


@pytest.mark.parametrize(
    ("redundancy", "line", "tolerated", "smallest"),
    [
        pytest.param(
            [],
            "survives any 3 node failures without the checkpoint (live replicas, then "
            "host-memory snapshots, redundancy copy, mirrored); nodes [0-3] would lose layer "
            "0's state",
            3,
            [0, 1, 2, 3],
            id="the default copy: losing layer 0's snapshot takes both holders and both mirrors",
        ),
        pytest.param(
            ["--redundancy", "none"],
            "survives any 1 node failure without the checkpoint (live replicas, then "
            "host-memory snapshots, redundancy none, no mirrors); nodes [0, 2] would lose layer "
            "0's state",
            1,
            [0, 2],
            id="none: losing layer 0's two holders loses its replicas and its snapshot",
        ),
    ],
)
def test_a_two_by_two_plan_survives_the_node_failures_stated_by_hand(
    profile_path: Path,
    capsys: pytest.CaptureFixture[str],
    redundancy: list[str],
    line: str,
    tolerated: int,
    smallest: list[int],
) -> None:
    assert main.main(_two_by_two(profile_path, *redundancy)) == 0
    out = capsys.readouterr().out
    assert "plan (Oobleck §4.2): 2x2 nodes" in out
    assert f"\n  {line}\n" in out + "\n"
    assert main.main(_two_by_two(profile_path, *redundancy, "--json")) == 0
    document = json.loads(capsys.readouterr().out)
    stages = [[s["workers"] for s in p["stages"]] for p in document["plan"]["pipelines"]]
    assert stages == [[[0], [1]], [[2], [3]]]
    assert document["plan"]["pipelines"][0]["stages"][0]["layers"] == [0, 3]
    failures = document["plan"]["nodeFailures"]
    assert (failures["tolerated"], failures["smallestFatalNodes"]) == (tolerated, smallest)
    assert (failures["layerWithoutReplica"], failures["layerWithoutSnapshot"]) == (0, 0)
    assert failures["members"] == 20  # 10 layers, each held by 2 workers
    assert failures["mirroredMembers"] == (0 if redundancy else 20)
    assert failures["reason"].startswith(f"every {tolerated} node failures leave each layer")


@pytest.mark.parametrize(
    ("redundancy", "line"),
    [
        pytest.param(
            "none",
            "does not survive every single node failure without the checkpoint (live replicas, "
            "then host-memory snapshots, redundancy none, no mirrors); node [0] would lose "
            "layer 0's state",
            id="none: one pipeline has one replica of each layer and no copy of its snapshot",
        ),
        pytest.param(
            "xor",
            "survives any 1 node failure without the checkpoint (live replicas, then host-memory "
            "snapshots, redundancy xor, mirrored); nodes [0, 1] would lose layer 0's state",
            id="xor: each node's snapshot is mirrored on the other node",
        ),
    ],
)
def test_one_pipeline_survives_a_node_failure_only_through_its_mirrors(
    profile_path: Path, capsys: pytest.CaptureFixture[str], redundancy: str, line: str
) -> None:
    args = _two_by_two(profile_path, "--redundancy", redundancy)
    args[args.index("--nodes") + 1], args[args.index("--fault-tolerance") + 1] = "2", "0"
    assert main.main(args) == 0
    out = capsys.readouterr().out
    assert "plan (Oobleck §4.2): 1x2 nodes" in out and f"\n  {line}\n" in out + "\n"


def test_the_plan_after_failures_has_its_own_guarantee(
    profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main.main(_args(profile_path, "--failed", "1,3", "--redundancy", "xor")) == 0
    lines = capsys.readouterr().out.splitlines()
    after = next(i for i, line in enumerate(lines) if line.startswith("after nodes 1,3 fail"))
    assert sum("without the checkpoint" in line for line in lines[:after]) == 1
    (line,) = [line for line in lines[after:] if "without the checkpoint" in line]
    assert "redundancy xor" in line and re.search(r"nodes \[[-0-9, ]+\] would lose", line)
    assert main.main(_args(profile_path, "--failed", "1,3", "--redundancy", "xor", "--json")) == 0
    after_plan = json.loads(capsys.readouterr().out)["reinstantiation"]["plan"]
    failures = after_plan["nodeFailures"]
    survivors = {n for p in after_plan["pipelines"] for n in p["nodes"]}
    assert set(failures["smallestFatalNodes"]) <= survivors and not survivors & {1, 3}
    assert f"survives any {failures['tolerated']} node failure" in line


def test_redundancy_takes_the_job_specs_values_and_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        main.main(["plan", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    names = ", ".join(r.value for r in job.Redundancy)
    assert names == "none, copy, xor, recompute"
    assert f"--redundancy MODE the job's snapshot redundancy (snapshots.redundancy): {names}" in (
        help_text
    )
    assert f"(default: {job.SnapshotSpec().redundancy.value})" in help_text


def test_less_gpu_memory_raises_n0(profile_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main.main(_args(profile_path, "--gpu-memory-gib", "0.015625", "--json")) == 0
    assert json.loads(capsys.readouterr().out)["templates"]["minNodes"] == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param({"--nodes": "five"}, "--nodes must be a whole number", id="not a number"),
        pytest.param({"--gpus-per-node": "0"}, "--gpus-per-node must be >= 1", id="no GPUs"),
        pytest.param(
            {"--fault-tolerance": "-1"}, "--fault-tolerance must be >= 0", id="negative f"
        ),
        pytest.param(
            {"--micro-batch": "4"},
            "does not match the profile's micro-batch size 2; pass --micro-batch 2",
            id="a micro-batch that is not the profile's",
        ),
        pytest.param(
            {"--gpu-memory-gib": "lots"}, "--gpu-memory-gib must be a number", id="bad memory"
        ),
        pytest.param({"--failed": "1,x"}, "comma-separated node ids", id="a malformed id"),
        pytest.param(
            {"--redundancy": "raid5"},
            "--redundancy must be one of none, copy, xor, recompute (got 'raid5')",
            id="a redundancy the job spec does not name",
        ),
        pytest.param({"--failed": "5"}, "node 5 is not in 0..4", id="a node outside the cluster"),
        pytest.param({"--failed": "2,2"}, "node 2 is given twice", id="a repeated node"),
        pytest.param(
            {"--global-batch": "63"},
            "nearest distributable global batch is 64",
            id="a global batch of half micro-batches",
        ),
        pytest.param({"--fault-tolerance": "5"}, "lower the fault tolerance to 4", id="f too high"),
        pytest.param({"--profile": "/nonexistent.json"}, "nonexistent", id="no profile file"),
    ],
)
def test_bad_input_is_one_line_with_exit_status_2(
    profile_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: dict[str, str | None],
    message: str,
) -> None:
    args = _args(profile_path)
    for flag, value in change.items():
        if flag not in args:
            args += [flag, ""]
        at = args.index(flag)
        if value is None:
            del args[at : at + 2]
        else:
            args[at + 1] = value
    assert main.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("planaria: error: ") and message in err
    assert err.count("\n") == 1


def test_every_missing_required_option_is_named_in_one_usage_error(
    profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main.main(["plan", "--nodes", "5", "--micro-batch", "2"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    usage = " ".join(line.strip() for line in err.splitlines() if "error:" not in line)
    assert usage.startswith("usage: planaria plan [-h] --profile FILE --nodes N --gpus-per-node M")
    errors = [line for line in err.splitlines() if "error:" in line]
    assert errors == [
        "planaria plan: error: the following arguments are required: --profile, "
        "--gpus-per-node, --fault-tolerance, --global-batch"
    ]


def test_the_console_script_exits_2_without_a_traceback(profile_path: Path) -> None:
    args = _args(profile_path, "--failed", "9")[1:]
    result = subprocess.run([PLANARIA, "plan", *args], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr == "planaria: error: --failed: node 9 is not in 0..4\n"
    assert "Traceback" not in result.stderr


def test_every_plan_option_is_documented() -> None:
    docs = "".join(
        (ROOT / "docs" / name).read_text("utf-8") for name in ("planner.md", "policy.md")
    )
    parser = main.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    options = [o for a in subparsers.choices["plan"]._actions for o in a.option_strings]
    assert "--redundancy" in options
    for option in options:
        if option not in ("-h", "--help"):
            assert f"`{option}" in docs, option
