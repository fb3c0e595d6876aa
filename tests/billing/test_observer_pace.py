"""How the billing observer dates what no call dates when its looks are missed or lag (issue 38's first defect).

A change away from READY is dated within the gap between sightings, no further back than half a pace; the pace is
measured, never taken from a single gap (which may be the outage that kept the looks away), and the listings that
failed count as looks. A repair a listing shows is looked up: a listing that lags shows it after its end.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tpuops.billing.ledger import Ledger
from tpuops.config import Settings, load_settings
from tpuops.core.clock import UTC, VirtualClock
from tpuops.core.kinds import Capacity
from tpuops.core.naming import MANAGED_BY_KEY, MANAGED_BY_VALUE, RUN_KEY
from tpuops.fleet import Fleet
from tpuops.providers.cloud_tpu.adapter import TpuApi
from tpuops.providers.nodes import NodeInfo, NodeState

pytestmark = pytest.mark.unit

P, ZONE = "tpuops-local", "us-central1-b"
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _fleet(tmp_path: Path) -> Fleet:
    config = tmp_path / "tpuops.toml"
    config.write_text("")
    settings: Settings = load_settings(config_path=config,
                                       environ={"TPUOPS_HOME": str(tmp_path / "home"), "TPUOPS_ZONES": ZONE})
    return Fleet(TpuApi(P), settings, Ledger(tmp_path / "ledger.sqlite"), clock=VirtualClock(T0.timestamp()))


def _list(fleet: Fleet, seconds: float, state: NodeState) -> None:
    """A listing of the zone asked at ``seconds`` (and answered then) that shows the node in ``state``."""
    fleet.billing.clock.advance_to(at(seconds).timestamp())  # type: ignore[attr-defined]
    fleet.billing.listed(ZONE, {"n": _node(state)}, at(seconds))


def _node(state: NodeState) -> NodeInfo:
    return NodeInfo(name="n", zone=ZONE, project=P, accelerator="v2-8", runtime="tpu-vm-tf-2.9.3",
                    capacity=Capacity.SPOT, state=state, health="",
                    labels={MANAGED_BY_KEY: MANAGED_BY_VALUE, RUN_KEY: "r-1"}, create_time=at(0), uid="7")


def _states(fleet: Fleet) -> list[tuple[str, datetime]]:
    return [(t.state, t.at) for t in fleet.billing.ledger.transitions(P, ZONE, "n")]


def test_a_preemption_is_dated_at_the_pace_of_the_looks_the_failed_listings_too(tmp_path: Path) -> None:
    """Listings every 60 s, of which only one in seven gets through: the preemption seen at 1260 s is dated half a
    pass back (1230 s), not half the 420 s between the listings that got through (1050 s: up to 180 s of billing
    missing, the swarm's seed 5658)."""
    fleet = _fleet(tmp_path)
    for t in range(0, 1260, 60):
        if t % 420:
            fleet.billing.unlisted(ZONE, at(t))
        else:
            _list(fleet, t, NodeState.READY)
    _list(fleet, 1260, NodeState.PREEMPTED)
    assert _states(fleet) == [("READY", at(0)), ("PREEMPTED", at(1230))]


@pytest.mark.parametrize(("early", "preempted"), [(None, 3450), (930, 3465), (3330, 3585)])
def test_a_look_that_came_early_sets_no_pace(tmp_path: Path, early: int | None, preempted: int) -> None:
    """Listings every 300 s, and one more 30 s after one of them (a pass overrunning into the next): the preemption
    seen at 3600 s is dated near the middle of the gap since the last look (3450 s), not within half of that 30 s
    of the sighting (3585 s, what the shortest gap ever gave: the swarm's seed 8200, 220 s and 260 s of READY the cloud
    never billed). The gaps around the early look (30 s, 270 s) make a pace of 270 s: 15 s on the safe side. Right
    after it, where the node's own last gap is that short one, the date stays near the sighting
    (money.ledger_matches_billing allows the gap less the one before)."""
    fleet = _fleet(tmp_path)
    for t in sorted({*range(0, 3600, 300), *([early] if early else [])}):
        _list(fleet, t, NodeState.READY)
    _list(fleet, 3600, NodeState.PREEMPTED)
    assert _states(fleet) == [("READY", at(0)), ("PREEMPTED", at(preempted))]


@pytest.mark.parametrize(("found", "ready"), [
    (NodeState.READY, 750),  # the lookup says READY at 900 s: within the gap since the last look (600 s)
    (None, 1050),  # the lookup finds nothing: the listing's word (its end is gone's to date)
])
def test_a_repair_a_listing_shows_is_looked_up(tmp_path: Path, found: NodeState | None, ready: float) -> None:
    """A listing that lags shows the node REPAIRING at 900 s after the repair's end: the lookup (GetNode) says
    READY, and the return to READY is dated before 900 s, not after the lag (the swarm's seeds 2733, 8325: up to
    802 s missing)."""
    fleet = _fleet(tmp_path)
    fleet.billing.find_node = lambda zone, name: _node(NodeState.REPAIRING)
    for t, state in ((0, NodeState.READY), (300, NodeState.READY), (600, NodeState.REPAIRING)):
        _list(fleet, t, state)
    fleet.billing.find_node = lambda zone, name: None if found is None else _node(found)
    _list(fleet, 900, NodeState.REPAIRING)
    _list(fleet, 1200, NodeState.READY)
    assert _states(fleet) == [("READY", at(0)), ("REPAIRING", at(450)), ("READY", at(ready))]
