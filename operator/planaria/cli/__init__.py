"""The `planaria` command: the one composition root.

`main` builds the argument parser from the command modules and maps user errors to one line on
stderr and exit status 2. Each `cli/<command>.py` module exposes `register(subparsers)` which adds
its sub-parser and sets `handler`, a function `(argparse.Namespace) -> int`; `main` then gives
every sub-parser the shared help formatter and its examples from `helptext.EXAMPLES`.
"""
