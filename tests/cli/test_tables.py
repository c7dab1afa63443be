"""Text tables of the command line (planaria.cli.tables).

Covers: a header, a rule under it and the rows, columns two spaces apart, right-aligned where
asked; cells print literally (rich markup and brackets untouched); no colour or control codes
and no trailing spaces, whatever stdout is; the indent prefixes every line; a row of the wrong
length is refused.
"""

from __future__ import annotations

import pytest

from planaria.cli import tables


def test_a_table_is_a_header_a_rule_and_aligned_rows() -> None:
    lines = tables.render(("name", "count"), [("a", "1"), ("longer", "100")], right={1})
    assert lines == [
        "name    count",
        "─────────────",
        "a           1",
        "longer    100",
    ]


def test_cells_print_literally_without_control_codes_or_trailing_spaces() -> None:
    lines = tables.render(("layout", "x"), [("[bold]x[/bold] [0,34)x4", "")], indent="  ")
    assert lines[2] == "  [bold]x[/bold] [0,34)x4"
    assert all(line.startswith("  ") and line == line.rstrip() for line in lines)
    assert not any("\x1b" in line for line in lines)


def test_a_row_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError, match="a table row has 1 cells for 2 columns"):
        tables.render(("a", "b"), [("only",)])
