"""An elastic experiment's dry run: each size's time and cost, its hazards (assumed, saying so, then learned from the
ledger's stockouts), the deadline policy's choice if the largest is stocked out at launch (``--json`` and the
table), and the simulator stepping a smaller size at its slowdown."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from helpers import REPO, use_home
from typer.testing import CliRunner

from tpuops.cli.main import app
from tpuops.config import load_settings
from tpuops.core.clock import UTC
from tpuops.providers.nodes import NodeState
from tpuops.sim.model import AgentModel, Pace

pytestmark = pytest.mark.unit

ZONES = ("us-central1-a", "us-central1-b")  # v2-32 only in a, v2-8 in b


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The digits experiment on ``[v2-32, v2-8]``, 36,000 steps saved every 10 minutes, due 5 hours after its
    launch."""
    from tpuops.api import data_sample

    (tmp_path / "experiments").mkdir()
    for name in ("digits_cnn.yaml", "models.py"):
        shutil.copy(REPO / "experiments" / name, tmp_path / "experiments" / name)
    text = (tmp_path / "experiments" / "digits_cnn.yaml").read_text()
    (tmp_path / "experiments" / "elastic.yaml").write_text(
        text.replace("per_replica: 64", "per_replica: 8").replace("steps: 600", "steps: 36000")
        .replace("every_steps: 100", "every_steps: 6000").replace("every_seconds: 60", "every_seconds: 600")
        .replace("accelerator: v3-8", "accelerator: [v2-32, v2-8]\nfinish_within: 5h"))
    data_sample("digits", tmp_path / "data" / "digits")
    use_home(tmp_path, monkeypatch, f"zones = {list(ZONES)!r}\n".replace("'", '"'))
    return tmp_path


def _dry_run(*flags: str) -> tuple[dict, str]:
    done = CliRunner().invoke(app, ["train", "experiments/elastic.yaml", "--dry-run", *flags])
    assert done.exit_code == 0, done.output
    return (json.loads(done.stdout) if "--json" in flags else {}), done.output


def test_the_dry_run_forecasts_each_size_and_the_choice_if_the_largest_is_stocked_out(project: Path) -> None:
    shown, _ = _dry_run("--json")
    sizes = shown["forecast"]["sizes"]
    big, small = sizes["sizes"]
    assert (big["accelerator"], big["slowdown"], small["accelerator"], small["slowdown"]) == ("v2-32", 1, "v2-8", 4)
    work_h = sizes["work_hours"]  # 36,000 steps at the assumed 10 steps/s, its saves and setup
    assert 1.0 < work_h < 1.2 and sizes["deadline_hours"] == pytest.approx(5.0, abs=0.01)
    assert big["on_demand"]["usd"] == pytest.approx(work_h * 16 * 1.125, rel=1e-3)  # 16 chips at $1.125
    assert small["on_demand"]["usd"] == pytest.approx(big["on_demand"]["usd"], rel=1e-3)  # 4 chips, 4x as long
    assert small["spot"]["hours"] > 3.9 * big["spot"]["hours"] - 1
    assert not big["stockouts_per_hour"]["learned"] and big["stockouts_per_hour"]["value"] == pytest.approx(0.04)
    assert small["stockouts_per_hour"]["value"] == pytest.approx(0.01)  # one host
    assert big["spell_s"]["source"].startswith("assumed: 2 h")
    plan = sizes["if_stocked_out_at_launch"]
    by_move = {o["move"]: o for o in plan["options"]}
    assert set(by_move) == {"wait", "smaller", "on-demand"} and plan["choice"] in by_move
    assert by_move["wait"]["on_time"] < plan["on_time_needed"]  # a 2-h mean spell may eat a 5-h deadline
    assert plan["choice"] == "smaller" and by_move["smaller"]["usd"] < by_move["on-demand"]["usd"]
    assert shown["run"]["inputs"]["sizes"][1]["accelerator"] == "v2-8"  # what the controller will weigh
    _, table = _dry_run()
    assert "sizes: " in table and "if v2-32 is stocked out at launch" in table and ": smaller" in table
    assert "v2-32 spell_s: 7200 (assumed: 2 h" in table


def test_stockouts_the_ledger_saw_are_learned_per_size(project: Path) -> None:
    """Two v2-32 creates refused for an hour, then one READY for 10,700 s: one stockout of an hour over 3.97 hours."""
    from tpuops.session import open_ledger

    settings = load_settings()
    ledger, t0 = open_ledger(settings), datetime(2026, 1, 1, tzinfo=UTC)
    for uid, created, ready, gone in (("1", 0, None, 60), ("2", 1800, None, 1860), ("3", 3600, 3700, 14400)):
        ledger.record_node(settings.project, ZONES[0], "old", "v2-32", "spot", run_id="old", uid=uid,
                           at=t0 + timedelta(seconds=created))
        if ready is not None:
            ledger.observe(settings.project, ZONES[0], "old", NodeState.READY, t0 + timedelta(seconds=ready), uid=uid)
        ledger.mark_deleted(settings.project, ZONES[0], "old", t0 + timedelta(seconds=gone), uid=uid)
    big = _dry_run("--json")[0]["forecast"]["sizes"]["sizes"][0]
    assert big["spell_s"] == {"value": 3600.0, "learned": True,
                              "source": "learned from 1 stockout that ended in us-central1-a (v2-32, spot)"}
    assert big["stockouts_per_hour"]["learned"]
    assert big["stockouts_per_hour"]["value"] == pytest.approx(1 / ((14400 - 3700) / 3600 + 1))


def test_the_simulated_agent_steps_a_smaller_size_at_its_slowdown() -> None:
    model = AgentModel(total_steps=100, steps_per_s=4.0, slowdown={"v2-8": 4.0})
    assert model.sized(Pace(10.0, 4.0), "v2-8").steps_per_s == 1.0
    assert model.sized(Pace(10.0, 4.0), "v2-32").steps_per_s == 4.0
