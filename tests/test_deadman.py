"""The dead-man's switch: with no controller watching, a node whose job ended deletes itself."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuops.config import load_settings
from tpuops.emulator.control import EmulatorInfo, start_background, stop
from tpuops.ledger import Ledger
from tpuops.provision import Provisioner, plan_up
from tpuops.tpu import NodeState, TpuApi

REPO = Path(__file__).resolve().parents[1]
ZONE = "us-central1-a"


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorInfo]:
    info = start_background(tmp_path_factory.mktemp("deadman"), boot_delay_s=0.2, grace_s=2.0,
                            image_python=str(REPO / ".venv-tf29" / "bin" / "python"))
    yield info
    stop(info.state_dir)


def _provisioner(emulator: EmulatorInfo, home: Path) -> Provisioner:
    settings = load_settings(environ={"TPUOPS_HOME": str(home), "TPUOPS_ZONES": ZONE}, config_path=None)
    api = TpuApi(settings.project, endpoint=emulator.endpoint, poll_interval_s=0.05)
    return Provisioner(api, settings, Ledger(settings.ledger_path))


@pytest.mark.parametrize("code", [0, 1, 3])
def test_finished_job_deletes_its_own_node(emulator: EmulatorInfo, tmp_path: Path, code: int) -> None:
    provisioner = _provisioner(emulator, tmp_path)
    name = f"dms-{code}"
    plan = plan_up(provisioner.settings, name, job=["/bin/sh", "-c", f"exit {code}"])
    provisioner.up(plan)
    deadline = time.monotonic() + 60
    while provisioner.api.find_node(ZONE, name) is not None:
        assert time.monotonic() < deadline, "the node did not delete itself"
        time.sleep(0.1)
    log = (emulator.state_dir / "nodes" / provisioner.settings.project / ZONE / name / "tpuops" / "startup.log")
    text = log.read_text()
    assert f"job exited with {code}" in text and f"deleting node {name} in {ZONE}" in text


def test_preempted_job_leaves_the_node_to_the_controller(emulator: EmulatorInfo, tmp_path: Path) -> None:
    provisioner = _provisioner(emulator, tmp_path)
    plan = plan_up(provisioner.settings, "dms-143", job=["/bin/sh", "-c", "exit 143"])
    provisioner.up(plan)
    log = emulator.state_dir / "nodes" / provisioner.settings.project / ZONE / "dms-143" / "tpuops" / "startup.log"
    deadline = time.monotonic() + 60
    while not (log.exists() and "job exited with 143" in log.read_text()):
        assert time.monotonic() < deadline, "the job never ended"
        time.sleep(0.1)
    assert provisioner.api.get_node(ZONE, "dms-143").state is NodeState.READY
    assert "deleting node" not in log.read_text()
    provisioner.down(["dms-143"])
