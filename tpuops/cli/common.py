"""What every command shares: loading settings, printing JSON or tables, progress, errors.

Heavy modules (pydantic, rich tables, Google clients) are imported inside the functions
that need them, so that ``tpuops --help`` stays instant. Commands reach the library only
through ``tpuops.api``; turning ``--config`` into ``Settings`` here is the one other door
(tests/cli/test_cli_front_door.py).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from tpuops.core.kinds import Capacity

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from tpuops.config import Settings


# Options that several commands share, declared once.
ACCELERATOR = typer.Option(None, help="Accelerator type, e.g. v3-8 (default: experiment spec, then config).")
SPOT = typer.Option(False, "--spot", help="Spot capacity (cheapest; may be preempted).")
PREEMPTIBLE = typer.Option(False, "--preemptible", help="Preemptible capacity (24 h at most).")
ON_DEMAND = typer.Option(False, "--on-demand", help="On-demand capacity.")
DRY_RUN = typer.Option(False, "--dry-run", help="Validate and print what would be created; call nothing.")
JSON = typer.Option(False, "--json", help="Print the result as JSON.")


def capacity_flag(spot: bool, preemptible: bool, on_demand: bool) -> Capacity | None:
    """The capacity the flags ``--spot``, ``--preemptible``, ``--on-demand`` chose (at most one), if any."""
    chosen = [c for c, flag in ((Capacity.SPOT, spot), (Capacity.PREEMPTIBLE, preemptible),
                                (Capacity.ON_DEMAND, on_demand)) if flag]
    if len(chosen) > 1:
        raise typer.BadParameter("choose one of --spot, --preemptible, --on-demand")
    return chosen[0] if chosen else None


def _run_id(value: str | None) -> str | None:
    """A run id flag checked as it is parsed (an empty ``--resume ''`` is not "no flag")."""
    from tpuops.core.naming import check_node_name

    return None if value is None else check_node_name(value, "run id")


def folder_to_write(value: str, what: str) -> Path:
    """The folder a command writes into, as typed; an empty one is refused.

    ``Path("")`` is ``Path(".")``: without this check an empty argument (a shell variable that was
    not set) would quietly write into the current folder.
    """
    from tpuops.core.errors import UsageError

    if not value:
        raise UsageError(f"{what} is empty: name the folder to write, e.g. data/digits (or '.' for this folder)")
    return Path(value)


RESUME = typer.Option(None, "--resume", callback=_run_id, help="Drive this run again from its last checkpoint.")


@dataclass
class CliState:
    config_path: Path | None = None


def err_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def out_console() -> Console:
    """stdout; wide when it is not a terminal, so piped tables are not cut at 80 columns."""
    from rich.console import Console

    console = Console(highlight=False)
    return console if console.is_terminal else Console(highlight=False, width=200)


def load_settings(ctx: typer.Context, *, starts: bool = False) -> Settings:
    """Settings for this invocation: the global ``--config``, else the nearest ``tpuops.toml``, and the environment.

    ``starts``: the command starts new spending or exists to use a notify target (``train``, ``infer``, ``up``,
    ``sweep start``, ``notify test``): a target's malformed URL refuses it in one line (exit 2). Any other command
    goes on with that target held back and says so on stderr (``tpuops.config.load_settings``)."""
    from tpuops import api

    state = ctx.find_root().obj
    config_path = state.config_path if isinstance(state, CliState) else None
    return api.reachable_store(api.load_settings(config_path, starts=starts, warn=warn), warn)


def warn(line: str) -> None:
    """One line on stderr, prefixed ``tpuops:``, as it is (never markup)."""
    err_console().print(f"tpuops: {line}", markup=False, soft_wrap=True)


def print_json(data: Any) -> None:
    """Strict JSON on stdout, whatever a run reported: a NaN or an infinity (a diverged run's metrics) is
    printed as null and named in its object's ``non_finite`` list (``formats.strict_json``, docs/cli.md)."""
    from tpuops.core.formats import strict_json

    sys.stdout.write(json.dumps(strict_json(data), indent=2, sort_keys=True, default=str, allow_nan=False) + "\n")


def confirm(question: str) -> bool:
    """Ask on stderr (stdout may be JSON); anything but yes, or no answer at all (EOF), is a no.

    Declining is not an error: the caller says what it did not do and exits 0. Ctrl-C stays an interrupt.
    """
    err_console().print(f"{question} [y/N]: ", end="", markup=False)
    answer = sys.stdin.readline()
    if not answer:
        err_console().print()
    return answer.strip().lower() in ("y", "yes")


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Cells are plain text, never markup: a ``[`` in a name prints as it is, and 200 rows are not parsed.

    rich lays out every cell of every row on its own: at 200 runs that was most of ``tpuops status``'s own
    time. A table that fits is spliced into the frame rich lays out around two rows instead (``_fitted``).
    """
    console = out_console()
    cells = [["" if cell is None else str(cell) for cell in row] for row in rows]
    fitted = _fitted(console, title, columns, cells)
    if fitted is not None:
        console.file.write(fitted)
        return
    console.print(_table(title, columns, cells))


def _fitted(console: Console, title: str, columns: Sequence[str], cells: list[list[str]]) -> str | None:
    """The table as ``console`` prints it, when every cell is one printable line and the widest row fits (so
    nothing wraps): rich lays out only the frame (title, header, borders) around two rows of each column's widest
    cell, and the rows are spliced in where those two are, padded to the same widths between the same borders
    (``_splice``). None for any other table, and whenever those two rows do not read as rich printed them."""
    from rich.cells import cell_len

    if console.legacy_windows or console.is_jupyter:  # consoles that do not just write text to their file
        return None
    if not cells or not all(len(row) == len(columns) and all(map(str.isprintable, row)) for row in cells):
        return None
    by_column = list(zip(*cells, strict=True))
    widths = [max(map(cell_len, (name, *column))) for name, column in zip(columns, by_column, strict=True)]
    if sum(widths) + 3 * len(columns) + 1 > console.width:
        return None
    widest = [max(column, key=cell_len) for column in by_column]
    frame = _table(title, columns, [widest, widest])
    with console.capture() as captured:
        console.print(frame)
    return _splice(captured.get(), frame, widest, cells, widths)


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    """The one look of every table: a left-aligned title over rich's default box, each cell plain text."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    return table


def _splice(printed: str, frame: Table, widest: list[str], rows: list[list[str]], widths: list[int]) -> str | None:
    """``printed`` (rich's frame, whose two rows are ``widest``) with ``rows`` in their place: a middle row between
    the middle borders, the last between the foot's, as rich draws them; None unless rich drew ``widest`` so."""
    from rich.cells import cell_len

    box = frame.box
    if box is None:
        return None

    def line(row: list[str], left: str, vertical: str, right: str) -> str:
        padded = (f" {cell}{' ' * (width - cell_len(cell))} " for cell, width in zip(row, widths, strict=True))
        return f"{left}{vertical.join(padded)}{right}\n"

    def middle(row: list[str]) -> str:
        return line(row, box.mid_left, box.mid_vertical, box.mid_right)

    def last(row: list[str]) -> str:
        return line(row, box.foot_left, box.foot_vertical, box.foot_right)

    head, found, tail = printed.partition(middle(widest) + last(widest))
    if not found:
        return None
    return head + "".join(map(middle, rows[:-1])) + last(rows[-1]) + tail


@contextmanager
def progress(initial: str, *, quiet: bool = False) -> Iterator[Callable[[str], None]]:
    """A spinner on a terminal; plain lines on stderr otherwise (CI logs, pipes)."""
    console = err_console()
    if quiet:
        yield lambda _text: None
        return
    if console.is_terminal:
        with console.status(initial) as status:
            yield status.update
        return
    last = [""]

    def line(text: str) -> None:
        if text != last[0]:
            last[0] = text
            console.print(text)

    line(initial)
    yield line


def human_age(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def say_damaged(found: list[Any]) -> None:
    """One line on stderr per damaged run: what is wrong, and the commands that deal with it."""
    for run in found:
        if run.damage:
            err_console().print(f"{run.run_id}: {run.damage_note()}", markup=False, soft_wrap=True)
