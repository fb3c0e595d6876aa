"""``tpuops emulator`` from the command line: start, status, fault, preempt, billing, stop."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tpuops.cli.main import run
from tpuops.emulator.control import token_for
from tpuops.providers.cloud_tpu.adapter import TpuApi
from tpuops.providers.nodes import NodeState

pytestmark = pytest.mark.emulator


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = run(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_emulator_lifecycle_from_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TPUOPS_HOME", str(tmp_path))
    monkeypatch.setenv("TPUOPS_CONFIG", str(tmp_path / "tpuops.toml"))
    (tmp_path / "tpuops.toml").write_text('zones = ["us-central1-a"]\n')
    code, out, err = _cli(capsys, "emulator", "start", "--boot-delay", "0.1", "--grace", "1", "--json")
    assert code == 0, err
    started = json.loads(out)
    try:
        assert started["endpoint"].startswith("http://127.0.0.1:")
        code, out, _ = _cli(capsys, "emulator", "status", "--json")
        assert json.loads(out) == {"running": True, "endpoint": started["endpoint"], "pid": started["pid"],
                                   "auth": True, "state_dir": started["state_dir"],
                                   "token_file": started["token_file"], "storage_endpoint": None}

        monkeypatch.setenv("TPUOPS_TPU_ENDPOINT", started["endpoint"])
        assert _cli(capsys, "emulator", "fault", "--stockout", "us-central1-a")[0] == 0
        code, _, err = _cli(capsys, "up", "cli-emu", "--no-wait")
        assert code == 0
        api = TpuApi("tpuops-local", endpoint=started["endpoint"], token=token_for(started["endpoint"]),
                     poll_interval_s=0.05)
        deadline = time.monotonic() + 20
        while api.find_node("us-central1-a", "cli-emu") is not None:
            assert time.monotonic() < deadline, "a stocked-out create left a node"
            time.sleep(0.05)
        assert _cli(capsys, "emulator", "fault", "--clear")[0] == 0

        code, out, _ = _cli(capsys, "emulator", "fault", "--hold-delete", "cli-emu", "--hold-queued",
                            "--fail-queued", "us-central1-b", "--json")
        held = json.loads(out)["faults"]
        assert code == 0 and held["hold_deletes"] == ["cli-emu"] and held["hold_queued"] is True
        assert held["fail_queued_zones"] == ["us-central1-b"] and held["stockout_zones"] == []
        code, out, _ = _cli(capsys, "emulator", "fault", "--release-deletes", "--release-queued", "--json")
        released = json.loads(out)["faults"]
        assert (released["hold_deletes"], released["hold_queued"]) == ([], False)
        assert released["fail_queued_zones"] == ["us-central1-b"], "a fault not named stays as it was"
        code, out, _ = _cli(capsys, "emulator", "fault", "--clear", "--json")
        assert code == 0 and json.loads(out)["faults"]["fail_queued_zones"] == []

        assert _cli(capsys, "up", "cli-emu")[0] == 0
        assert _cli(capsys, "emulator", "preempt", "cli-emu", "--grace", "0.2")[0] == 0
        deadline = time.monotonic() + 20
        while api.get_node("us-central1-a", "cli-emu").state is not NodeState.PREEMPTED:
            assert time.monotonic() < deadline, "the node was not preempted"
            time.sleep(0.05)
        code, out, _ = _cli(capsys, "emulator", "billing", "--json")
        intervals = json.loads(out)["intervals"]
        assert [i["node"].rsplit("/", 1)[-1] for i in intervals] == ["cli-emu"]
    finally:
        code, _, err = _cli(capsys, "emulator", "stop")
    assert code == 0 and "emulator stopped" in err
    with pytest.raises(ProcessLookupError):
        os.kill(started["pid"], 0)
    code, out, _ = _cli(capsys, "emulator", "status")
    assert code == 1 and "not running" in out


def test_emulator_status_names_the_cloud_storage_endpoint_that_start_printed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """With a gs:// store, ``status`` (text and --json) says where Cloud Storage is, as ``start`` did."""
    from tpuops.emulator import unavailable_reason

    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    monkeypatch.setenv("TPUOPS_HOME", str(tmp_path))
    monkeypatch.setenv("TPUOPS_CONFIG", str(tmp_path / "tpuops.toml"))
    monkeypatch.delenv("TPUOPS_TPU_ENDPOINT", raising=False)
    (tmp_path / "tpuops.toml").write_text('zones = ["us-central1-a"]\nstore = "gs://status-bkt/root"\n')
    code, out, err = _cli(capsys, "emulator", "start", "--boot-delay", "0.1", "--grace", "1", "--json")
    assert code == 0, err
    started = json.loads(out)
    try:
        assert started["storage_endpoint"].startswith("http://127.0.0.1:")
        code, out, _ = _cli(capsys, "emulator", "status", "--json")
        assert code == 0 and json.loads(out) == {"running": True, **started}
        code, out, _ = _cli(capsys, "emulator", "status")
        assert code == 0 and out.strip() == (f"running at {started['endpoint']} (pid {started['pid']}); "
                                             f"Cloud Storage at {started['storage_endpoint']}")
    finally:
        assert _cli(capsys, "emulator", "stop")[0] == 0
