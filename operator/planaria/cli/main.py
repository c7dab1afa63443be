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
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from planaria.cli import helptext, version

# gRPC's C core logs at INFO to stderr unless told otherwise (lines such as "Got goaway ...
# Server shutdown" when an agent stops under a live channel, in the middle of a run's progress).
# Its errors still print; a user who sets GRPC_VERBOSITY keeps theirs. Set before any command
# imports grpc, and inherited by the agents `planaria run` starts.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

# The command modules (`planaria.cli.<name>`), in the order `planaria --help` lists them. Each is
# imported only when its parser is built: `planaria agent` (started once per worker, and again
# for every restarted one) then loads the agent's command alone, not the planner, the simulator
# and the controller that the other commands bring (0.5 CPU s of imports before this).
COMMANDS = (
    "version",
    "profile",
    "reference",
    "plan",
    "simulate",
    "run",
    "export",
    "agent",
    "operator",
)

EXIT_USAGE = 2


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line's parser; with `only` (a name in COMMANDS), the same parser with
    that one command, which parses that command's arguments alike."""
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
    for name in COMMANDS if only is None else (only,):
        module = importlib.import_module(f"planaria.cli.{name}")
        module.register(subparsers)
    for name, command in subparsers.choices.items():
        command.formatter_class = helptext.Formatter
        command.epilog = helptext.epilog(name)
    return parser


def format_error(exc: ValueError) -> str:
    """One line per problem; pydantic errors name the field path (`spec.workers: ...`)."""
    pydantic = sys.modules.get("pydantic")  # not imported: the error cannot be one of its
    if pydantic is not None and isinstance(exc, pydantic.ValidationError):
        problems = []
        for error in exc.errors():
            path = ".".join(str(part) for part in error["loc"]) or "(top level)"
            problems.append(f"{path}: {error['msg']}")
        return "; ".join(problems)
    return str(exc)


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    # A command named first needs only its own parser; anything else (a global flag first,
    # a misspelt command, no command) gets the whole one, which says what is wrong.
    parser = build_parser(words[0] if words and words[0] in COMMANDS else None)
    args = parser.parse_args(words)
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
