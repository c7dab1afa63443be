"""`planaria version`: the installed version of the distribution."""

from __future__ import annotations

import argparse
import importlib.metadata


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("version", help="print the installed Planaria version")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    print(importlib.metadata.version("planaria"))
    return 0
