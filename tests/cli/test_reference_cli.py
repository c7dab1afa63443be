"""`planaria reference` (planaria.cli.reference).

Covers: training on a named corpus prints a header, one line per --log-every steps (and the last
step) with step, loss and samples/s, and a summary with the loss change; the default corpus
(standard library) is used without --corpus; --reduction exact and --precision bf16 train too and
another value of either is refused by the parser; bad input (unknown model, missing or empty
corpus, a global batch the micro-batch does not divide, out-of-range numbers) is one line on stderr
with exit status 2; building the command parser does not import torch.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from planaria.cli import main

FAST = ["--steps", "5", "--global-batch", "4", "--micro-batch", "2", "--log-every", "2"]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    text = "".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(400))
    (tmp_path / "code.py").write_text(text)
    return tmp_path


def test_training_prints_steps_and_a_summary(
    corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main.main(["reference", "--corpus", str(corpus), *FAST, "--seed", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("training tiny (236,928 parameters) on ")
    assert [line.split()[1] for line in lines[1:-1]] == ["2", "4", "5"]
    for line in lines[1:-1]:
        assert re.fullmatch(r"step +\d+  loss \d+\.\d{4}  samples/s +\d+\.\d", line), line
    assert re.fullmatch(r"done: 5 steps in .* loss 5\.\d+ -> \d\.\d+ \(-\d+\.\d%\)", lines[-1])


def test_without_a_corpus_it_trains_on_the_standard_library(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["reference", "--max-corpus-bytes", "20000", "--steps", "1", "--global-batch", "2"]
    assert main.main([*args, "--micro-batch", "1"]) == 0
    assert "on 20,000 bytes (312 samples of 64 tokens)" in capsys.readouterr().out


def test_exact_reduction_trains_and_an_unknown_one_is_refused(
    corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main.main(["reference", "--corpus", str(corpus), *FAST, "--reduction", "exact"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("done: 5 steps")
    with pytest.raises(SystemExit) as exited:
        main.main(["reference", "--reduction", "float64"])
    assert exited.value.code == 2
    assert "argument --reduction: invalid choice: 'float64'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "nope"], "unknown model 'nope'; choose one of: "),
        (["--corpus", "MISSING"], "corpus path '.*MISSING' does not exist"),
        (["--corpus", "EMPTY"], "corpus '.*EMPTY' is empty"),
        (["--global-batch", "6", "--micro-batch", "4"], "--global-batch 6 is not a multiple of"),
        (["--steps", "0"], "--steps must be >= 1 \\(got 0\\)"),
        (["--lr", "-1"], "--lr must be > 0"),
        (["--max-corpus-bytes", "0"], "--max-corpus-bytes must be >= 1"),
        (["--seed", "-2"], "--seed must be >= 0"),
    ],
    ids=[
        "an unknown model",
        "a missing corpus",
        "an empty corpus",
        "a batch the micro-batch does not divide",
        "no steps",
        "a negative learning rate",
        "a zero byte cap",
        "a negative seed",
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    (tmp_path / "EMPTY").mkdir()
    args = [str(tmp_path / a) if a in ("MISSING", "EMPTY") else a for a in args]
    assert main.main(["reference", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    error = captured.err.rstrip("\n")
    assert "\n" not in error
    assert re.match(rf"planaria: error: {message}", error), error


def test_the_command_parser_does_not_import_torch() -> None:
    code = (
        "import sys; from planaria.cli import main; main.build_parser(); "
        "print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


def test_bf16_trains_and_fp16_is_refused(corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main.main(["reference", "--corpus", str(corpus), *FAST, "--precision", "bf16"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("done: 5 steps")
    with pytest.raises(SystemExit) as exited:
        main.main(["reference", "--precision", "fp16"])
    assert exited.value.code == 2
    assert "argument --precision: invalid choice: 'fp16'" in capsys.readouterr().err
