"""What every command shares: loading settings, printing JSON or tables, progress, errors.

Heavy modules (pydantic, rich tables, Google clients) are imported inside the functions
that need them, so that ``tpuops --help`` stays instant. Commands reach the library only
through ``tpuops.api``; turning ``--config`` into ``Settings`` here is the one other door
(tests/test_cli_front_door.py).
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


def load_settings(ctx: typer.Context) -> Settings:
    """Settings for this invocation: the global ``--config``, else the nearest ``tpuops.toml``, and the environment."""
    from tpuops import api

    state = ctx.find_root().obj
    config_path = state.config_path if isinstance(state, CliState) else None
    return api.reachable_store(api.load_settings(config_path),
                               lambda line: err_console().print(f"tpuops: {line}", markup=False, soft_wrap=True))


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

    rich lays out every cell on its own, most of ``tpuops status``'s time at 200 runs; when no cell
    would wrap (every cell one line, the widest row within the console), each column is handed over
    as one multi-line cell instead, which prints the same characters in a third of the time. Such a
    cell also skips rich's wrapping (``overflow="ignore"``): no line of it can be too wide, and the
    table pads each line to the column's width itself, so the characters stay the same, in two
    thirds of the time again.
    """
    from rich.cells import cell_len
    from rich.table import Table
    from rich.text import Text

    console = out_console()
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    cells = [["" if cell is None else str(cell) for cell in row] for row in rows]
    by_column = [list(column) for column in zip(*cells, strict=False)]
    widths = [max(map(cell_len, (name, *column))) for name, column in zip(columns, by_column, strict=False)]
    plain = all(len(row) == len(columns) and not any("\n" in cell for cell in row) for row in cells)
    if cells and plain and sum(widths) + 3 * len(columns) + 1 <= console.width:
        table.add_row(*(Text("\n".join(column), overflow="ignore") for column in by_column))
    else:
        for row in cells:
            table.add_row(*(Text(cell) for cell in row))
    console.print(table)


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
