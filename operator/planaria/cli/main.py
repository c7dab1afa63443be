"""Entry point of the `planaria` command; see the package docstring for how commands plug in.

Every command's help gets the shared formatter (defaults shown) and its examples as epilog
(`helptext`), so that no command module repeats them.

Errors: a missing or malformed option is argparse's usage error (every missing required option
in one line, exit status 2); any `ValueError` raised by a command (our user-input errors and
pydantic's ValidationError subclass it) is printed as `planaria: error: ...` with exit status 2;
the full traceback is shown only with `--debug` or PLANARIA_DEBUG=1.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

import pydantic

from planaria.cli import (
    agent,
    export,
    helptext,
    operator,
    plan,
    profile,
    reference,
    run,
    simulate,
    version,
)

# The command modules, in the order `planaria --help` lists them.
COMMANDS: tuple[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None], ...] = (
    version.register,
    profile.register,
    reference.register,
    plan.register,
    simulate.register,
    run.register,
    export.register,
    agent.register,
    operator.register,
)

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="planaria",
        description="Resilient pipeline + data parallel training: plan, profile, run, operate.",
        epilog="`planaria COMMAND --help` shows a command's options, defaults and an example.",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show full tracebacks instead of one-line errors"
    )
    version.add_flag(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in COMMANDS:
        register(subparsers)
    for name, command in subparsers.choices.items():
        command.formatter_class = helptext.Formatter
        command.epilog = helptext.epilog(name)
    return parser


def format_error(exc: ValueError) -> str:
    """One line per problem; pydantic errors name the field path (`spec.workers: ...`)."""
    if isinstance(exc, pydantic.ValidationError):
        problems = []
        for error in exc.errors():
            path = ".".join(str(part) for part in error["loc"]) or "(top level)"
            problems.append(f"{path}: {error['msg']}")
        return "; ".join(problems)
    return str(exc)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = bool(args.debug) or os.environ.get("PLANARIA_DEBUG") == "1"
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except ValueError as exc:
        if debug:
            raise
        print(f"planaria: error: {format_error(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("planaria: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`planaria ... | head`): not an error of ours. Point stdout at
        # devnull so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
