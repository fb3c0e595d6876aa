"""What a sweep looks like now: one row per trial (params, state, step, objective, preemptions, cost), totals, best.

Read-only: the study is opened without the sweep's lease, runs are read from the store and
costs from the ledger. ``sweep status`` and ``sweep report`` both render this.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from tpuops import runs
from tpuops.accounting.goodput import run_goodput
from tpuops.billing.cost import catalog_for, node_cost
from tpuops.billing.ledger import Ledger, NodeHistory
from tpuops.config import Settings
from tpuops.core.clock import UTC
from tpuops.store import Store
from tpuops.sweeps import ops as sweep_ops
from tpuops.sweeps import studies
from tpuops.sweeps.decide import TrialState
from tpuops.sweeps.models import SweepOutcome, SweepPhase, SweepRecord
from tpuops.sweeps.template import trial_run_id
from tpuops.sweeps.trials import ENDED_ATTR, state_of


@dataclass(frozen=True)
class TrialRow:
    number: int
    run_id: str
    params: dict[str, Any]
    state: TrialState
    step: int
    value: float | None
    """The objective told (COMPLETE), else the last intermediate value."""
    intermediate: dict[int, float]
    preemptions: int
    restarts: int
    cost_usd: float
    ended: str | None
    promoted: bool = False
    """Moved to on-demand by the endgame."""
    on_demand_usd: float = 0.0
    """What its on-demand nodes cost (the price of the promotion)."""
    recomputed_steps: int = 0
    """Steps trained again after preemptions and crashes (the agent counts them across attempts)."""
    lost_usd: float = 0.0
    """What interruptions cost (``tpuops.accounting.goodput``: redone steps, replacement boots and setups); from an
    agent without time accounting, the share of ``cost_usd`` of the redone steps, cost taken as
    proportional to steps trained."""
    goodput: float | None = None
    """Productive seconds / billed seconds (None: not known yet, or an agent without time accounting)."""


@dataclass
class SweepStatus:
    name: str
    phase: SweepPhase
    outcome: SweepOutcome | None
    reason: str | None
    waiting: str | None
    last_pass: str | None
    passes: int
    metric: str
    direction: str
    wanted: int
    parallel: int
    budget_usd: float | None
    spent_usd: float
    trials: list[TrialRow] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    best: TrialRow | None = None
    best_model: str | None = None
    best_checkpoint: str | None = None
    importances: dict[str, float] = field(default_factory=dict)
    """Optuna's fANOVA importance of each param (``sweep report`` only; needs two completed trials)."""

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for row in out["trials"] + ([out["best"]] if out["best"] else []):
            row["intermediate"] = {str(k): v for k, v in row["intermediate"].items()}
        return out


_COUNTED = (TrialState.COMPLETE, TrialState.RUNNING, TrialState.PRUNED, TrialState.FAIL, TrialState.WAITING)
"""The trial states ``sweep status`` counts, in the order it shows them."""


def sweep_status(settings: Settings, store: Store, ledger: Ledger, sweep: SweepRecord,
                 environ: Mapping[str, str] | None = None, *, importances: bool = False) -> SweepStatus:
    """The sweep as it stands (``sweep`` as the caller read it: its record is not read again); its nodes' costs
    from one read of the ledger, the sweep's nodes grouped by run."""
    name, spec = sweep.name, sweep.spec
    state, _ = sweep_ops.load_state(store, name)
    study = studies.load_study(spec, studies.open_storage(spec, store, environ=environ))
    catalog = catalog_for(settings)
    now = datetime.now(UTC)
    by_run: dict[str | None, list[tuple[NodeHistory, float]]] = {}
    for history in ledger.histories(settings.project, sweep_id=name):
        by_run.setdefault(history.node.run_id, []).append((history, node_cost(history, catalog, now).usd))
    rows = []
    for trial in study.get_trials(deepcopy=False):
        run_id = trial_run_id(name, trial.number)
        trial_state = state_of(trial)
        status, memory, _ = runs.read_state(store, run_id)  # a damaged trial run shows what can be read of it
        costed = by_run.get(run_id, [])
        histories = [history for history, _ in costed]
        on_demand = sum(usd for history, usd in costed if history.node.capacity == "on-demand")
        promoted = memory.capacity is not None
        cost = sum(usd for _, usd in costed)
        step, recomputed = (status.step, status.recomputed_steps) if status else (0, 0)
        split = run_goodput(histories, status, catalog, now)
        lost = split.lost_usd if split else lost_to_recompute(cost, step, recomputed)
        values = dict(sorted(trial.intermediate_values.items()))
        value = trial.value if trial_state is TrialState.COMPLETE else (values[max(values)] if values else None)
        rows.append(TrialRow(
            number=trial.number, run_id=run_id, params=studies.trial_params(trial.params), state=trial_state,
            step=step, value=value, intermediate=values, preemptions=memory.preemptions,
            restarts=memory.crashes, cost_usd=cost, ended=trial.user_attrs.get(ENDED_ATTR), promoted=promoted,
            on_demand_usd=on_demand, recomputed_steps=recomputed, lost_usd=lost,
            goodput=split.goodput if split else None))
    counts = Counter(row.state for row in rows)
    complete = [row for row in rows if row.state is TrialState.COMPLETE and row.value is not None]
    best = None
    if complete:
        pick = max if spec.objective.direction == "maximize" else min
        best = pick(complete, key=lambda row: row.value or 0.0)
    return SweepStatus(
        name=name, phase=state.phase, outcome=state.outcome, reason=state.reason, waiting=state.waiting,
        last_pass=state.last_pass, passes=state.passes, metric=spec.objective.metric,
        direction=spec.objective.direction, wanted=spec.trials, parallel=spec.parallel, budget_usd=spec.budget_usd,
        spent_usd=sum(usd for costed in by_run.values() for _, usd in costed), trials=rows,
        counts={s: counts.get(s, 0) for s in _COUNTED}, best=best,
        best_model=store.uri_of(f"runs/{best.run_id}/model") if best else None,
        best_checkpoint=store.uri_of(f"runs/{best.run_id}/ckpt") if best else None,
        importances=param_importances(study) if importances else {})


def lost_to_recompute(cost_usd: float, step: int, recomputed: int) -> float:
    """Dollars of ``cost_usd`` spent on steps trained twice: ``recomputed`` of ``step + recomputed`` steps."""
    trained = step + recomputed
    return cost_usd * recomputed / trained if trained else 0.0


def param_importances(study: Any) -> dict[str, float]:
    """fANOVA importances over the completed trials, seeded; empty when there are too few to tell."""
    import optuna

    complete = [t for t in study.get_trials(deepcopy=False) if state_of(t) is TrialState.COMPLETE]
    if len(complete) < 2:
        return {}
    try:
        return dict(optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0)))
    except (ValueError, RuntimeError):  # e.g. every objective equal: "zero total variance"
        return {}
