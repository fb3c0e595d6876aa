"""The history a plan learns from (``tpuops.launch.planning``): the ledger's node incarnations and the statuses of
the newest runs they name, read through ``Settings``.

Part of the front door's planning calls: ``tpuops.api.plan`` (the dry runs' forecasts, ``tpuops risk``,
``tpuops simulate``),
``tpuops.api`` (``plan_train``) and ``tpuops.api.sweeps`` (a sweep's trials) all learn through here, so a
launch and a forecast rest on the same reading. Reading never creates a ledger.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from tpuops.config import Settings
from tpuops.core.clock import UTC

if TYPE_CHECKING:
    from tpuops.billing.ledger import NodeHistory
    from tpuops.billing.risk import Risk, RiskKey
    from tpuops.launch.planning import Learner
    from tpuops.runs.models import AttemptTime, PlanInputs
    from tpuops.sim.history import History


def histories(settings: Settings) -> list[NodeHistory]:
    """Every node incarnation of the project in the ledger; none without a ledger, which reading must not create
    (a refused command leaves nothing behind)."""
    from tpuops.session import open_ledger

    return open_ledger(settings).histories(settings.project) if settings.ledger_path.exists() else []


def experiment_history(settings: Settings, experiment: str) -> History | None:
    """What earlier runs of ``experiment`` in the store measured (speed, setup, save cost): a forecast and
    ``tpuops simulate`` rest on the same."""
    from tpuops import runs as run_store
    from tpuops.session import store
    from tpuops.sim.history import history_of

    return history_of(run_store.list_runs(store(settings)), experiment)


RECENT_RUNS = 200
"""How many of the newest runs the ledger names a plan reads the statuses of (recovery costs, lost work): a
bounded number of store reads per launch, however long the history."""


def learner(settings: Settings, *, now: datetime | None = None) -> Learner:
    """What a run's deadline and ``every: auto`` rest on (``tpuops.launch.planning``), learned from the ledger and the
    statuses of the ``RECENT_RUNS`` newest runs it names; read once, on the first ask (a run that needs
    neither reads nothing)."""
    from functools import cache

    from tpuops import runs as run_store
    from tpuops.billing.cost import catalog_for
    from tpuops.billing.risk import Prior, learn
    from tpuops.core.errors import TpuopsError
    from tpuops.launch import planning
    from tpuops.session import store

    @cache
    def history() -> tuple[list[NodeHistory], list[Risk], dict[str, list[AttemptTime]]]:
        root = store(settings)

        def attempts(run_id: str) -> list[AttemptTime]:
            try:
                status = run_store.read_status(root, run_id)
            except TpuopsError:  # an unreadable status is no evidence
                return []
            return list(status.attempts) if status else []

        every = histories(settings)
        newest = sorted({h.node.run_id: h.node.created_at for h in every if h.node.run_id}.items(),
                        key=lambda item: item[1])
        ids = [run_id for run_id, _ in newest[-RECENT_RUNS:]]
        risks = learn(every, now or datetime.now(UTC), Prior.of(settings))
        return every, risks, dict(zip(ids, run_store.parallel_map(attempts, ids), strict=True))

    defaults = planning.Defaults(Prior.of(settings), settings.recovery_s, settings.lost_work_per_hour,
                                 catalog_for(settings))

    def learn_inputs(keys: Sequence[RiskKey]) -> PlanInputs:
        every, risks, found = history()
        return planning.learn(risks, every, found, keys, defaults)

    return learn_inputs
