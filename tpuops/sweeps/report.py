"""``tpuops sweep report --out DIR``: five PNG plots (matplotlib, headless Agg) and one self-contained HTML page.

Plots: optimization history (objective per trial and best so far), parameter importances
(Optuna's fANOVA over the completed trials), parallel coordinates (each param scaled to [0, 1],
coloured by objective), intermediate values per trial (pruned ones dashed), cost vs objective.
The HTML page embeds the PNGs as data URIs and holds the trials table, the best trial with its
model and checkpoint paths, and spend against the budget: one file to mail or open anywhere.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuops.core.formats import format_params, format_usd
from tpuops.sweeps.decide import TrialState
from tpuops.sweeps.status import SweepStatus, TrialRow

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PLOTS = ("history", "importances", "parallel", "intermediate", "cost")
_COLORS = {TrialState.COMPLETE: "tab:blue", TrialState.PRUNED: "tab:orange", TrialState.FAIL: "tab:red",
           TrialState.RUNNING: "tab:gray"}


def _figure() -> tuple[Figure, Any]:
    import matplotlib

    matplotlib.use("Agg")  # headless: no display, same pixels everywhere
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4), dpi=100, layout="tight")
    return figure, figure.subplots()


def _history(status: SweepStatus) -> Figure:
    figure, ax = _figure()
    done = [t for t in status.trials if t.state is TrialState.COMPLETE and t.value is not None]
    ax.scatter([t.number for t in done], [t.value for t in done], color=_COLORS[TrialState.COMPLETE], label="trial",
               zorder=3)
    best: list[float] = []
    pick = max if status.direction == "maximize" else min
    for trial in done:
        best.append(trial.value if not best else pick(best[-1], trial.value or 0.0))  # type: ignore[arg-type]
    ax.step([t.number for t in done], best, where="post", color="tab:green", label="best so far")
    ax.set(title=f"optimization history of {status.name}", xlabel="trial", ylabel=status.metric)
    ax.legend(loc="best")
    return figure


def _importances(status: SweepStatus) -> Figure:
    figure, ax = _figure()
    names = sorted(status.importances, key=lambda k: status.importances[k])
    ax.barh(names, [status.importances[n] for n in names], color="tab:purple")
    ax.set(title="parameter importances (fANOVA)", xlabel=f"importance for {status.metric}", xlim=(0, 1))
    if not names:
        ax.text(0.5, 0.5, "needs two completed trials with different objectives", ha="center", va="center",
                transform=ax.transAxes)
    return figure


def _scaled(rows: list[TrialRow], name: str) -> list[float]:
    values = [r.params.get(name) for r in rows]
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        numbers = [float(v) for v in values]  # type: ignore[arg-type]
        if min(numbers) > 0 and max(numbers) / min(numbers) > 20:
            numbers = [math.log10(v) for v in numbers]
        low, high = min(numbers), max(numbers)
        return [(v - low) / (high - low) if high > low else 0.5 for v in numbers]
    order = sorted({str(v) for v in values})
    return [order.index(str(v)) / max(1, len(order) - 1) for v in values]


def _parallel(status: SweepStatus) -> Figure:
    from matplotlib import colormaps

    figure, ax = _figure()
    rows = [t for t in status.trials if t.state is TrialState.COMPLETE and t.value is not None]
    names = sorted({k for t in rows for k in t.params})
    axes = [*names, status.metric]
    if rows:
        columns = [_scaled(rows, n) for n in names]
        low, high = min(t.value for t in rows), max(t.value for t in rows)  # type: ignore[type-var]
        colour = colormaps["viridis"]
        for i, trial in enumerate(rows):
            scaled = (trial.value - low) / (high - low) if high > low else 0.5  # type: ignore[operator]
            ax.plot(range(len(axes)), [c[i] for c in columns] + [scaled], color=colour(scaled), alpha=0.8,
                    marker="o")
    ax.set_xticks(range(len(axes)), axes)
    ax.set(title="parallel coordinates (each axis scaled to its range)", ylim=(-0.05, 1.05))
    return figure


def _intermediate(status: SweepStatus) -> Figure:
    figure, ax = _figure()
    for trial in status.trials:
        if trial.intermediate:
            steps = sorted(trial.intermediate)
            ax.plot(steps, [trial.intermediate[s] for s in steps], marker=".", color=_COLORS.get(trial.state, "k"),
                    linestyle="--" if trial.state is TrialState.PRUNED else "-",
                    label=f"t{trial.number} {trial.state.lower()}")
    ax.set(title="intermediate values per trial", xlabel="step", ylabel=status.metric)
    if any(t.intermediate for t in status.trials):
        ax.legend(loc="best", fontsize="small", ncol=2)
    return figure


def _cost(status: SweepStatus) -> Figure:
    figure, ax = _figure()
    for trial in status.trials:
        if trial.value is not None:
            ax.scatter(trial.cost_usd, trial.value, color=_COLORS.get(trial.state, "k"), zorder=3)
            ax.annotate(f"t{trial.number}", (trial.cost_usd, trial.value), textcoords="offset points", xytext=(4, 4))
    ax.set(title="cost vs objective", xlabel="cost (USD, all nodes of the trial)", ylabel=status.metric)
    return figure


_MAKERS: dict[str, Callable[[SweepStatus], Figure]] = {
    "history": _history, "importances": _importances, "parallel": _parallel, "intermediate": _intermediate,
    "cost": _cost,
}


def write_report(status: SweepStatus, out: Path) -> list[Path]:
    """Write ``<plot>.png`` for every plot and ``report.html``; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in PLOTS:
        path = out / f"{name}.png"
        _MAKERS[name](status).savefig(path, format="png")
        written.append(path)
    page = out / "report.html"
    page.write_text(render_html(status, {p.stem: p.read_bytes() for p in written}))
    return [*written, page]


def render_html(status: SweepStatus, images: dict[str, bytes]) -> str:
    e = html.escape
    rows = "".join(
        f"<tr><td>{t.number}</td><td>{e(t.run_id)}</td><td>{e(format_params(t.params))}</td><td>{t.state}</td>"
        f"<td>{t.step}</td><td>{'' if t.value is None else f'{t.value:.4f}'}</td><td>{t.preemptions}</td>"
        f"<td>{e(format_usd(t.cost_usd))}</td><td>{'' if t.goodput is None else f'{t.goodput:.2f}'}</td>"
        f"<td>{t.recomputed_steps}</td><td>{e(format_usd(t.lost_usd))}</td></tr>"
        for t in status.trials)
    best = status.best
    best_html = (f"<p class=best>Best: trial {best.number} ({e(best.run_id)}), {e(status.metric)} = {best.value:.4f} "
                 f"with {e(format_params(best.params))}.<br>Model: <code>{e(status.best_model or '')}</code><br>"
                 f"Checkpoints: <code>{e(status.best_checkpoint or '')}</code></p>") if best else \
        "<p class=best>No completed trial yet.</p>"
    budget = f" of a {format_usd(status.budget_usd)} budget" if status.budget_usd else ""
    promoted = [t for t in status.trials if t.promoted]
    endgame = (f"<p>Endgame: {len(promoted)} trial(s) promoted to on-demand; their on-demand nodes cost "
               f"{e(format_usd(sum(t.on_demand_usd for t in promoted)))}.</p>") if promoted else ""
    outcome = f", {e(status.outcome)}: {e(status.reason or '')}" if status.outcome else ""
    figures = "".join(f"<figure><img alt='{name}' src='data:image/png;base64,"
                      f"{base64.b64encode(images[name]).decode()}'><figcaption>{name}</figcaption></figure>"
                      for name in PLOTS if name in images)
    return f"""<!doctype html>
<html lang=en><head><meta charset=utf-8><title>sweep {e(status.name)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 8px;text-align:left}}figure{{display:inline-block;margin:8px}}
img{{max-width:520px}}</style></head>
<body><h1>Sweep {e(status.name)}</h1>
<p>{e(status.phase)}{outcome}. {len(status.trials)} of {status.wanted} trials; spent
{e(format_usd(status.spent_usd))}{e(budget)}; objective: {e(status.direction)} {e(status.metric)}.</p>
{best_html}
{endgame}
<table id=trials><thead><tr><th>trial</th><th>run</th><th>params</th><th>state</th><th>step</th>
<th>{e(status.metric)}</th><th>preemptions</th><th>cost</th><th>goodput</th><th>steps redone</th>
<th>lost to interruptions</th></tr>
</thead><tbody>{rows}</tbody></table>
{figures}
</body></html>
"""
