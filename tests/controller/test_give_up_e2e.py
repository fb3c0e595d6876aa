"""``train`` and ``sweep start`` give up while the Cloud TPU API fails every request (issue 30, item 8).

The reproduction: with every API request failing, ``train`` stayed pending past 300 s, and the run it had
declared was launched later by a plain ``reconcile``, after the user had given up on it. Now each gives up after
``launch_give_up_s`` with one line and exit 1, and what it declared is withdrawn: once the API answers again, a
pass launches nothing, and the emulator's billing record holds no node of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import REPO

from tpuops.data.samples import digits
from tpuops.emulator.control import AdminClient, EmulatorInfo, start_background, stop

pytestmark = pytest.mark.emulator



@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, EmulatorInfo]]:
    work = tmp_path_factory.mktemp("giveup")
    digits(work / "data" / "digits")
    info = start_background(work / "home" / "emulator", boot_delay_s=0.2, grace_s=2.0)
    yield work, info
    stop(info.state_dir)


@pytest.fixture
def failing(world: tuple[Path, EmulatorInfo]) -> Iterator[AdminClient]:
    admin = AdminClient(world[1].endpoint)
    admin.set_faults(error_rate=1.0)
    yield admin
    admin.clear_faults()


def _tpuops(work: Path, info: EmulatorInfo, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUOPS_")}
    config = work / "tpuops.toml"
    config.write_text('zones = ["us-central1-a", "us-central1-b"]\n')
    env.update(TPUOPS_HOME=str(work / "home"), TPUOPS_CONFIG=str(config), TPUOPS_TPU_ENDPOINT=info.endpoint,
               TPUOPS_POLL_INTERVAL_S="0.2", TPUOPS_API_DEADLINE_S="1", TPUOPS_LAUNCH_GIVE_UP_S="2")
    done = subprocess.run([sys.executable, "-m", "tpuops", *args], cwd=work, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    return done.returncode, done.stdout, done.stderr


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err
    lines = err.splitlines()
    assert [line for line in lines if line.startswith("error: ")] == [lines[-1]], err
    return lines[-1]


def _nothing_launched_later(world: tuple[Path, EmulatorInfo], admin: AdminClient, prefix: str,
                            billed: int = 0) -> None:
    """The API answers again: passes launch nothing, and ``billed`` nodes of ``prefix`` were ever billed."""
    work, info = world
    admin.clear_faults()
    for _ in range(2):
        code, _, err = _tpuops(work, info, "reconcile", "--no-wake")
        assert code == 0, err
    assert [n for n in admin.nodes() if n.get("name", "").rsplit("/", 1)[-1].startswith(prefix)] == []
    assert len([i for i in admin.billing() if i["node"].rsplit("/", 1)[-1].startswith(prefix)]) == billed


def test_train_gives_up_in_one_line_and_its_run_is_never_launched_later(
        world: tuple[Path, EmulatorInfo], failing: AdminClient) -> None:
    work, info = world
    code, out, err = _tpuops(work, info, "train", str(REPO / "experiments" / "digits_cnn.yaml"), "--name", "stuck")
    assert code == 1 and out == ""
    line = _one_error_line(err)
    assert "stuck" in line and "failed every request for 2 s" in line and "withdrawn" in line
    memory = json.loads((work / "home" / "store" / "runs" / "stuck" / "memory.json").read_text())
    assert (memory["phase"], memory["outcome"], memory["attempts"]) == ("finished", "failed", 0)
    assert not (work / "home" / "store" / "index" / "active" / "stuck").exists()
    _nothing_launched_later(world, failing, "stuck")


def test_sweep_start_gives_up_in_one_line_and_leaves_no_sweep_active(
        world: tuple[Path, EmulatorInfo], failing: AdminClient) -> None:
    work, info = world
    sweep = work / "sweeps" / "digits_lr.yaml"
    sweep.parent.mkdir(exist_ok=True)
    (work / "experiments").mkdir(exist_ok=True)
    for name in ("digits_cnn.yaml", "models.py"):
        (work / "experiments" / name).write_text((REPO / "experiments" / name).read_text())
    sweep.write_text((REPO / "sweeps" / "digits_lr.yaml").read_text())
    code, _, err = _tpuops(work, info, "sweep", "start", str(sweep))
    assert code == 1
    line = _one_error_line(err)
    assert "digits-lr-t0000" in line and "withdrawn" in line
    code, out, err = _tpuops(work, info, "sweep", "list", "--json")
    assert code == 0, err
    [listed] = [s for s in json.loads(out) if s["sweep"] == "digits-lr"]
    assert (listed["phase"], listed["outcome"]) == ("finished", "failed")
    _nothing_launched_later(world, failing, "digits-lr")


def test_resume_of_a_stopped_run_gives_up_too_and_nothing_is_launched_later(world: tuple[Path, EmulatorInfo]) -> None:
    work, info = world
    admin = AdminClient(info.endpoint)
    code, _, err = _tpuops(work, info, "train", str(REPO / "experiments" / "digits_cnn.yaml"), "--name", "paused",
                           "--detach")
    assert code == 0, err
    code, _, err = _tpuops(work, info, "stop", "paused")
    assert code == 0, err
    admin.set_faults(error_rate=1.0)
    try:
        code, _, err = _tpuops(work, info, "train", "--resume", "paused")
    finally:
        admin.clear_faults()
    assert code == 1
    assert "withdrawn" in _one_error_line(err)
    memory = json.loads((work / "home" / "store" / "runs" / "paused" / "memory.json").read_text())
    assert (memory["phase"], memory["outcome"], memory["attempts"]) == ("finished", "failed", 1)
    _nothing_launched_later(world, admin, "paused", billed=1)  # the node it had before its stop, only
