"""The `planaria` command's help and version (planaria.cli.main, helptext, version).

Covers: `planaria --version` prints the installed version (importlib.metadata) and exits 0, in
process and from the console script, and says the same as `planaria version`; every command's
help ends with an example, each example is a command line the real parser accepts, and the
examples are kept on one line however narrow the help; `agent` and `operator` show their
defaults (and no option shows a default of None or False); `plan` and `profile` show their
required options as required in the usage.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from planaria.cli import helptext, main

PLANARIA = str(Path(sys.executable).parent / "planaria")


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = main.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(subparsers.choices)


def test_version_flag_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main.main(["--version"])
    assert exited.value.code == 0
    printed = capsys.readouterr().out
    assert printed == importlib.metadata.version("planaria") + "\n"
    assert main.main(["version"]) == 0
    assert capsys.readouterr().out == printed


def test_the_console_script_answers_version() -> None:
    done = subprocess.run([PLANARIA, "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.strip() == importlib.metadata.version("planaria")


def test_every_command_has_examples_the_parser_accepts() -> None:
    commands = _commands()
    assert set(helptext.EXAMPLES) == set(commands)
    for name, command in commands.items():
        assert command.epilog is not None and command.epilog.startswith("example"), name
        for example in helptext.EXAMPLES[name]:
            words = shlex.split(example)
            assert words[:2] == ["planaria", name], example
            args = main.build_parser().parse_args(words[1:])
            assert args.command == name, example


@pytest.mark.parametrize("name", sorted(helptext.EXAMPLES))
def test_the_help_of_every_command_ends_with_its_examples_unwrapped(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "60")  # argparse wraps help to the terminal's width
    text = _commands()[name].format_help()
    examples = [f"  {example}" for example in helptext.EXAMPLES[name]]
    assert text.rstrip("\n").splitlines()[-len(examples) :] == examples


@pytest.mark.parametrize(
    ("name", "defaults"),
    [
        (
            "agent",
            [
                "(default: 127.0.0.1:0)",
                "(default: /dev/shm/planaria)",
                "(default: cpu)",
                "(default: 1)",
                "(default: 5.0)",
            ],
        ),
        ("operator", ["(default: 29500)", "(default: 8080)", "(default: 9090)", "(default: 5.0)"]),
    ],
)
def test_agent_and_operator_show_their_defaults(
    name: str, defaults: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    text = _commands()[name].format_help()
    for default in defaults:
        assert default in text, default
    for shown in ("(default: None)", "(default: False)", "(default: )"):
        assert shown not in text


def test_no_command_shows_a_default_twice_or_a_default_of_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    for name, command in _commands().items():
        for line in command.format_help().splitlines():
            assert line.count("default") <= 1, (name, line)
            assert "(default: None)" not in line and "(default: False)" not in line, name


@pytest.mark.parametrize(
    ("name", "required"),
    [
        (
            "plan",
            "--profile FILE --nodes N --gpus-per-node M --fault-tolerance F --global-batch B "
            "--micro-batch b [",
        ),
        ("profile", "--synthetic MODEL --accelerator NAME --micro-batch B --out FILE ["),
    ],
)
def test_required_options_are_required_in_the_usage(
    name: str, required: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    usage = " ".join(_commands()[name].format_usage().split())
    assert required in usage


def _shape(parser: argparse.ArgumentParser) -> list[tuple[object, ...]]:
    return [
        (a.option_strings, a.dest, a.default, a.required, a.nargs, a.choices, a.help)
        for a in parser._actions
    ]


def test_a_command_named_first_gets_the_same_parser_alone() -> None:
    commands = _commands()
    assert tuple(commands) == main.COMMANDS
    for name in main.COMMANDS:
        alone = main.build_parser(name)
        subparsers = next(a for a in alone._actions if isinstance(a, argparse._SubParsersAction))
        assert list(subparsers.choices) == [name]
        assert _shape(subparsers.choices[name]) == _shape(commands[name]), name
        assert subparsers.choices[name].epilog == commands[name].epilog


def test_the_agent_command_loads_neither_the_planner_nor_the_controller() -> None:
    # Started once per worker: what it imports is paid on every start and restart.
    code = (
        "import sys; from planaria.cli import main; main.build_parser('agent'); "
        "print(sorted(m for m in sys.modules if m.startswith(('planaria.planner', "
        "'planaria.control', 'planaria.sim', 'torch', 'pydantic'))))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "[]", result.stderr or result.stdout


@pytest.mark.parametrize(("given", "kept"), [(None, "ERROR"), ("INFO", "INFO")])
def test_grpc_info_logs_are_off_unless_the_user_asks(given: str | None, kept: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    if given is not None:
        env["GRPC_VERBOSITY"] = given
    code = "import os; from planaria.cli import main; print(os.environ['GRPC_VERBOSITY'])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.stdout.strip() == kept, result.stderr
