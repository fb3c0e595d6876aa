"""``print_table`` prints what rich prints row by row, whichever way it lays the table out.

A table whose cells all fit on one line has its rows spliced into the frame rich lays out around two rows of
each column's widest cell (a tenth of the time at 200 rows, ``bench/bench_cli.py``); these tests hold its
output to the row-by-row rendering, character for character, show that the splice is what printed it, and
that a table that would wrap, or a cell rich would rewrite (a tab, a control character), is rich's own.
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tpuops.cli.common import _fitted, print_table

pytestmark = pytest.mark.unit

COLUMNS = ("run", "phase", "step", "heartbeat")


def _row_by_row(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]], width: int, *,
                terminal: bool = False) -> str:
    console = Console(file=io.StringIO(), highlight=False, width=width, force_terminal=terminal or None)
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    console.print(table)
    return console.file.getvalue()


def _printed(capsys: pytest.CaptureFixture[str], rows: list[tuple[str, ...]]) -> str:
    print_table("active runs", COLUMNS, rows)
    return capsys.readouterr().out


def test_a_table_that_fits_prints_as_rich_prints_it_row_by_row(capsys: pytest.CaptureFixture[str]) -> None:
    rows = [(f"run-{i:04d}", "training" if i % 3 else "", f"{i}/100", "[bold]2026-01-01T00:00:00+00:00")
            for i in range(200)]
    printed = _printed(capsys, rows)
    assert printed == _row_by_row("active runs", COLUMNS, rows, 200)
    assert printed.count("run-") == 200 and "[bold]" in printed


def test_a_table_that_would_wrap_wraps_each_row_on_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    rows = [("run-0001", "a long phase " * 30, "1/100", "now"), ("run-0002", "short", "2/100", "now")]
    printed = _printed(capsys, rows)
    assert printed == _row_by_row("active runs", COLUMNS, rows, 200)
    second = next(line for line in printed.splitlines() if "run-0002" in line)
    assert "short" in second and "2/100" in second


def test_a_cell_of_several_lines_keeps_its_row_together(capsys: pytest.CaptureFixture[str]) -> None:
    rows = [("run-0001", "line one\nline two", "1/100", "now"), ("run-0002", "ok", "2/100", "later")]
    printed = _printed(capsys, rows)
    assert printed == _row_by_row("active runs", COLUMNS, rows, 200)
    assert next(line for line in printed.splitlines() if "run-0002" in line).count("later") == 1


def test_a_terminal_gets_the_same_styled_table(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal the header is bold: the fast layout styles every character as rich's row by row does."""
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "120")
    rows = [(f"run-{i:04d}", "training" if i % 3 else "", f"{i}/100", "now") for i in range(50)]
    printed = _printed(capsys, rows)
    assert printed == _row_by_row("active runs", COLUMNS, rows, 120, terminal=True)
    assert "\x1b[1m" in printed and printed.count("run-") == 50


@pytest.mark.parametrize("rows", [
    [("run-0001", "training", "1/100", "now")],
    [("run-0001", "", "", ""), ("r2", "a phase", "", "later")],
    [(f"運行-{i}", "学習中" if i % 2 else "", f"{i}/100", "now 🚀") for i in range(20)],
], ids=["one row", "empty cells", "wide characters"])
def test_the_rows_are_spliced_into_richs_frame_as_rich_would_print_them(rows: list[tuple[str, ...]]) -> None:
    console = Console(file=io.StringIO(), highlight=False, width=200)
    fitted = _fitted(console, "active runs", COLUMNS, [list(row) for row in rows])
    assert fitted is not None
    assert fitted == _row_by_row("active runs", COLUMNS, rows, 200)


@pytest.mark.parametrize("odd", ["a\ttab", "a\x1b[31mred", "zero\u200bwidth"])
def test_a_cell_rich_would_rewrite_is_printed_by_rich(capsys: pytest.CaptureFixture[str], odd: str) -> None:
    rows = [("run-0001", odd, "1/100", "now"), ("run-0002", "ok", "2/100", "later")]
    assert _printed(capsys, rows) == _row_by_row("active runs", COLUMNS, rows, 200)
