"""Forecasts before paying: cost, time to result (p10/p50/p90) and expected preemptions, per capacity policy.

A forecast is a set of simulations (``tpuops.sim.scenario``) on the risk the ledger learned and the
experiment's own history (``measured``): ``runs`` independent runs of an experiment per policy, or a
few whole simulated sweeps per policy (a sweep's result is its last trial's end, its cost every
trial's). Quantiles are empirical over those runs. What was assumed rather than measured is named in
``assumptions`` (the speed of an experiment without history, the hazard of a zone without it).

Every policy of ``tpuops.sim.scenario.CapacityPolicy`` is forecast: spot, on-demand, the fallback (on-demand from the
first preemption) and the deadline policy (against the experiment's deadline, or an assumed one).

An elastic experiment (``accelerator: [v2-32, v2-8]``) also gets its sizes forecast in closed form (``size_forecast``,
``tpuops.billing.elastic``): each size's time and cost for the whole job on spot and on-demand, its preemption and
stockout hazards (learned or assumed, saying which), and what the deadline policy would choose if the largest were
stocked out at launch, with each move's expected hours, cost and chance to be on time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from tpuops.billing.elastic import choose_size
from tpuops.billing.risk import Risk
from tpuops.config import Settings
from tpuops.contract.interval import FIRST_SAVE_S
from tpuops.controller.decide import size_terms
from tpuops.launch.experiment import load_experiment
from tpuops.runs.models import PlanInputs
from tpuops.sim.engine import SimReport
from tpuops.sim.history import History
from tpuops.sim.scenario import (
    DEADLINE_SLACK,
    DEFAULT_STEPS_PER_S,
    CapacityPolicy,
    Limits,
    agent_model,
    due_s,
    is_sweep,
    simulate,
)

FORECAST_HORIZON = 20.0
"""A forecast's simulations stop at 20x the job's length on-demand (a sweep's: its waves of trials), at
least 24 h and at most 30 days, of virtual time: a run that has not ended by then is reported not finished.
With the work budget below, this is what bounds a risk so high that runs never end (the ledger of an emulator
preempting every few seconds); both depend on the inputs alone, so the same inputs give the same forecast under
any load."""

FORECAST_RUN_PASSES = 48_000
"""A forecast's simulated work (runs going, summed over passes), whatever the job's length: each simulation
gets an equal share of what the ones before it left (an experiment's 4 simulations of 20 runs: 12,000
run-passes, 600 passes, for the first), cheapest policy first, so that what on-demand does not need goes to
spot. Quiet passes are skipped (``FORECAST_QUIET_SHARE``), so what a simulation spends grows with its events
(boots, preemptions, recoveries), not with its steps or saves; a job so long or so preempted that its runs do
not end within their share shows as not finished."""

FORECAST_ORDER = ("on-demand", "fallback", "spot", "deadline")
"""The order a forecast simulates its policies in, cheapest in events first (it shows them in ``CapacityPolicy``'s)."""

FORECAST_QUIET_SHARE = 0.01
"""A forecast skips quiet passes up to 1 % of the job's length (``Limits.quiet_share``): a job shorter than
about 8 h (100 passes of 5 minutes) skips none, and a longer one costs about 100 passes per run where nothing
happens, so that the forecast of an 83-h job takes about as long as a 1-day one. The only rule this can delay
is the deadline policy's return to spot (by at most that share); costs and times come from the simulated
cloud's billing and the agents' clocks, which skipped passes do not change."""

FORECAST_WALL_S = 600.0
"""The last resort, over every policy's simulations: met only when the machine is far slower than the work
budget assumes; a policy it stopped says so (``cut_short_by_time``), as it is the machine, not the model."""


@dataclass(frozen=True)
class Band:
    """The 10th, 50th and 90th percentiles of a simulated quantity."""

    p10: float
    p50: float
    p90: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Band | None:
        if not values:
            return None
        ordered = sorted(values)
        if len(ordered) == 1:
            return cls(ordered[0], ordered[0], ordered[0])
        deciles = statistics.quantiles(ordered, n=10, method="inclusive")
        return cls(deciles[0], statistics.median(ordered), deciles[-1])

    def to_json(self) -> dict[str, float]:
        return {"p10": round(self.p10, 6), "p50": round(self.p50, 6), "p90": round(self.p90, 6)}


class PolicyForecast(NamedTuple):
    """One policy's forecast."""

    policy: str
    simulated: int
    """Runs (or whole sweeps) simulated."""
    finished: int
    bands: dict[str, Band | None]
    """``usd`` (cost) and ``hours`` (time to result from the launch), over the simulated runs or sweeps."""
    preemptions: float
    """Mean preemptions per run (per sweep: over all its trials)."""
    cut_short: bool = False
    """The wall-clock guard stopped one of its simulations (the machine, not the model, limited it)."""
    run_passes: int = 0
    """The simulated work its simulations did (``SimReport.run_passes``)."""

    def to_json(self) -> dict[str, Any]:
        bands = {name: band.to_json() if band else None for name, band in self.bands.items()}
        return {"policy": self.policy, "simulated": self.simulated, "finished": self.finished, **bands,
                "expected_preemptions": round(self.preemptions, 3), "cut_short_by_time": self.cut_short,
                "run_passes": self.run_passes}


@dataclass(frozen=True)
class Forecast:
    policies: tuple[PolicyForecast, ...]
    assumptions: dict[str, Any] = field(default_factory=dict)
    sizes: dict[str, Any] | None = None
    """An elastic experiment's sizes (``size_forecast``); None for one size, or a sweep."""

    def to_json(self) -> dict[str, Any]:
        shown = {"policies": [p.to_json() for p in self.policies], "assumptions": self.assumptions}
        return shown if self.sizes is None else {**shown, "sizes": self.sizes}


def size_forecast(inputs: PlanInputs, length_s: float, due: float | None) -> dict[str, Any]:
    """Each size of an elastic run for a job ``length_s`` long on its largest (module docstring), due ``due``
    seconds after its launch (None: ``DEADLINE_SLACK`` times its length, an assumption it names)."""
    terms, recovery_s = size_terms(inputs), inputs.recovery_s.value
    left = due if due is not None else DEADLINE_SLACK * length_s
    sizes = [{"accelerator": term.accelerator, "slowdown": term.slowdown,
              "spot": {"hours": round(term.hours(length_s, recovery_s), 4),
                       "usd": round(term.usd(length_s, recovery_s), 4)},
              "on_demand": {"hours": round(term.hours(length_s, recovery_s, on_demand=True), 4),
                            "usd": round(term.usd(length_s, recovery_s, on_demand=True), 4)},
              "stocked_out_share": round(term.stocked_out_share(), 4),
              **{name: getattr(learned, name).model_dump() for name in ("hazard_per_hour", "stockouts_per_hour",
                                                                          "spell_s")}}
             for term, learned in zip(terms, inputs.sizes, strict=True)]
    plan = choose_size(length_s, left, terms[0], terms[1], recovery_s)
    return {"work_hours": round(length_s / 3600, 4), "deadline_hours": round(left / 3600, 4),
            "deadline": "the experiment's" if due is not None else
                        f"assumed: {DEADLINE_SLACK:g}x the job's length on its largest size",
            "recovery_s": inputs.recovery_s.model_dump(), "sizes": sizes, "if_stocked_out_at_launch": plan.to_json()}


def _names_deadline(path: Path) -> bool:
    """Whether the experiment (or the sweep's experiment) names a deadline of its own."""
    import yaml

    try:
        document = yaml.safe_load(path.read_text())
        if isinstance(document, dict) and "trials" in document:
            document = yaml.safe_load((path.parent / str(document.get("experiment", ""))).read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(document, dict) and ("deadline" in document or "finish_within" in document)


def _summary(policy: CapacityPolicy, reports: Sequence[SimReport], per_sweep: bool) -> PolicyForecast:
    cut_short = any(r.stopped_by == "time" for r in reports)
    work = sum(r.run_passes for r in reports)
    if per_sweep:
        finished = [r for r in reports if r.ended]
        hours = [max((run.hours_to_result or 0.0 for run in r.runs), default=0.0) for r in finished]
        usd = [r.usd for r in reports]
        preemptions = [float(sum(run.preemptions for run in r.runs)) for r in reports]
        return PolicyForecast(policy.value, len(reports), len(finished), {"usd": Band.of(usd), "hours": Band.of(hours)},
                              statistics.fmean(preemptions) if preemptions else 0.0, cut_short, work)
    runs = [run for r in reports for run in r.runs]
    done = [run for run in runs if run.hours_to_result is not None]
    bands = {"usd": Band.of([run.usd for run in runs]), "hours": Band.of([run.hours_to_result or 0.0 for run in done])}
    return PolicyForecast(policy.value, len(runs), len(done), bands,
                          statistics.fmean(run.preemptions for run in runs) if runs else 0.0, cut_short, work)


def forecast(settings: Settings, path: Path, risks: Sequence[Risk], history: History | None, *, runs: int = 20,
             sweeps: int = 3, seed: int = 0, cron_s: float = 300.0, inputs: PlanInputs | None = None,
             progress: Callable[[str], None] | None = None, run_passes: int = FORECAST_RUN_PASSES) -> Forecast:
    """Forecast an experiment (``runs`` simulated runs per policy) or a sweep (``sweeps`` simulated sweeps), its
    runs planning on ``inputs`` (``tpuops.launch.planning``: learned or assumed, and each says which), within
    ``run_passes`` of simulated work in all (``FORECAST_RUN_PASSES``)."""
    sweep = is_sweep(path)
    deadline = time.perf_counter() + FORECAST_WALL_S
    left = simulations = len(CapacityPolicy) * (sweeps if sweep else 1)
    work_left = run_passes

    def limits() -> Limits:
        """An equal share of what is left of the work budget and of the wall guard: a simulation that ends early
        leaves its rest to the next ones."""
        nonlocal left
        work, wall_s = work_left // left, max(0.0, deadline - time.perf_counter()) / left
        left -= 1
        return Limits(horizon=FORECAST_HORIZON, max_run_passes=max(1, work), quiet_share=FORECAST_QUIET_SHARE,
                      wall_budget_s=wall_s)

    forecasts = {}
    for policy in sorted(CapacityPolicy, key=lambda p: FORECAST_ORDER.index(p.value)):
        reports = []
        for index in range(sweeps if sweep else 1):
            report = simulate(settings, path, risks, policy=policy, seed=seed + index, cron_s=cron_s,
                              count=1 if sweep else runs, history=history, inputs=inputs, progress=progress,
                              limits=limits())
            work_left -= report.run_passes
            reports.append(report)
        forecasts[policy] = _summary(policy, reports, sweep)
    policies = [forecasts[policy] for policy in CapacityPolicy]
    learned = {f"{r.key.zone}/{r.key.accelerator}/{r.key.capacity}": ("assumed" if r.assumed else "learned")
               for r in risks}
    assumptions = {
        "steps_per_s": round(history.steps_per_s if history else DEFAULT_STEPS_PER_S, 3),
        "steps_per_s_source": f"measured over {history.runs} earlier runs" if history else "assumed (no history)",
        "setup_s": history.setup_s if history and history.setup_s > 0 else "assumed (default of the agent model)",
        "save_s": history.save_s if history and history.save_s is not None else
                  f"assumed: {FIRST_SAVE_S:g} (no earlier run measured a save)",
        "spot_preemptions_per_hour_without_history": settings.spot_preemptions_per_hour,
        "risk": learned or "no ledger history: every zone assumed",
        "pass_every_s": cron_s,
        "deadline": "the experiment's" if _names_deadline(path) else
                    f"assumed: {DEADLINE_SLACK:g}x the job's length on-demand (the experiment names none)",
        **(inputs.model_dump() if inputs else {"recovery_s": settings.recovery_s,
                                                "lost_work_per_hour": settings.lost_work_per_hour}),
        "horizon": f"{FORECAST_HORIZON:g}x the job's length on-demand (at least 24 h, at most 30 days), and "
                   f"{run_passes:,} run-passes in all, shared by the {simulations} simulations: what has not ended by "
                   "then is not finished",
    }
    sizes = None
    if inputs is not None and len(inputs.sizes) > 1 and not sweep:
        experiment = load_experiment(path)
        length_s = agent_model(experiment, history, lost_work_per_hour=inputs.lost_work_per_hour.value).length_s
        sizes = size_forecast(inputs, length_s, due_s(experiment))
    return Forecast(tuple(policies), assumptions, sizes)
