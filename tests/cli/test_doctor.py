"""``tpuops doctor`` runs every check for real against the emulator and fake-gcs-server."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tpuops.cli.main import run
from tpuops.emulator import control

pytestmark = pytest.mark.emulator

ZONES = ("us-central1-a", "us-central1-b")


def _setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: str | None = None, **extra: str) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    config = home / "tpuops.toml"
    lines = [f'zones = ["{ZONES[0]}", "{ZONES[1]}"]', f'store = "{store or home / "store"}"']
    lines += [f'{key} = "{value}"' for key, value in extra.items()]
    config.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("TPUOPS_HOME", str(home))
    monkeypatch.setenv("TPUOPS_CONFIG", str(config))
    monkeypatch.delenv("TPUOPS_TPU_ENDPOINT", raising=False)
    return home


def _doctor(capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, dict], str]:
    capsys.readouterr()
    code = run(["doctor", "--json"])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    checks = {check["name"]: check for check in json.loads(out)["checks"]}
    return code, checks, err


@pytest.fixture
def running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    home = _setup(tmp_path, monkeypatch)
    info = control.start_background(home / "emulator", boot_delay_s=0.1)
    yield home, info
    control.stop(home / "emulator")


def test_healthy_local_setup_is_all_ok(running, capsys):
    code, checks, _ = _doctor(capsys)
    assert {name: check["status"] for name, check in checks.items()} == dict.fromkeys(
        ["credentials", "project", "apis", "permissions", "vm-service-account", "accelerator", "tf-runtime", "clock",
         "store", "emulator", "data-plane"], "OK")
    assert code == 0

    capsys.readouterr()
    assert run(["doctor"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(checks) and all(line.startswith("OK") for line in lines)


def test_emulator_stopped_fails_with_the_fix(tmp_path, monkeypatch, capsys):
    _setup(tmp_path, monkeypatch)
    code, checks, _ = _doctor(capsys)
    assert code == 1
    assert checks["emulator"]["status"] == "FAIL" and checks["emulator"]["fix"] == "tpuops emulator start"
    assert checks["credentials"]["status"] == "FAIL"
    assert checks["apis"]["status"] == "WARN" and "not running" in checks["apis"]["detail"]
    assert not (tmp_path / "home" / "emulator" / "emulator.json").exists()  # doctor never starts it


def test_missing_runtime_and_denied_permissions_and_disabled_api(running, capsys, tmp_path, monkeypatch):
    home, info = running
    config = home / "tpuops.toml"
    config.write_text(config.read_text() + f'tf_python = "{sys.executable}"\n')  # a python without TF 2.9
    control.AdminClient(info.endpoint).set_faults(denied_permissions=["tpu.nodes.create"],
                                                  disabled_services=["tpu.googleapis.com"],
                                                  missing_service_accounts=["tpuops-vm@tpuops-local.iam.gserviceaccount.com"])
    code, checks, _ = _doctor(capsys)
    assert code == 1
    assert checks["data-plane"]["status"] == "FAIL" and "tpuops runtime install" in checks["data-plane"]["fix"]
    assert checks["permissions"]["status"] == "FAIL" and "tpu.nodes.create" in checks["permissions"]["detail"]
    assert checks["apis"]["status"] == "FAIL" and "gcloud services enable tpu.googleapis.com" in checks["apis"]["fix"]
    assert checks["vm-service-account"]["status"] == "FAIL"
    assert checks["tf-runtime"]["status"] == "OK"


def test_accelerator_the_zones_lack(tmp_path, monkeypatch, capsys):
    home = _setup(tmp_path, monkeypatch, accelerator="v5litepod-8")
    control.start_background(home / "emulator", boot_delay_s=0.1)
    try:
        code, checks, _ = _doctor(capsys)
    finally:
        control.stop(home / "emulator")
    assert code == 1
    assert checks["accelerator"]["status"] == "FAIL" and "us-south1-a" in checks["accelerator"]["fix"]
    assert checks["tf-runtime"]["status"] == "FAIL" and "TensorFlow 2.9" in checks["tf-runtime"]["detail"]


@pytest.fixture
def gcs_in_europe(monkeypatch: pytest.MonkeyPatch):
    """A fake-gcs-server whose buckets are in EUROPE-WEST4 (its ``-location`` flag is server-wide)."""
    import subprocess

    import fake_gcs

    real_popen = subprocess.Popen
    monkeypatch.setattr(fake_gcs.subprocess, "Popen",
                        lambda args, **kw: real_popen([*args, "-location", "EUROPE-WEST4"], **kw))
    server = fake_gcs.FakeGcsServer(backend="memory")
    server.start()
    monkeypatch.undo()
    yield server
    server.close()


def test_bucket_in_another_region(gcs_in_europe, tmp_path, monkeypatch, capsys):
    from tpuops.store import gcs_client

    gcs_client(gcs_in_europe.endpoint).create_bucket("doctor-far")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_in_europe.endpoint)
    home = _setup(tmp_path, monkeypatch, store="gs://doctor-far/tpuops")
    control.start_background(home / "emulator", boot_delay_s=0.1)
    try:
        code, checks, _ = _doctor(capsys)
        assert code == 1
        assert checks["store-region"]["status"] == "FAIL"
        assert "europe-west4" in checks["store-region"]["detail"] and "us-central1" in checks["store-region"]["fix"]
        # fake-gcs-server does not answer testIamPermissions: doctor says the check applies on GCP only.
        assert checks["store-permissions"]["status"] == "WARN" and "GCP" in checks["store-permissions"]["detail"]
        assert checks["vm-store-access"]["status"] == "WARN" and "GCP" in checks["vm-store-access"]["detail"]

        config = home / "tpuops.toml"
        config.write_text(config.read_text().replace("doctor-far", "doctor-missing"))
        code, checks, _ = _doctor(capsys)
        assert code == 1 and checks["store"]["status"] == "FAIL" and "does not exist" in checks["store"]["detail"]
    finally:
        control.stop(home / "emulator")


def test_bucket_in_the_zones_region(fake_gcs, gcs_bucket, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake_gcs.endpoint)  # its buckets are in US-CENTRAL1
    home = _setup(tmp_path, monkeypatch, store=f"gs://{gcs_bucket}/tpuops")
    control.start_background(home / "emulator", boot_delay_s=0.1)
    try:
        code, checks, _ = _doctor(capsys)
    finally:
        control.stop(home / "emulator")
    assert checks["store-region"]["status"] == "OK"
    assert code == 0


def test_gs_store_on_the_emulator_checks_the_nodes_path_to_the_bucket(tmp_path, monkeypatch, capsys):
    from tpuops.emulator import storage_front, unavailable_reason

    if unavailable_reason():
        pytest.skip(unavailable_reason())
    home = _setup(tmp_path, monkeypatch, store="gs://doctor-bucket/tpuops")
    control.start_background(home / "emulator", boot_delay_s=0.1, gcs_buckets=["doctor-bucket"])
    try:
        _, checks, _ = _doctor(capsys)
        assert checks["store"]["status"] == "OK"
        assert "https://storage.googleapis.com" in checks["store"]["detail"]
        hosts = home / "emulator" / "node-hosts"
        hosts.write_text("127.0.0.1 localhost\n")
        _, checks, _ = _doctor(capsys)
        assert checks["store"]["status"] == "FAIL"
        assert checks["store"]["detail"] == f"{hosts} does not send storage.googleapis.com to " \
            f"{storage_front(home / 'emulator').address}"
    finally:
        control.stop(home / "emulator")
