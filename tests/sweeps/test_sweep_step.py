"""The controller advances the sweeps through the step it is handed (``reconcile.PassStep``), importing none of them.

``tpuops.api.controller``, the controller of every command, hands it ``tpuops.sweeps.advance.SweepStep``; a
controller built with ``sweeps=None`` reconciles every run and leaves each sweep as it is, and one built without
saying either way is refused. What a pass promises the step: its ``run`` before the runs are read (a run it
declares gets its node in that same pass), its ``tell`` after the runs' actions, neither in a targeted pass, and
a lease it takes released with the pass's own. The store is the real local one, the cloud the in-memory
provider.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from helpers import controller_over, declare_run

from tests.controller.test_controller_pass import ZONE, World, world  # noqa: F401  (world: the fixture)
from tests.sweeps.test_sweep_template import BEFORE, Work, work  # noqa: F401  (work: the fixture)
from tpuops import api, runs
from tpuops.config import Settings
from tpuops.controller.reconcile import Controller
from tpuops.fleet import Fleet
from tpuops.notify.outbox import Round
from tpuops.providers.memory import MemoryProvider
from tpuops.store import Store
from tpuops.store.lease import Leases
from tpuops.sweeps.ops import load_state

pytestmark = pytest.mark.unit

LEASE = "steps/declaring"


class Declaring:
    """A pass step of this test's own: its ``run`` declares one run and takes a lease, and each call notes the
    time it was given and the nodes the cloud had been asked to create by then."""

    def __init__(self, cloud: MemoryProvider) -> None:
        self.cloud = cloud
        self.calls: list[tuple[str, float, list[str]]] = []

    def _created(self) -> list[str]:
        return [name for rpc, name, _ in self.cloud.calls if rpc == "CreateNode"]

    def run(self, now: float, *, settings: Settings, store: Store, fleet: Fleet, leases: Leases,
            held: set[str], progress: Callable[[str], None]) -> dict[str, Any]:
        self.calls.append(("run", now, self._created()))
        declare_run(settings, store, "stepped", ZONE)
        assert leases.acquire(LEASE)
        held.add(LEASE)
        return {"declared": ["stepped"]}

    def tell(self, now: float, round_: Round | None = None) -> None:
        assert round_ is not None  # the pass's deliveries, the sweeps' included, share one time bound
        self.calls.append(("tell", now, self._created()))


def test_the_step_runs_before_the_runs_are_read_and_tells_after_their_actions(
        world: World) -> None:  # noqa: F811  (the imported fixture)
    step = Declaring(world.cloud)
    controller = Controller(world.settings, world.store, world.controller.nodes, billing=world.controller.billing,
                            sweeps=step, holder="stepping", status_refresh_s=0.0)
    report = controller.run_pass()
    assert report.sweeps == {"declared": ["stepped"]}
    assert report.acted == [("stepped", "create", ZONE)]  # what the step declared got its node in the same pass
    [(first, at, before), (then, told_at, after)] = step.calls
    assert (first, before, then, after, told_at) == ("run", [], "tell", ["stepped"], at)
    targeted = controller.run_pass(only="stepped")
    assert targeted.sweeps == {} and len(step.calls) == 2  # a targeted pass runs no step
    other = Leases(world.store, "other", ttl_s=60)
    assert not other.acquire(LEASE)
    controller.release()
    assert other.acquire(LEASE)  # the step's lease went with the pass's own


def test_a_controller_must_be_told_whether_it_advances_sweeps(
        world: World) -> None:  # noqa: F811  (the imported fixture)
    with pytest.raises(TypeError, match="sweeps"):
        Controller(world.settings, world.store, world.controller.nodes)  # type: ignore[call-arg]


def test_the_users_controller_advances_the_sweeps_and_one_without_a_step_leaves_them(
        work: Work) -> None:  # noqa: F811  (the imported fixture)
    from tpuops.session import fleet

    settings, root = work.started(BEFORE + 'node_provider = "memory"\n')
    bare = controller_over(settings, root, fleet(settings), sweeps=None, holder="bare")
    try:
        report = bare.run_pass()
    finally:
        bare.release()
    assert report.sweeps == {} and runs.all_run_ids(root) == []
    assert load_state(root, "frozen")[0].passes == 0  # the sweep is as it was

    users = api.controller(settings)
    try:
        report = users.run_pass()
    finally:
        users.release()
    trials = ["frozen-t0000", "frozen-t0001"]
    assert report.sweeps["advanced"] == ["frozen"] and sorted(report.sweeps["launched"]) == trials
    assert sorted(run_id for run_id, kind, _ in report.acted if kind == "create") == trials
    assert load_state(root, "frozen")[0].passes == 1
