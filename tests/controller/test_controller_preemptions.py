"""Every preemption a run recovers from is counted once (``tpuops.controller.preemptions``): a node listed READY whose
agent left on a preemption notice (a listing that lags) is a preemption, not a hang; a counted preemption is written
before its node is deleted, so that neither a failed memory write nor a kill loses it or counts it twice.

The decisions are ``decide``'s, pure; the passes are the real controller's over the in-memory provider, the real
store (whose memory writes a test fails, as a store answering 503 does), Fleet and ledger.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from helpers import controller_over, declare_run

from tpuops import runs
from tpuops.billing.ledger import Ledger
from tpuops.config import Settings
from tpuops.controller.decide import Observed, Policy, decide
from tpuops.core.errors import TransientError
from tpuops.core.kinds import Capacity
from tpuops.core.naming import ATTEMPT_KEY
from tpuops.fleet import Fleet
from tpuops.providers.memory import MemoryProvider
from tpuops.providers.nodes import NodeState
from tpuops.runs import AgentStatus, Memory, Outcome
from tpuops.store import open_store

pytestmark = pytest.mark.unit

A = "us-central1-a"
POLICY = Policy(zones=(A,), evidence_passes=2, max_crashes=2, hang_after_s=600.0, boot_timeout_s=300.0)
READY_AT = 1000.0  # the run's node was created at 900 and seen READY at 1000


def left(attempt: int, started: float, step: int = 60) -> AgentStatus:
    """The status of an agent that saved at ``step`` on a preemption notice and left, its attempt begun at
    ``started``."""
    return AgentStatus.model_validate({
        "attempt": attempt, "step": step, "exit_class": "preempted", "phase": "done", "last_checkpoint_step": step,
        "started": datetime.fromtimestamp(started, timezone.utc).isoformat()})


def listed(state: NodeState, agent: AgentStatus | None = None, capacity: Capacity = Capacity.SPOT) -> Observed:
    return Observed(listed=True, node_state=state, node_zone=A, node_uid="u1", node_capacity=capacity,
                    node_created=900.0, status=agent)


def actions(memory: Memory, observed: Observed, now: float) -> list[str]:
    return [action.kind.value for action in decide(memory, observed, now, POLICY).actions]


def running() -> Memory:
    """A run whose node (created at 900) is READY since ``READY_AT`` with attempt 1 of its agent training."""
    memory = Memory(attempts=1, zone=A)
    alive = AgentStatus.model_validate({"attempt": 1, "step": 20, "phase": "training"})
    assert actions(memory, listed(NodeState.READY, alive), READY_AT) == []
    return memory


def test_a_node_listed_ready_whose_agent_left_on_a_preemption_notice_is_a_preemption_not_a_hang() -> None:
    memory = running()
    notice = left(1, started=950.0)
    assert actions(memory, listed(NodeState.READY, notice), READY_AT + 100) == []  # the listing may catch up
    assert actions(memory, listed(NodeState.READY, notice), READY_AT + POLICY.boot_timeout_s + 1) == \
        ["delete", "create"]
    assert (memory.preemptions, memory.crashes, memory.hangs) == (1, 0, 0)
    assert "left by its agent on a preemption notice" in memory.events[-2]["message"]


@pytest.mark.parametrize(("started", "capacity"), [(850.0, Capacity.SPOT), (950.0, Capacity.ON_DEMAND)],
                         ids=["attempt-on-the-node-before", "on-demand"])
def test_a_notice_from_another_node_or_on_an_on_demand_one_leaves_the_hang_rule(started: float,
                                                                                capacity: Capacity) -> None:
    """An attempt that began before the node was created ran on the node we replaced (our delete gave it the
    notice); an on-demand node's maintenance event repairs it. Neither is a preemption of the node listed."""
    memory = running()
    observed = listed(NodeState.READY, left(1, started=started), capacity=capacity)
    assert actions(memory, observed, READY_AT + POLICY.boot_timeout_s + 1) == ["delete", "create"]
    assert (memory.preemptions, memory.crashes, memory.hangs) == (0, 1, 1)


def test_a_counted_preemption_is_written_before_its_node_is_deleted_and_a_kill_after_it_counts_it_once() -> None:
    memory = running()
    decision = decide(memory, listed(NodeState.PREEMPTED, left(1, started=950.0)), READY_AT + 60, POLICY)
    assert [action.kind.value for action in decision.actions] == ["delete", "create"]
    early = decision.ahead
    assert early is not None and early is not memory and early.preemptions == memory.preemptions == 1
    assert early.pending_create is not None and early.pending_create.error == "retry"  # not sent yet
    assert memory.pending_create is not None and memory.pending_create.error is None
    # Killed before the delete: the node is still PREEMPTED, and is replaced without another count.
    again = early.model_copy(deep=True)
    assert actions(again, listed(NodeState.PREEMPTED), READY_AT + 360) == ["delete", "create"]
    assert again.preemptions == 1
    # Killed between the delete and the create: the node is gone, and its replacement is created at once.
    gone = early.model_copy(deep=True)
    assert actions(gone, Observed(listed=True, create_result=early.pending_create.error), READY_AT + 360) == ["create"]
    assert gone.preemptions == 1


def test_nothing_is_written_ahead_of_a_pass_that_counted_no_preemption() -> None:
    memory = running()
    assert decide(memory, listed(NodeState.READY), READY_AT + 60, POLICY).ahead is None
    hang = decide(memory, listed(NodeState.READY), READY_AT + POLICY.boot_timeout_s + 1, POLICY)
    assert [action.kind.value for action in hang.actions] == ["delete", "create"] and hang.ahead is None


class World:
    """One spot run in zone B of the in-memory cloud, passed by the real controller over the real store."""

    ZONE = "us-central1-b"

    def __init__(self, tmp_path: Path) -> None:
        self.settings = Settings(zones=[self.ZONE], home=tmp_path / "home", store=str(tmp_path / "store"),
                                 lease_ttl_s=3600.0, operation_timeout_s=30.0, max_run_hours=0)
        self.store, self.cloud = open_store(self.settings.store_root), MemoryProvider(poll_interval_s=0.01)
        fleet = Fleet(self.cloud, self.settings, Ledger(self.settings.ledger_path))
        self.controller = controller_over(self.settings, self.store, fleet, sweeps=None, holder="test",
                                          status_refresh_s=0.0)
        declare_run(self.settings, self.store, "run-a", self.ZONE)
        self.controller.run_pass()
        self.cloud.set_state(self.ZONE, "run-a", NodeState.READY)
        self.controller.run_pass()

    def fail_memory_writes(self, which: Callable[[int, Memory], bool]) -> None:
        """Fail the run's memory writes that ``which`` names by their number (1 = the next) and the memory they
        write, as a store answering 503 does."""
        write, count = self.store.write_if_generation_match, [0]
        memory_key = runs.layout.memory_key("run-a")

        def failing(key: str, data: bytes, generation: int) -> Any:
            if key == memory_key:
                count[0] += 1
                if which(count[0], Memory.model_validate_json(data)):
                    raise TransientError("simulated: the store answered 503")
            return write(key, data, generation)

        self.store.write_if_generation_match = failing  # type: ignore[method-assign]

    def memory(self) -> Memory:
        return runs.load_memory(self.store, "run-a")[0]

    def state(self) -> NodeState | None:
        node = self.cloud.nodes.get((self.ZONE, "run-a"))
        return node.state if node is not None else None


def test_a_pass_that_cannot_write_the_preemption_it_counted_leaves_the_node_for_the_next(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.cloud.set_state(World.ZONE, "run-a", NodeState.PREEMPTED)
    world.fail_memory_writes(lambda n, _: n == 1)
    report = world.controller.run_pass()
    assert report.acted == [] and "503" in report.errors["run-a"]
    assert world.state() is NodeState.PREEMPTED and world.memory().preemptions == 0  # the evidence stays
    report = world.controller.run_pass()
    assert [what for _, what, _ in report.acted] == ["delete", "create"]
    assert world.memory().preemptions == 1 and world.state() is NodeState.CREATING


def test_a_preemption_whose_replacement_failed_and_whose_last_write_was_lost_stays_counted(tmp_path: Path) -> None:
    """The replacement's create is refused and the memory write after it fails: no node carries the count, and only
    the write ahead of the delete keeps it (before, the run counted 0 preemptions; the swarm's seed 475)."""
    world = World(tmp_path)
    world.cloud.set_state(World.ZONE, "run-a", NodeState.PREEMPTED)
    world.cloud.faults[("CreateNode", "run-a")] = TransientError("simulated: 503 from CreateNode")
    world.fail_memory_writes(lambda _, memory: "create-failed" in [e["kind"] for e in memory.events])  # the last
    report = world.controller.run_pass()
    assert [what for _, what, _ in report.acted] == ["delete", "create"] and world.state() is None
    assert world.memory().preemptions == 1
    del world.cloud.faults[("CreateNode", "run-a")]
    report = world.controller.run_pass()
    assert [what for _, what, _ in report.acted] == ["create"]
    assert world.memory().preemptions == 1 and world.state() is NodeState.CREATING


def test_a_node_whose_create_the_memory_lost_while_it_said_going_is_the_runs_and_its_preemption_counts(
        tmp_path: Path) -> None:
    """Stopped, then resumed: the memory says the run's node is going on purpose (``Memory.deleting``). The pass that
    creates the next node loses its memory write, and the cloud preempts that node: it carries the attempt it was
    created for (``tpuops.core.naming.ATTEMPT_KEY``), later than the memory knows, so the next pass adopts it and
    counts its preemption (before, it took it for the node the stop deleted and counted none: the swarm's seeds
    5739 and 6192)."""
    world = World(tmp_path)
    runs.request_stop(world.store, "run-a", "stop by the user", 2000.0)
    world.controller.run_pass()
    assert world.memory().finished and world.state() is None
    assert runs.reopen(world.store, "run-a", "train --resume")
    world.fail_memory_writes(lambda n, _: n == 1)
    report = world.controller.run_pass()
    assert [what for _, what, _ in report.acted] == ["create"] and "503" in report.errors["run-a"]
    assert world.cloud.nodes[(World.ZONE, "run-a")].labels[ATTEMPT_KEY] == "2"
    assert world.memory().attempts == 1 and world.memory().deleting  # the create is not remembered
    world.cloud.set_state(World.ZONE, "run-a", NodeState.PREEMPTED)
    report = world.controller.run_pass()
    assert [what for _, what, _ in report.acted] == ["delete", "create"]
    memory = world.memory()
    assert (memory.preemptions, memory.attempts) == (1, 3)
    assert [e["kind"] for e in memory.events][-3:] == ["adopted", "preempted", "create"]
    assert world.cloud.nodes[(World.ZONE, "run-a")].labels[ATTEMPT_KEY] == "3"


def test_a_node_of_an_attempt_the_memory_knows_is_not_adopted_again() -> None:
    """A node whose attempt the memory already holds (or one from before the label, 0) changes nothing: the node a
    stop deleted, listed PREEMPTED after the run was resumed, is still no preemption to the run."""
    memory = running()
    memory.finish(READY_AT + 10, Outcome.STOPPED, "stop by the user")
    assert memory.reopen(READY_AT + 20, "train --resume")
    for attempt in (0, 1):
        again = memory.model_copy(deep=True)
        observed = dataclasses.replace(listed(NodeState.PREEMPTED), node_attempt=attempt)
        assert actions(again, observed, READY_AT + 60) == ["delete", "create"]
        assert (again.preemptions, again.attempts) == (0, 2) and "adopted" not in [e["kind"] for e in again.events]
