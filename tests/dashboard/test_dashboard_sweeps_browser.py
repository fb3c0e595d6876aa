"""The dashboard's Sweeps pages in a real browser: a one-trial digits sweep on the emulator (real TF 2.9),
then its trials table, and optuna-dashboard mounted over the sweep's study in the store journal.

The dashboard runs ``--read-only`` here: its pages draw no action, and optuna-dashboard still answers.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest
from browser import browser, dashboard_process, drawn  # noqa: F401  (browser: the fixture)
from helpers import poll

from tests.sweeps.test_sweep_e2e import SWEEP, World, world  # noqa: F401  (world: the fixture)
from tpuops.sweeps.hparams import event_key

pytestmark = [pytest.mark.emulator, pytest.mark.tf, pytest.mark.slow]

NAME = "shown"


@pytest.fixture(scope="module")
def finished_sweep(world: World) -> str:  # noqa: F811  (the imported fixture)
    """A sweep of one trial, driven to its end by reconcile passes."""
    text = SWEEP.format(name=NAME, pruner="none").replace("trials: 3", "trials: 1").replace("parallel: 2",
                                                                                           "parallel: 1")
    world.start(world.sweep_file(NAME, text))
    world.drive(NAME, world.controller(NAME))
    return NAME


def test_the_sweeps_pages_list_the_trials_and_optuna_dashboard_answers_for_the_study(
        world: World, finished_sweep: str, browser: Any) -> None:  # noqa: F811  (imported fixtures)
    with dashboard_process(world.work, world.env, "--read-only") as url:
        base = url.split("/?")[0]
        browser.get(url)
        browser.get(f"{base}/sweeps")  # the shell first; the rows come from the data API
        poll(lambda: drawn(browser, f'#sweeps tr[data-sweep="{finished_sweep}"]') == 1, "the sweeps list")
        browser.get(f"{base}/sweeps/{finished_sweep}")
        cells = poll(lambda: [td.text for td in browser.find_elements("css selector", '#trials tr[data-trial="0"] td')],
                     "the trials table")
        assert browser.find_element("id", "progress").get_attribute("hidden") is not None  # the read is over
        assert cells[1] == f"{finished_sweep}-t0000" and cells[3] == "COMPLETE"
        assert "learning_rate=" in cells[2] and float(cells[4]) > 0
        assert drawn(browser, "button[data-action]") == 0  # read-only
        browser.get(f"{base}/sweeps/{finished_sweep}/optuna")
        assert urlsplit(browser.current_url).path.startswith("/dashboard")
        studies = browser.execute_async_script(
            "const done = arguments[0];"
            "fetch('/api/studies').then((r) => r.json()).then((body) => done(body.study_summaries));")
        assert [s["study_name"] for s in studies] == [finished_sweep]
        poll(lambda: finished_sweep in browser.find_element("tag name", "body").text,
             "optuna-dashboard to render the study", timeout_s=30)
    assert world.store.exists(event_key(finished_sweep, 0))  # the told trial, as a TensorBoard HParams session
