"""``checkpoint: {every: auto}``: Young/Daly's interval (``tpuops/contract/interval.py``) and how a run asks for it."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import yaml
from helpers import REPO

from tpuops.config import Settings
from tpuops.contract.interval import FIRST_SAVE_S, MAX_INTERVAL_S, MIN_INTERVAL_S, young_daly_s
from tpuops.data.samples import digits
from tpuops.launch import jobs
from tpuops.store import LocalStore

pytestmark = pytest.mark.unit



@pytest.mark.parametrize(("save_s", "rate", "interval"), [
    (10.0, 0.2, 600.0),  # sqrt(2 x 10 s / (0.2 / 3600 s)) = sqrt(360,000)
    (30.0, 0.05, math.sqrt(2 * 30 / (0.05 / 3600))),  # about 38 min
    (2.0, 1.8, 89.4),  # sqrt(2 x 2 s x 3600 / 1.8) = sqrt(8,000)
])
def test_auto_picks_the_young_daly_interval_for_a_save_cost_and_a_rate(save_s: float, rate: float,
                                                                        interval: float) -> None:
    expected = math.sqrt(2 * save_s / (rate / 3600))
    assert young_daly_s(save_s, rate) == pytest.approx(expected)
    assert young_daly_s(save_s, rate) == pytest.approx(interval, rel=0.01)


def test_the_interval_stays_between_a_minute_and_a_day() -> None:
    assert young_daly_s(0.0, 0.5) == MIN_INTERVAL_S
    assert young_daly_s(600.0, 1e-6) == MAX_INTERVAL_S
    assert young_daly_s(10.0, 0.0) == MAX_INTERVAL_S


def test_an_auto_experiment_saves_by_time_from_the_first_interval_and_tells_the_agent_the_rate(tmp_path: Path) -> None:
    work = tmp_path / "work"
    digits(work / "data" / "digits")
    shutil.copytree(REPO / "experiments", work / "experiments", ignore=shutil.ignore_patterns("__pycache__"))
    spec = work / "experiments" / "digits_cnn.yaml"
    document = yaml.safe_load(spec.read_text())
    document["checkpoint"] = {"every": "auto", "keep": 2}
    spec.write_text(yaml.safe_dump(document))
    settings = Settings(zones=["us-central1-a"], home=tmp_path / "home", store=str(tmp_path / "store"),
                        lost_work_per_hour=0.2)
    plan = jobs.plan_train(settings, spec, LocalStore(tmp_path / "store"), run_id="auto-1", base_dir=work)
    train = plan.spec.train
    assert train is not None and train.checkpoint_every_steps == 0 and train.checkpoint_loss_rate_per_hour == 0.2
    assert train.checkpoint_every_seconds == young_daly_s(FIRST_SAVE_S, 0.2) == pytest.approx(600.0)


def test_status_shows_the_interval_in_use_next_to_the_last_checkpoint() -> None:
    from tpuops.cli.nodes import _checkpoint_cell

    assert _checkpoint_cell({"last_checkpoint_step": 40, "checkpoint_in_flight": 50,
                             "checkpoint_every_s": 612.3}) == "40 (saving 50), every 612 s"
    assert _checkpoint_cell({"last_checkpoint_step": None, "checkpoint_every_s": 600.0}) == "every 600 s"
    assert _checkpoint_cell({"last_checkpoint_step": 40, "checkpoint_every_s": 0}) == "40"  # by steps only
    assert _checkpoint_cell({"last_checkpoint_step": 40, "checkpoint_every_s": 612.3, "last_save_s": 4.24}) == \
        "40, every 612 s, save 4.2 s"
