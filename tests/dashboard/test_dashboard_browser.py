"""The dashboard in a real browser: headless Chromium from Debian, driven by Selenium through Debian's chromedriver.

A digits run is started on the emulator (real TF 2.9), driven by a controller in this process, and
preempted once while its run page is open. The page must then draw the preemption and the recovery
in its timeline (asserted on the drawn SVG elements) and follow the log live, without a reload.
``tpuops dashboard`` runs as a user runs it: a separate process, its URL read from its first line.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from browser import browser, dashboard_process, drawn  # noqa: F401  (browser: the fixture)
from helpers import poll

from tests.controller.test_controller_e2e import NOTICE_S, Driving, World, world  # noqa: F401  (world: the fixture)
from tpuops.launch import jobs

pytestmark = [pytest.mark.emulator, pytest.mark.tf, pytest.mark.slow]


@pytest.fixture(scope="module")
def dashboard(world: World) -> Iterator[str]:  # noqa: F811  (the imported fixture)
    with dashboard_process(world.work, world.env) as url:
        yield url


def test_a_preempted_run_shows_its_preemption_and_recovery_and_its_log_follows_live(
        world: World, dashboard: str, browser: Any) -> None:  # noqa: F811  (imported fixtures)
    run = "shown"
    plan = jobs.plan_train(world.settings, world.sparse, world.store, run_id=run, base_dir=world.work)
    jobs.declare(plan, world.store, world.settings, lambda _text: None)  # long enough to preempt mid-training
    driving = Driving(world.controller("dash-test"), run)
    browser.get(dashboard)  # the token becomes a cookie, the address loses it
    assert "token=" not in browser.current_url
    poll(lambda: world.status(run).get("phase") == "training", "the run to train", timeout_s=150)
    browser.get(dashboard.split("/?")[0] + f"/runs/{run}")
    poll(lambda: drawn(browser, 'svg.timeline rect[data-state="READY"]'), "the timeline to draw a READY node",
         timeout_s=180)
    poll(lambda: world.preempt(run, grace_s=NOTICE_S), "the node READY, to preempt it", timeout_s=60)
    before = poll(lambda: browser.find_element("id", "log").text, "the first log lines", timeout_s=180)
    finished = driving.wait(timeout_s=240)
    assert finished.memory.preemptions == 1
    poll(lambda: drawn(browser, 'svg.timeline line[data-kind="recovery"]'), "the recovery mark", timeout_s=180)
    bars = [tuple(bar) for bar in browser.execute_script(  # one read: the panel may be redrawn meanwhile
        "return Array.from(document.querySelectorAll('svg.timeline rect'), (e) => [e.dataset.lane, e.dataset.state]);")]
    assert ("attempt 2", "TRAINING") in bars, bars
    assert {lane for lane, _ in bars if lane.startswith("node ")} == {f"node {run} #1", f"node {run} #2"}, bars
    assert (f"node {run} #1", "PREEMPTED") in bars, bars
    assert drawn(browser, 'svg.timeline line[data-kind="preemption"]') == 1
    assert "preemption to first new step" in browser.find_element("id", "recoveries").text
    log = poll(lambda: (text := browser.find_element("id", "log").text) != before and text, "the log to grow",
               timeout_s=180)
    assert log.startswith(before)  # it grew in place: the page was never reloaded

    def events_shown() -> set[str]:
        return set(browser.execute_script(
            "return Array.from(document.querySelectorAll('#events td:nth-child(2)'), (e) => e.textContent);"))

    # The panel is read again on the run's "changed" event, which follows the run's end by a refresh or more: the
    # recovery mark and the log above may both have been drawn before the run finished.
    poll(lambda: {"create", "preempted", "finished"} <= events_shown(), "the run's end in its events panel",
         timeout_s=180)
