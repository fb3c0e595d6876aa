"""A sweep's endgame promotion (``sweeps.advance.promote_run``) on the emulator: the node goes through the Fleet.

The promoted run's node is named apart from its run (the node a run recorded is the one deleted,
whatever its name), and its READY time in the ledger ends where Cloud TPU stops billing: at the
start of the delete, which the delete operation dates. The ledger is held to the emulator's billing
record within 2 %, as ``tests/billing/test_cost.py`` does for ``up`` and ``down``. The nodes run a script that
exits at once: billing needs READY time, not TensorFlow.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from helpers import controller_over, poll

from tpuops import runs
from tpuops.billing.cost import catalog_for, node_cost
from tpuops.billing.ledger import Ledger
from tpuops.config import Settings
from tpuops.controller.reconcile import Controller
from tpuops.core.clock import UTC
from tpuops.core.kinds import Capacity
from tpuops.core.naming import MetadataKey
from tpuops.fleet import Fleet
from tpuops.launch.provision import plan_up
from tpuops.providers.cloud_tpu.adapter import TpuApi
from tpuops.providers.nodes import NodeState
from tpuops.runs import NodeSpec, RunKind, RunRecord
from tpuops.store import open_store
from tpuops.sweeps.advance import promote_run

pytestmark = pytest.mark.emulator

ZONE = "us-central1-b"
RUN, NODE = "promo-run", "promo-node"
LIVE = {"command": "train", "attempt": 1, "phase": "training", "step": 10, "total_steps": 1000}
QUICK_SCRIPT = "#!/bin/bash\nexit 0\n"
ACCRUE_S = 3.0


def _accrue() -> None:
    """Let billable READY time pass: the time itself is what is measured, not a synchronisation."""
    time.sleep(ACCRUE_S)


@pytest.fixture
def controller(emulator: Any, tmp_path: Path) -> Controller:
    settings = Settings(zones=[ZONE], home=tmp_path / "home", store=str(tmp_path / "store"), max_run_hours=0,
                        tpu_endpoint=emulator.endpoint, poll_interval_s=0.05, operation_timeout_s=30)
    provider = TpuApi(settings.project, endpoint=emulator.endpoint, token=emulator.token, poll_interval_s=0.05,
                      deadline_s=20)
    store = open_store(settings.store_root)
    request = plan_up(settings, NODE, accelerator="v3-8", capacity=Capacity.SPOT, zone=ZONE, run_id=RUN).request
    request = request.model_copy(update={"metadata": {MetadataKey.STARTUP_SCRIPT.value: QUICK_SCRIPT}})
    record = RunRecord(run_id=RUN, kind=RunKind.TRAIN, node=NodeSpec.of(request, [ZONE]), experiment="x")
    store.write_bytes(runs.record_key(RUN), record.model_dump_json().encode())
    store.write_bytes(runs.status_key(RUN), runs.AgentStatus.model_validate({**LIVE, "run_id": RUN})
                      .model_dump_json().encode())
    runs.mark_active(store, RUN)
    return controller_over(settings, store, Fleet(provider, settings, Ledger(settings.ledger_path)), sweeps=None,
                           holder="test", status_refresh_s=0.0)


def _ready(controller: Controller, capacity: Capacity) -> bool:
    """READY as the Fleet sees it, so the ledger has the READY it is checked for. Asked of the provider
    directly, a node that went READY just after the pass's listing was READY here but never in the ledger,
    which then billed its incarnation 0 s (seen on a loaded machine)."""
    controller.run_pass()
    node = controller.nodes.find(ZONE, NODE)
    return node is not None and node.state is NodeState.READY and node.capacity is capacity


def _apart(controller: Controller, billing: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """READY seconds per incarnation of the run's node: (ledger, billing), closed intervals of the billing only."""
    catalog, now = catalog_for(controller.settings), datetime.now(UTC)
    ledger = {h.node.uid: node_cost(h, catalog, now).ready_seconds
              for h in controller.ledger.histories(controller.settings.project, run_id=RUN)}
    return {i["node_uid"]: (ledger.get(i["node_uid"], 0.0), i["seconds"]) for i in billing
            if i["node"].endswith(f"/nodes/{NODE}") and i["end"] is not None}


def test_a_promoted_runs_ledger_interval_ends_where_billing_does(controller: Controller, emulator_admin: Any) -> None:
    poll(lambda: _ready(controller, Capacity.SPOT), "the spot node READY, seen by a pass", timeout_s=30)
    _accrue()

    assert promote_run(controller.store, controller.nodes, controller.leases, RUN, time.time())
    node = controller.nodes.provider.find_node(ZONE, NODE)
    assert node is None or node.state is NodeState.DELETING  # the recorded node, though named apart from its run
    first = _apart(controller, emulator_admin.billing())  # no pass since: the delete itself closed the interval
    assert len(first) == 1, first
    (ledger_s, billed_s), = first.values()
    assert abs(ledger_s - billed_s) <= 0.02 * billed_s, first

    poll(lambda: _ready(controller, Capacity.ON_DEMAND), "the run back on an on-demand node", timeout_s=30)
    _accrue()
    controller.nodes.delete(ZONE, NODE, wait=True)
    both = _apart(controller, emulator_admin.billing())
    assert len(both) == 2, both
    assert all(abs(ours - billed) <= 0.02 * billed for ours, billed in both.values()), both
    memory = runs.load_memory(controller.store, RUN)[0]
    assert memory.capacity is Capacity.ON_DEMAND and "promoted" in [e["kind"] for e in memory.events]
    controller.release()


def test_a_run_whose_agent_trained_every_step_is_not_promoted(controller: Controller) -> None:
    """The agent trained its last step after the sweep pass read its status: ``promote_run`` reads it again and
    leaves the run be (its node, the memory), so that the run pass reads the agent's end instead."""
    poll(lambda: _ready(controller, Capacity.SPOT), "the spot node READY, seen by a pass", timeout_s=30)
    done = runs.AgentStatus.model_validate({**LIVE, "run_id": RUN, "step": LIVE["total_steps"]})
    controller.store.write_bytes(runs.status_key(RUN), done.model_dump_json().encode())

    assert not promote_run(controller.store, controller.nodes, controller.leases, RUN, time.time())
    node = controller.nodes.provider.find_node(ZONE, NODE)
    assert node is not None and node.state is NodeState.READY and node.capacity is Capacity.SPOT
    memory = runs.load_memory(controller.store, RUN)[0]
    assert memory.capacity is None and "promoted" not in [e["kind"] for e in memory.events]
    controller.release()
