"""`planaria plan --failed ... --explain --mtbf S` (planaria.cli.plan_explain, via cli.plan).

Covers: the text report ends with the recovery policy's reason (the choice, eq. 8's numbers, the
ranking with rerouting and the reinstantiations as given candidates, the window); a short MTBF
keeps rerouting and a long one re-plans (a profile where that differs), and so do a few
--steps-left against many; --json gains a
`recoveryPolicy` member with the documented fields, consistent with the planner; without
--explain the output has no policy part; bad --explain/--mtbf combinations are one line on
stderr with exit status 2 and no traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planaria.cli import main


def _args(path: Path, *extra: str) -> list[str]:
    base = ["plan", "--profile", str(path), "--nodes", "5", "--gpus-per-node", "2"]
    return [*base, "--fault-tolerance", "1", "--global-batch", "64", "--micro-batch", "2", *extra]


def test_explain_appends_the_policy_reason(
    profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main.main(_args(profile_path, "--failed", "1", "--explain", "--mtbf", "3600")) == 0
    out = capsys.readouterr().out
    report, _, explained = out.partition("recovery policy (Odyssey eq. 8), next failure in 3600 s:")
    assert "after nodes 1 fail (Oobleck §5.1):" in report
    lines = explained.strip().splitlines()
    assert lines[0].startswith("chose ")
    assert "eq. 8: 64 samples /" in explained
    assert "reroute pipeline" in explained and "given 0:" in explained
    assert "#1 stays the best at least for a time to the next failure from" in explained


def test_the_choice_depends_on_the_time_to_the_next_failure(
    profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chosen = []
    for mtbf in ("1ms", "100000h"):
        argv = _args(profile_path, "--failed", "2", "--explain", "--mtbf", mtbf, "--json")
        assert main.main(argv) == 0
        chosen.append(json.loads(capsys.readouterr().out)["recoveryPolicy"]["choice"]["kind"])
    assert chosen[0] == "reroute"
    assert chosen[1] != "reroute"


def test_json_gains_a_documented_recovery_policy_member(
    profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _args(profile_path, "--failed", "0,4", "--explain", "--mtbf", "600", "--json")
    assert main.main(argv) == 0
    document = json.loads(capsys.readouterr().out)
    member = document["recoveryPolicy"]
    assert set(member) == {
        "timeToFailureS",
        "stepsLeft",
        "choice",
        "ranked",
        "breakEvenS",
        "window",
        "rejected",
        "plan",
    }
    assert member["timeToFailureS"] == 600.0
    assert member["stepsLeft"] is None
    top = member["ranked"][0]
    assert set(top) == {
        "kind",
        "label",
        "stepS",
        "transitionS",
        "movedBytes",
        "peakBytes",
        "samplesPerS",
        "wholePlanEstimate",
    }
    assert (top["kind"], top["label"]) == (member["choice"]["kind"], member["choice"]["label"])
    assert top["wholePlanEstimate"] is True
    assert top["samplesPerS"] == pytest.approx(64 / top["stepS"] * (600 - top["transitionS"]) / 600)
    assert set(member["window"]) == {"fromS", "untilS"}
    assert set(member["plan"]) == {"pipelines", "reroutes", "transfers", "restores"}
    micro_batches = sum(p["microBatches"] for p in member["plan"]["pipelines"])
    assert micro_batches * 2 == 64
    dead = {0, 1, 8, 9}  # nodes 0 and 4 with 2 GPUs each
    used = {w for p in member["plan"]["pipelines"] for s in p["stages"] for w in s["workers"]}
    assert not used & dead


def test_a_few_steps_left_keep_rerouting_where_a_long_job_replans(
    profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chosen = {}
    for left in ("1", "100000000"):
        argv = _args(profile_path, "--failed", "2", "--explain", "--mtbf", "1h")
        assert main.main([*argv, "--steps-left", left, "--json"]) == 0
        chosen[left] = json.loads(capsys.readouterr().out)["recoveryPolicy"]
    assert chosen["1"]["choice"]["kind"] == "reroute" and chosen["1"]["stepsLeft"] == 1
    assert chosen["100000000"]["choice"]["kind"] != "reroute"
    assert chosen["100000000"]["stepsLeft"] is None  # the next failure comes first
    argv = _args(profile_path, "--failed", "2", "--explain", "--mtbf", "1h")
    assert main.main([*argv, "--steps-left", "1"]) == 0
    assert "eq. 8 over the job's last 1 step(s)" in capsys.readouterr().out


def test_without_explain_there_is_no_policy_part(
    profile_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main.main(_args(profile_path, "--failed", "1")) == 0
    assert "recovery policy" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "complaint"),
    [
        (("--explain", "--mtbf", "60"), "give --failed too"),
        (("--failed", "1", "--explain"), "--explain needs --mtbf DURATION"),
        (("--failed", "1", "--mtbf", "60"), "--mtbf is used only with --explain"),
        (("--failed", "1", "--explain", "--mtbf", "soon"), "--mtbf must be a duration"),
        (("--failed", "1", "--explain", "--mtbf", "-3"), "--mtbf must be a duration"),
        (("--failed", "1", "--explain", "--mtbf", "inf"), "--mtbf must be a duration"),
        (("--failed", "1", "--explain", "--mtbf", "0s"), "--mtbf must be > 0 seconds"),
        (("--failed", "1", "--steps-left", "3"), "--steps-left is used only with --explain"),
        (("--failed", "1", "--explain", "--mtbf", "1h", "--steps-left", "0"), "must be >= 1"),
        (("--failed", "1", "--explain", "--mtbf", "1h", "--steps-left", "x"), "a whole number"),
    ],
    ids=[
        "explain without failed nodes",
        "explain without an mtbf",
        "an mtbf without explain",
        "an mtbf that is not a number",
        "a negative mtbf",
        "an infinite mtbf",
        "a zero mtbf",
        "steps left without explain",
        "zero steps left",
        "steps left that are not a number",
    ],
)
def test_bad_explain_options_are_one_line_errors(
    profile_path: Path, capsys: pytest.CaptureFixture[str], extra: tuple[str, ...], complaint: str
) -> None:
    assert main.main(_args(profile_path, *extra)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("planaria: error: ") and complaint in captured.err
    assert len(captured.err.strip().splitlines()) == 1
