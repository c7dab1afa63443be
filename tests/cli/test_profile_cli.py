"""`planaria profile` (planaria.cli.profile), through `planaria.cli.main.main` and the console
script.

Covers: --synthetic writes the same profile `synthesize` returns, with its assumptions, and prints
a summary table and the path; --gpus-per-node defaults to the accelerator's node; --check accepts
a valid file and reports a bad one; --model measures this machine with the agent's profiler;
--precision makes a measured and a synthetic profile for that precision (fp32 and bf16 by
default), and fp16 is a usage error;
every bad input (unknown model or accelerator, bad numbers, misplaced options, bad files) is
one line on stderr with exit status 2 and no traceback, also from a real subprocess; the options
a mode requires are shown as required in the usage and every missing one is named in one argparse
error, exit status 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from planaria.cli import main, profile
from planaria.contract import shapes
from planaria.planner import accelerators, synthetic
from planaria.spec import profile_file

PLANARIA = str(Path(sys.executable).parent / "planaria")


def _synthetic_args(out: Path, *extra: str) -> list[str]:
    return ["profile", "--synthetic", "tiny", "--accelerator", "a100-80gb", "--out", str(out)] + [
        "--micro-batch",
        "2",
        *extra,
    ]


def test_synthetic_writes_what_synthesize_computes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tiny.json"
    assert main.main(_synthetic_args(out, "--gpus-per-node", "2")) == 0
    accelerator = accelerators.named("a100-80gb")
    expected = synthetic.synthesize(shapes.named("tiny"), accelerator, 2, 2)
    written = profile_file.read_profile_file(out)
    assert written.profile == expected
    assert written.assumptions == synthetic.assumptions(accelerator, 2)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("layers") and "fwd 2 GPUs" in printed[0]
    assert printed[3].startswith("block.0 .. block.3") and printed[3].split()[3] == "4"
    assert printed[5].startswith("total") and printed[5].split()[1] == "6"
    assert "synthetic bf16 profile of tiny" in printed[6]
    assert printed[-1] == f"wrote {out}"


def test_gpus_per_node_defaults_to_the_accelerators_node(tmp_path: Path) -> None:
    out = tmp_path / "v100.json"
    args = ["profile", "--synthetic", "gpt2", "--accelerator", "v100-16gb", "--micro-batch", "1"]
    assert main.main([*args, "--out", str(out)]) == 0
    assert profile_file.load_profile(out).max_gpus_per_stage == 4


def test_check_summarises_a_valid_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tiny.json"
    main.main(_synthetic_args(out))
    capsys.readouterr()
    assert main.main(["profile", "--check", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"{out}: a valid planaria profile (format version 1)\n")
    assert "\nassumptions: Analytic profile" in printed


def test_check_reports_a_bad_file_on_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bad.json"
    main.main(_synthetic_args(out))
    document = json.loads(out.read_text())
    document["layers"][0]["forwardS"][0] = -1.0
    out.write_text(json.dumps(document))
    capsys.readouterr()
    assert main.main(["profile", "--check", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"planaria: error: {out}: layers.0.forwardS.0: must be >= 0 (got -1.0)\n"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--synthetic", "gpt5", "--accelerator", "a100-80gb", "--micro-batch", "1"],
            "unknown model 'gpt5'; choose one of: bert-large, gpt2",
        ),
        (
            ["--synthetic", "tiny", "--accelerator", "tpu-v9", "--micro-batch", "1"],
            "unknown accelerator 'tpu-v9'; choose one of: a100-40gb, a100-80gb, a40-48gb",
        ),
        (
            ["--synthetic", "tiny", "--accelerator", "a100-80gb", "--micro-batch", "0"],
            "--micro-batch must be >= 1 (got 0)",
        ),
        (
            ["--synthetic", "tiny", "--accelerator", "a100-80gb", "--micro-batch", "two"],
            "--micro-batch must be a whole number (got 'two')",
        ),
        (
            ["--synthetic", "tiny", "--accelerator", "h100-80gb", "--micro-batch", "1"]
            + ["--gpus-per-node", "-8"],
            "--gpus-per-node must be >= 1 (got -8)",
        ),
        (
            ["--synthetic", "tiny", "--accelerator", "h100-80gb", "--micro-batch", "1"]
            + ["--repeats", "3"],
            "--repeats does not apply to --synthetic; leave it out",
        ),
        (["--check", "p.json", "--accelerator", "h100-80gb"], "--accelerator does not apply"),
        (["--check", "p.json", "--precision", "bf16"], "--precision does not apply to --check"),
        (["--check", "surely-missing.json"], "surely-missing.json: no such file; give the path"),
        (
            ["--model", "tiny", "--micro-batch", "1", "--accelerator", "a100-80gb"],
            "--accelerator does not apply to --model; leave it out",
        ),
        (["--model", "gpt5", "--micro-batch", "1"], "unknown model 'gpt5'"),
        (
            ["--model", "tiny", "--micro-batch", "1", "--warmup", "-1"],
            "--warmup must be >= 0 (got -1)",
        ),
        (["--model", "tiny", "--micro-batch", "1", "--device", "tpu"], "device 'tpu'"),
    ],
    ids=[
        "an unknown model",
        "an unknown accelerator",
        "a zero micro-batch",
        "a micro-batch in words",
        "negative GPUs per node",
        "repeats for a synthetic profile",
        "an accelerator for a check",
        "a precision for a check",
        "a missing file to check",
        "an accelerator for a measurement",
        "an unknown model to measure",
        "a negative warm-up",
        "a device torch does not know",
    ],
)
def test_a_user_error_is_one_line_with_status_2_for(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    has_out = "--check" in args
    out = [] if has_out else ["--out", str(tmp_path / "p.json")]
    assert main.main(["profile", *args, *out]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"planaria: error: {message}")
    assert captured.err.count("\n") == 1
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize(
    ("args", "missing"),
    [
        (["--synthetic", "tiny"], "--synthetic: --accelerator, --micro-batch, --out"),
        (["--synthetic", "tiny", "--micro-batch", "1"], "--synthetic: --accelerator, --out"),
        (["--model", "tiny"], "--model: --micro-batch, --out"),
        (["--model", "tiny", "--out", "p.json"], "--model: --micro-batch"),
    ],
    ids=[
        "a synthetic profile without its three options",
        "a synthetic profile without accelerator and output",
        "a measurement without micro-batch and output",
        "a measurement without micro-batch",
    ],
)
def test_every_missing_option_of_a_mode_is_one_usage_error(
    args: list[str], missing: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main.main(["profile", *args])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: planaria profile [-h] --model NAME --micro-batch B --out FILE")
    errors = [line for line in err.splitlines() if "error:" in line]
    assert errors == [
        f"planaria profile: error: the following arguments are required with {missing}"
    ]
    assert not (tmp_path / "p.json").exists()


def test_no_mode_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main.main(["profile", "--micro-batch", "1"])
    assert exited.value.code == 2
    assert "one of the arguments --model --synthetic --check is required" in capsys.readouterr().err


def test_the_console_script_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    args = ["profile", "--synthetic", "gpt2", "--accelerator", "tpu", "--micro-batch", "1"]
    result = subprocess.run(
        [PLANARIA, *args, "--out", str(out)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr.startswith("planaria: error: unknown accelerator 'tpu'")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    good = subprocess.run(
        [PLANARIA, *args[:4], "h100-80gb", *args[5:], "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert good.returncode == 0, good.stderr
    assert good.stdout.endswith(f"wrote {out}\n")
    assert profile_file.load_profile(out).accelerator == "h100-80gb"


def test_measuring_profiles_this_machine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "measured.json"
    args = ["profile", "--model", "tiny", "--micro-batch", "1", "--repeats", "1", "--warmup", "0"]
    assert main.main([*args, "--out", str(out)]) == 0
    written = profile_file.read_profile_file(out)
    assert not written.profile.synthetic
    assert written.profile.model == "tiny"
    assert written.profile.num_layers == shapes.named("tiny").num_planner_layers
    assert "0 warm-up and 1 timed runs" in written.assumptions
    assert capsys.readouterr().out.endswith(f"wrote {out}\n")


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_a_profile_is_for_the_precision_asked(precision: str, tmp_path: Path) -> None:
    measured, modelled = tmp_path / "measured.json", tmp_path / "synthetic.json"
    args = ["profile", "--model", "tiny", "--micro-batch", "1", "--repeats", "1", "--warmup", "0"]
    assert main.main([*args, "--precision", precision, "--out", str(measured)]) == 0
    assert main.main(_synthetic_args(modelled, "--precision", precision)) == 0
    for path in (measured, modelled):
        written = profile_file.read_profile_file(path)
        assert written.profile.precision == precision
        assert f"{precision}" in written.assumptions


def test_the_precision_defaults_to_fp32_measured_and_bf16_synthetic(tmp_path: Path) -> None:
    measured, modelled = tmp_path / "measured.json", tmp_path / "synthetic.json"
    args = ["profile", "--model", "tiny", "--micro-batch", "1", "--repeats", "1", "--warmup", "0"]
    assert main.main([*args, "--out", str(measured)]) == 0
    assert main.main(_synthetic_args(modelled)) == 0
    assert profile_file.load_profile(measured).precision == "fp32"
    assert profile_file.load_profile(modelled).precision == "bf16"


def test_an_unknown_precision_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["profile", "--model", "tiny", "--micro-batch", "1", "--precision", "fp16"]
    with pytest.raises(SystemExit) as exited:
        main.main([*args, "--out", "p.json"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --precision: invalid choice: 'fp16'" in err
    assert "'fp32', 'tf32', 'bf16'" in err


def test_layers_with_a_common_stem_share_a_row() -> None:
    result = synthetic.synthesize(shapes.named("small"), accelerators.named("a40-48gb"), 1, 1)
    lines = profile.summarize(result).splitlines()
    assert lines[1].strip("─") == ""  # the rule under the header
    assert [line.split()[0] for line in lines[2:6]] == ["embedding", "block.0", "head", "total"]
    assert lines[3].split()[1:4] == ["..", "block.7", "8"]
