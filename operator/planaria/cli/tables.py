"""Text tables of the command line (`planaria plan`, `planaria profile`), drawn by rich.

`render` lays out a header and rows of already formatted cells as one plain-text block: a
header, a rule under it, columns two spaces apart, numeric columns right-aligned, no colour
or control codes, so the text reads the same on a terminal, in a pipe, in a file and in a
test's captured output. Cells are taken literally (`rich.text.Text`), never as rich markup: a
layout such as `[0,34)x4` or `[7, 7, 6]` must print as written.

What does not live here: the live progress panel (`planaria.cli.progress` draws it with rich
directly), the cells' formatting (each command formats its units), tables the planner renders
as text for reasons (`planaria.planner.policy`).
"""

from __future__ import annotations

import io
from collections.abc import Collection, Sequence

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

# Wide enough that no row is ever wrapped or cut: a terminal narrower than a row wraps it
# itself, as it did with the hand-aligned text these tables replace.
_WIDTH = 10_000


def render(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    right: Collection[int] = (),
    indent: str = "",
) -> list[str]:
    """The lines of a table of `header` over `rows` (each as long as `header`), the columns
    whose index is in `right` right-aligned, every line prefixed by `indent`, trailing spaces
    removed. Raises ValueError when a row's length differs from the header's."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    for index, name in enumerate(header):
        table.add_column(Text(name), justify="right" if index in right else "left")
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"a table row has {len(row)} cells for {len(header)} columns")
        table.add_row(*map(Text, row))
    out = io.StringIO()
    Console(file=out, width=_WIDTH, color_system=None, force_terminal=False).print(table)
    return [f"{indent}{line}".rstrip() for line in out.getvalue().splitlines()]
