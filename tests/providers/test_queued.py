"""``tpuops up --queued``: a queued resource waits out a stockout instead of failing."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import start_tf_emulator

from tpuops.cli.main import run
from tpuops.emulator.control import AdminClient, EmulatorInfo, stop
from tpuops.providers.cloud_tpu.adapter import TpuApi

pytestmark = [pytest.mark.emulator, pytest.mark.tf]

ZONE = "us-central1-a"


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorInfo]:
    info = start_tf_emulator(tmp_path_factory.mktemp("queued"), grace_s=1.0)
    yield info
    stop(info.state_dir)


def test_queued_up_waits_out_a_stockout_and_down_removes_the_request(
        emulator: EmulatorInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    for key, value in {"TPUOPS_HOME": str(tmp_path), "TPUOPS_ZONES": ZONE, "TPUOPS_TPU_ENDPOINT": emulator.endpoint,
                       "TPUOPS_POLL_INTERVAL_S": "0.05", "TPUOPS_CONFIG": str(tmp_path / "none.toml")}.items():
        monkeypatch.setenv(key, value)
    (tmp_path / "none.toml").write_text("")
    admin = AdminClient(emulator.endpoint)
    api = TpuApi("tpuops-local", endpoint=emulator.endpoint, token=emulator.token)
    admin.set_faults(stockout_zones=[ZONE])

    waited: list[str] = []

    def lift_when_waiting() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            queued = api.list_queued_resources(ZONE)
            if queued and queued[0].state == "WAITING_FOR_RESOURCES":
                waited.append(queued[0].name)
                admin.clear_faults()
                return
            time.sleep(0.05)

    lifter = threading.Thread(target=lift_when_waiting)
    lifter.start()
    capsys.readouterr()
    code = run(["up", "q-1", "--queued", "--valid-for", "600", "--json"])
    out, err = capsys.readouterr()
    lifter.join()
    assert code == 0, err
    made = json.loads(out)
    assert (made["name"], made["state"], made["zone"]) == ("q-1", "READY", ZONE)
    assert waited == ["q-1"]
    assert [q.name for q in api.list_queued_resources(ZONE)] == ["q-1"]

    assert run(["down", "q-1"]) == 0
    assert api.list_nodes(ZONE) == [] and api.list_queued_resources(ZONE) == []
