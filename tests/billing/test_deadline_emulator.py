"""A run under a deadline on the emulator: preempted when the deadline no longer allows spot, it moves to on-demand.

The real controller (its passes, the Fleet, the official client against the emulator) steers the run
by ``tpuops.billing.deadline``. The run is 50 minutes of work due in an hour: spot fits at first. The node is
preempted; while it was down ten minutes pass for the controller (its clock is moved, as a simulation
moves it: nobody waits for them), so the work no longer fits on spot and the replacement is on-demand,
with the move and its reason in the run's events. The agent is played by the test (its status written
to the store, as the agent writes it) and the nodes run a script that exits at once: the capacity
decisions need no TensorFlow. The run then succeeds before its deadline and its node is deleted.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from helpers import controller_over, poll

from tpuops import runs
from tpuops.billing.ledger import Ledger
from tpuops.config import Settings
from tpuops.controller.reconcile import Controller
from tpuops.core.kinds import Capacity
from tpuops.core.naming import MetadataKey
from tpuops.fleet import Fleet
from tpuops.launch.provision import plan_up
from tpuops.providers.cloud_tpu.adapter import TpuApi
from tpuops.providers.nodes import NodeState
from tpuops.runs import NodeSpec, Outcome, RunKind, RunRecord
from tpuops.store import open_store

pytestmark = pytest.mark.emulator

PROJECT, ZONE, RUN = "tpuops-local", "us-central1-b", "due-run"
QUICK_SCRIPT = "#!/bin/bash\nexit 0\n"
TOTAL = 1000


class Shifted:
    """Wall time plus an offset the test moves forward: time that passes for the controller, not the test."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def _status(attempt: int, step: int, done: bool = False) -> runs.AgentStatus:
    return runs.AgentStatus(run_id=RUN, command=RunKind.TRAIN, attempt=attempt, phase="done" if done else "training",
                            step=step, total_steps=TOTAL, exit_class="succeeded" if done else None,
                            exit_code=0 if done else None)


def _node(controller: Controller, capacity: Capacity, state: NodeState = NodeState.READY) -> bool:
    controller.run_pass()
    node = controller.nodes.provider.find_node(ZONE, RUN)
    return node is not None and node.state is state and node.capacity is capacity


def test_a_preempted_run_short_of_time_moves_to_on_demand_and_finishes_on_time(emulator: Any, emulator_admin: Any,
                                                                                tmp_path: Path) -> None:
    settings = Settings(zones=[ZONE], home=tmp_path / "home", store=str(tmp_path / "store"), max_run_hours=0,
                        tpu_endpoint=emulator.endpoint, poll_interval_s=0.05, operation_timeout_s=30,
                        spot_preemptions_per_hour=0.1, recovery_s=60.0)
    provider = TpuApi(settings.project, endpoint=emulator.endpoint, token=emulator.token, poll_interval_s=0.05,
                      deadline_s=20)
    store = open_store(settings.store_root)
    request = plan_up(settings, RUN, accelerator="v3-8", capacity=Capacity.SPOT, zone=ZONE, run_id=RUN).request
    request = request.model_copy(update={"metadata": {MetadataKey.STARTUP_SCRIPT.value: QUICK_SCRIPT}})
    due = time.time() + 3600
    record = RunRecord(run_id=RUN, kind=RunKind.TRAIN, node=NodeSpec.of(request, [ZONE]), experiment="x",
                       deadline_at=due, expected_s=3000.0)
    runs.declare(store, record, {"run_id": RUN})
    clock = Shifted()
    controller = controller_over(settings, store, Fleet(provider, settings, Ledger(settings.ledger_path)), sweeps=None,
                                 holder="test", status_refresh_s=0.0, clock=clock)
    try:
        poll(lambda: _node(controller, Capacity.SPOT), "the run on a READY spot node", timeout_s=30)
        store.write_bytes(runs.status_key(RUN), _status(1, 10).model_dump_json().encode())
        controller.run_pass()
        assert runs.load_memory(store, RUN)[0].capacity is None  # 50 min of work fits the hour on spot

        emulator_admin.preempt(PROJECT, ZONE, RUN, grace_s=0.0)
        poll(lambda: (n := provider.find_node(ZONE, RUN)) is not None and n.state is NodeState.PREEMPTED,
             "the spot node PREEMPTED", timeout_s=30)
        clock.offset = 600.0  # ten minutes pass while the node is down: 49.5 min of work, 50 min left
        poll(lambda: _node(controller, Capacity.ON_DEMAND), "the run back on a READY on-demand node", timeout_s=30)
        memory = runs.load_memory(store, RUN)[0]
        moves = [e for e in memory.events if e["kind"] == "capacity"]
        assert memory.capacity is Capacity.ON_DEMAND and memory.preemptions == 1
        assert len(moves) == 1 and moves[0]["message"].endswith("moving from spot to on-demand at the next checkpoint")
        assert "before the deadline" in moves[0]["message"]

        store.write_bytes(runs.status_key(RUN), _status(2, TOTAL, done=True).model_dump_json().encode())
        poll(lambda: controller.run_pass() and provider.find_node(ZONE, RUN) is None, "the finished run's node gone",
             timeout_s=30)
        memory = runs.load_memory(store, RUN)[0]
        finished = next(e["at"] for e in memory.events if e["kind"] == "finished")
        assert memory.outcome is Outcome.SUCCEEDED and finished < due
    finally:
        controller.release()
