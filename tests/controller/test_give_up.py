"""When a launch gives up on an API that fails every request (``tpuops.controller.drive``): the pure rules."""

from __future__ import annotations

import pytest

from tpuops.controller.drive import failing, give_up
from tpuops.controller.reconcile import PassReport
from tpuops.runs import Memory, Outcome

pytestmark = pytest.mark.unit

ZONES = ["us-central1-a", "us-central1-b"]


def test_failing_counts_from_the_first_pass_that_listed_none_of_the_zones_until_one_answers() -> None:
    dead, half = PassReport(unlisted_zones=list(ZONES)), PassReport(unlisted_zones=ZONES[:1])
    assert failing(None, dead, ZONES, 10.0) == 10.0
    assert failing(10.0, dead, ZONES, 20.0) == 10.0
    assert failing(10.0, half, ZONES, 30.0) is None  # one zone answered: the API is not failing every request
    assert failing(None, PassReport(), ZONES, 40.0) is None


def test_a_launch_gives_up_only_past_the_limit_and_only_before_any_create_went_out() -> None:
    fresh = Memory()
    assert not give_up(fresh, None, 1000.0, 300.0)
    assert not give_up(fresh, 800.0, 1000.0, 300.0)
    assert give_up(fresh, 700.0, 1000.0, 300.0)
    asked = Memory(attempts=1)  # a create went out: a node may bill, the controller keeps it
    assert not give_up(asked, 0.0, 1000.0, 300.0)
    ended = Memory()
    ended.finish(1.0, Outcome.STOPPED, "tpuops stop")
    assert not give_up(ended, 0.0, 1000.0, 300.0)


def test_a_resumed_run_gives_up_only_while_no_node_of_it_is_wanted_and_none_was_asked_for_since() -> None:
    stopped = Memory(attempts=2)
    stopped.finish(1.0, Outcome.STOPPED, "tpuops stop")
    stopped.reopen(2.0, "tpuops train --resume")  # its node was let go: nothing of it works
    assert give_up(stopped, 0.0, 1000.0, 300.0, asked=2)
    stopped.attempts = 3  # a create went out since the resume
    assert not give_up(stopped, 0.0, 1000.0, 300.0, asked=2)
    working = Memory(attempts=2)  # resumed while unfinished: its node may be READY and billing
    assert not give_up(working, 0.0, 1000.0, 300.0, asked=2)
