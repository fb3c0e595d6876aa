"""How a forecast prints (``train --dry-run``, ``sweep start --dry-run``): one row per capacity policy, on stderr,
so that the dry run's JSON on stdout stays one document."""

from __future__ import annotations

from typing import Any

from tpuops.cli.common import err_console
from tpuops.core.formats import format_usd


def _band(band: dict[str, float] | None, show: Any) -> str:
    return "" if band is None else " / ".join(show(band[key]) for key in ("p10", "p50", "p90"))


def print_forecast(forecast: dict[str, Any], what: str) -> None:
    """The forecast's table and what it assumed."""
    from rich.table import Table

    table = Table(title=f"forecast of {what} (simulated, p10 / p50 / p90)", title_justify="left")
    for column in ("policy", "simulated", "finished", "cost", "hours to result", "preemptions"):
        table.add_column(column)
    for row in forecast["policies"]:
        table.add_row(row["policy"], str(row["simulated"]), str(row["finished"]), _band(row["usd"], format_usd),
                      _band(row["hours"], lambda h: f"{h:,.2f}"), f"{row['expected_preemptions']:.2f}")
    console = err_console()
    console.print(table)
    for row in forecast["policies"]:
        if row["cut_short_by_time"]:
            console.print(f"  {row['policy']}: cut short by time (this machine, not the model, limited it: "
                          "fewer may show finished)", markup=False, soft_wrap=True)
    for key, value in forecast["assumptions"].items():
        console.print(f"  {key}: {_assumption(value)}", markup=False, soft_wrap=True)


def _assumption(value: Any) -> str:
    """A planning input (``tpuops.launch.planning``) as its value and where it came from; anything else as it is."""
    if isinstance(value, dict) and "source" in value:
        return f"{value['value']:.4g} ({value['source']})"
    return str(value)
