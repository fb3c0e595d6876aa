"""The dead-man's switch: with no controller watching, a node whose job ended deletes itself."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import emulator_fleet, start_tf_emulator

from tpuops.core.naming import MetadataKey
from tpuops.emulator.control import AdminClient, EmulatorInfo, stop
from tpuops.fleet import Fleet
from tpuops.launch.provision import plan_up
from tpuops.providers.nodes import NodeState

pytestmark = [pytest.mark.emulator, pytest.mark.tf]

ZONE = "us-central1-a"


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorInfo]:
    info = start_tf_emulator(tmp_path_factory.mktemp("deadman"))
    yield info
    stop(info.state_dir)




@pytest.mark.parametrize("code", [0, 1, 3])
def test_finished_job_deletes_its_own_node(emulator: EmulatorInfo, tmp_path: Path, code: int) -> None:
    provisioner = emulator_fleet(emulator, tmp_path, ZONE)
    name = f"dms-{code}"
    plan = plan_up(provisioner.settings, name, job=["/bin/sh", "-c", f"exit {code}"])
    provisioner.up(plan)
    deadline = time.monotonic() + 60
    while provisioner.provider.find_node(ZONE, name) is not None:
        assert time.monotonic() < deadline, "the node did not delete itself"
        time.sleep(0.1)
    log = (emulator.state_dir / "nodes" / provisioner.settings.project / ZONE / name / "tpuops" / "startup.log")
    text = log.read_text()
    assert f"job exited with {code}" in text and f"deleting node {name} in {ZONE}" in text


def _log(emulator: EmulatorInfo, provisioner: Fleet, name: str) -> Path:
    return emulator.state_dir / "nodes" / provisioner.settings.project / ZONE / name / "tpuops" / "startup.log"


def _wait_for_line(log: Path, text: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not (log.exists() and text in log.read_text()):
        assert time.monotonic() < deadline, f"{text!r} never appeared in {log}"
        time.sleep(0.1)


LOOP = ["/bin/sh", "-c", "trap 'exit 143' TERM; while :; do sleep 0.1; done"]


def test_preempted_job_leaves_the_node_to_the_controller(emulator: EmulatorInfo, tmp_path: Path) -> None:
    provisioner = emulator_fleet(emulator, tmp_path, ZONE)
    provisioner.up(plan_up(provisioner.settings, "dms-pre", job=LOOP))
    log = _log(emulator, provisioner, "dms-pre")
    _wait_for_line(log, "starting the job")
    AdminClient(emulator.endpoint).preempt(provisioner.settings.project, ZONE, "dms-pre", grace_s=5.0)
    _wait_for_line(log, "job exited with 143 (preempted: TRUE)")
    assert "deleting node" not in log.read_text()
    assert provisioner.provider.get_node(ZONE, "dms-pre").state in (NodeState.READY, NodeState.PREEMPTED)
    provisioner.down(["dms-pre"])


def test_job_past_its_time_limit_is_stopped_and_its_node_deleted(emulator: EmulatorInfo, tmp_path: Path) -> None:
    provisioner = emulator_fleet(emulator, tmp_path, ZONE)
    plan = plan_up(provisioner.settings, "dms-max", job=LOOP, extra_metadata={MetadataKey.MAX_RUN_SECONDS.value: "2"})
    provisioner.up(plan)
    deadline = time.monotonic() + 60
    while provisioner.provider.find_node(ZONE, "dms-max") is not None:
        assert time.monotonic() < deadline, "the node outlived its time limit"
        time.sleep(0.1)
    text = _log(emulator, provisioner, "dms-max").read_text()
    assert "job ran past 2s: stopped" in text and "deleting node dms-max" in text


def test_keep_node_attribute_keeps_the_node(emulator: EmulatorInfo, tmp_path: Path) -> None:
    provisioner = emulator_fleet(emulator, tmp_path, ZONE)
    plan = plan_up(provisioner.settings, "dms-keep", job=["/bin/sh", "-c", "exit 0"],
                   extra_metadata={MetadataKey.KEEP_NODE.value: "true"})
    provisioner.up(plan)
    log = _log(emulator, provisioner, "dms-keep")
    _wait_for_line(log, "tpuops-keep-node is set: the node stays up")
    assert "deleting node" not in log.read_text()
    assert provisioner.provider.find_node(ZONE, "dms-keep") is not None
    provisioner.down(["dms-keep"])


WAIT_FOR_GO = ["/bin/sh", "-c", "while [ ! -f go ]; do sleep 0.1; done"]


def test_a_self_delete_the_api_refuses_is_asked_again_until_it_goes_through(emulator: EmulatorInfo,
                                                                             tmp_path: Path) -> None:
    """The API fails the node's first three DELETEs (an error burst): the node asks again, with backoff, until
    its delete goes through, with no controller. Before, it asked once and stayed billed until someone looked."""
    provisioner = emulator_fleet(emulator, tmp_path, ZONE)
    name = "dms-retry"
    provisioner.up(plan_up(provisioner.settings, name, job=WAIT_FOR_GO))
    log = _log(emulator, provisioner, name)
    _wait_for_line(log, "starting the job")
    admin = AdminClient(emulator.endpoint)
    admin.set_faults(error_burst=3)  # only API calls count: the node's metadata requests are never failed
    try:
        (log.parent / "job" / "go").touch()
        _wait_for_line(log, "self-delete attempt 3 failed (HTTP 503)")
        deadline = time.monotonic() + 60
        while not [b for b in admin.billing() if b["node"].endswith(f"/nodes/{name}") and b["end"] is not None]:
            assert time.monotonic() < deadline, "the node's delete never went through"
            time.sleep(0.1)
    finally:
        admin.clear_faults()
    deadline = time.monotonic() + 60  # billing ends when the delete starts; the node is gone once it is over
    while provisioner.provider.find_node(ZONE, name) is not None:
        assert time.monotonic() < deadline, "the node's delete started but never finished"
        time.sleep(0.1)
    text = log.read_text()
    assert "self-delete attempt 4" not in text and f"node {name} deleted itself (attempt 4)" in text
