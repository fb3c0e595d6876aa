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
    if forecast.get("sizes"):
        _print_sizes(forecast["sizes"])


def _print_sizes(sizes: dict[str, Any]) -> None:
    """An elastic run's sizes (``tpuops.sim.forecast.size_forecast``): each one's time and cost for the whole job and
    its hazards, then the deadline policy's choice if the largest is stocked out at launch, with every move."""
    from rich.table import Table

    table = Table(title=f"sizes: {sizes['work_hours']:,.2f} h of work on the largest (expected, closed form)",
                  title_justify="left")
    for column in ("size", "slowdown", "spot h", "spot cost", "on-demand h", "on-demand cost",
                   "preemptions / h", "stockouts / h", "mean stockout h"):
        table.add_column(column)
    for row in sizes["sizes"]:
        table.add_row(row["accelerator"], f"{row['slowdown']:g}x", f"{row['spot']['hours']:,.2f}",
                      format_usd(row["spot"]["usd"]), f"{row['on_demand']['hours']:,.2f}",
                      format_usd(row["on_demand"]["usd"]), _learned(row["hazard_per_hour"], 1.0),
                      _learned(row["stockouts_per_hour"], 1.0), _learned(row["spell_s"], 1 / 3600))
    plan = sizes["if_stocked_out_at_launch"]
    moves = Table(title=f"if {sizes['sizes'][0]['accelerator']} is stocked out at launch, due in "
                        f"{sizes['deadline_hours']:,.1f} h ({sizes['deadline']}): {plan['choice']}",
                  title_justify="left")
    for column in ("move", "expected hours", "expected cost", "on time"):
        moves.add_column(column)
    for option in plan["options"]:
        moves.add_row(option["move"], f"{option['hours']:,.2f}", format_usd(option["usd"]),
                      f"{option['on_time']:.0%}")
    console = err_console()
    console.print(table)
    console.print(moves)
    for row in sizes["sizes"]:
        for name in ("hazard_per_hour", "stockouts_per_hour", "spell_s"):
            console.print(f"  {row['accelerator']} {name}: {_assumption(row[name])}", markup=False, soft_wrap=True)


def _learned(value: dict[str, Any], scale: float) -> str:
    """A learned or assumed figure in a cell, an assumption marked with a star."""
    return f"{value['value'] * scale:.3g}{'' if value['learned'] else '*'}"


def _assumption(value: Any) -> str:
    """A planning input (``tpuops.launch.planning``) as its value and where it came from; anything else as it is."""
    if isinstance(value, dict) and "source" in value:
        return f"{value['value']:.4g} ({value['source']})"
    return str(value)
