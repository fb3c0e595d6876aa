"""``sweep status`` reads the sweep's record once and the ledger once, and its costs are the ledger's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import sweeps_world

from tpuops import api
from tpuops.billing.cost import catalog_for, spent
from tpuops.billing.ledger import Ledger
from tpuops.store import LocalStore

pytestmark = pytest.mark.unit


def test_sweep_status_reads_the_record_and_the_ledger_once_and_costs_each_trial_as_the_ledger_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sim = sweeps_world(tmp_path, ("s",))
    assert sim.run(max_hours=4).ended
    settings = sim.settings
    reads: list[str] = []
    histories: list[dict[str, Any]] = []
    read_versioned, real_histories = LocalStore.read_versioned, Ledger.histories  # every read of a local store
    monkeypatch.setattr(LocalStore, "read_versioned", lambda self, key: reads.append(key) or read_versioned(self, key))
    monkeypatch.setattr(Ledger, "histories", lambda self, *args, **kwargs: histories.append(kwargs)
                        or real_histories(self, *args, **kwargs))
    status = api.sweep_status(settings, "s")
    monkeypatch.undo()
    assert [key for key in reads if key.endswith("/sweep.json")] == ["sweeps/s/sweep.json"]
    assert histories == [{"sweep_id": "s"}]
    catalog = catalog_for(settings)
    assert [row.run_id for row in status.trials] == ["s-t0000", "s-t0001"]
    for row in status.trials:
        assert row.cost_usd > 0 and row.cost_usd == pytest.approx(
            spent(sim.ledger, catalog, project=settings.project, run_id=row.run_id), rel=1e-9)
    assert status.spent_usd == pytest.approx(spent(sim.ledger, catalog, project=settings.project, sweep_id="s"),
                                             rel=1e-9)
    assert status.spent_usd == pytest.approx(sum(row.cost_usd for row in status.trials), rel=1e-9)
