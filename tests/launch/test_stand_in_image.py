"""The stand-in image python (``helpers.stand_in_image``) boots nodes through today's startup script.

The controller and sweep benchmarks (and any test that wants hundreds of cheap nodes) run on it:
when the startup script's checks changed and an older stand-in no longer answered them, every node
hung before its job and the benchmarks timed out. These tests boot real nodes on it in the emulator.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import emulator_fleet, poll, stand_in_image

from tpuops.emulator.control import AdminClient, EmulatorInfo, start_background, stop
from tpuops.fleet import Fleet
from tpuops.launch.bundle import job_argv
from tpuops.launch.provision import plan_up

pytestmark = pytest.mark.emulator

ZONE = "us-central1-a"


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorInfo]:
    work = tmp_path_factory.mktemp("stand-in")
    info = start_background(work / "emulator", boot_delay_s=0.1, grace_s=5.0,
                            image_python=str(stand_in_image(work / "image")))
    yield info
    stop(info.state_dir)




def _log_with(emulator: EmulatorInfo, fleet: Fleet, name: str, line: str) -> str:
    """The node's startup log once it holds ``line`` (polled)."""
    log = emulator.state_dir / "nodes" / fleet.settings.project / ZONE / name / "tpuops" / "startup.log"
    return poll(lambda: log.exists() and line in (text := log.read_text()) and text, f"{line!r} in {log}")


def test_a_runs_job_starts_after_the_real_checks_and_sleeps_until_the_preemption_notice(
        emulator: EmulatorInfo, tmp_path: Path) -> None:
    fleet = emulator_fleet(emulator, tmp_path, ZONE)
    job = job_argv(str(tmp_path / "store"), "0" * 64, "stand-in", "train")  # a bundle that is not there
    fleet.up(plan_up(fleet.settings, "stand-in", job=job))
    booted = _log_with(emulator, fleet, "stand-in", "starting the job")
    assert "booted with TensorFlow 2.9.3" in booted and "installing" not in booted
    AdminClient(emulator.endpoint).preempt(fleet.settings.project, ZONE, "stand-in")
    ended = _log_with(emulator, fleet, "stand-in", "job exited with")
    assert "job exited with 143 (preempted: TRUE)" in ended and "deleting node" not in ended
    fleet.down(["stand-in"])


def test_a_job_that_ends_deletes_its_node_with_the_token_parsed_by_the_stand_in(
        emulator: EmulatorInfo, tmp_path: Path) -> None:
    fleet = emulator_fleet(emulator, tmp_path, ZONE)
    fleet.up(plan_up(fleet.settings, "stand-in-done", job=["/bin/sh", "-c", "exit 0"]))
    poll(lambda: fleet.provider.find_node(ZONE, "stand-in-done") is None, "the node deleting itself")
    assert "node stand-in-done deleted itself" in _log_with(emulator, fleet, "stand-in-done", "deleted itself")
