"""`planaria version` and `planaria --version`: the installed version of the distribution.

Both print the same line, the version `importlib.metadata` reads from the installed
distribution (not a constant in the code, which could drift from pyproject.toml).
"""

from __future__ import annotations

import argparse
import importlib.metadata
from collections.abc import Sequence
from typing import Any


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("version", help="print the installed Planaria version")
    parser.set_defaults(handler=run)


def add_flag(parser: argparse.ArgumentParser) -> None:
    """`--version` on the top-level parser: print the version and exit 0, whatever follows."""
    parser.add_argument(
        "--version", action=_VersionAction, help="print the installed Planaria version and exit"
    )


def installed() -> str:
    return importlib.metadata.version("planaria")


def run(args: argparse.Namespace) -> int:
    print(installed())
    return 0


class _VersionAction(argparse.Action):
    """argparse's own "version" action wants the string when the parser is built; this one
    reads the metadata only when the flag is given, so building the parser stays cheap."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        print(installed())
        parser.exit()
