"""Provider local never sends a ``gs://`` URI to public Cloud Storage (``tpuops.session.open_uri``).

The store's bucket goes to the emulator's fake-gcs-server, and an emulator running without it
(started while the store was local, or for another bucket) is refused with one line; any other
bucket needs ``STORAGE_EMULATOR_HOST``. The ``data`` commands go through the same door.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuops import api, session
from tpuops.cli.main import run
from tpuops.config import Settings
from tpuops.core.errors import UsageError
from tpuops.core.kinds import Cloud
from tpuops.emulator import control


@pytest.fixture
def no_emulator_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)


@pytest.fixture
def bare_emulator(tmp_path: Path, no_emulator_variable: None) -> Iterator[tuple[Settings, control.EmulatorInfo]]:
    """An emulator of ``tmp_path/home`` started with no Cloud Storage, and settings whose store is a bucket."""
    home = tmp_path / "home"
    info = control.start_background(home / "emulator", boot_delay_s=0.2, grace_s=2.0)
    try:
        yield Settings(home=home, store="gs://bkt/root", tpu_endpoint=info.endpoint), info
    finally:
        control.stop(home / "emulator")


@pytest.mark.emulator
def test_a_running_emulator_without_the_stores_bucket_is_refused_not_bypassed(
    bare_emulator: tuple[Settings, control.EmulatorInfo],
) -> None:
    settings, info = bare_emulator
    for call in (lambda: session.store(settings), lambda: api.emulator_start(settings),
                 lambda: session.open_uri(settings, "gs://bkt/root/data/x")):
        with pytest.raises(UsageError) as refused:
            call()
        assert str(refused.value) == ("the emulator runs without Cloud Storage for gs://bkt: "
                                      "tpuops emulator stop, then start")
    assert "STORAGE_EMULATOR_HOST" not in os.environ
    assert control.status(settings.emulator_dir) == info


@pytest.mark.unit
def test_another_bucket_on_provider_local_needs_a_named_fake_gcs_server(tmp_path: Path,
                                                                        no_emulator_variable: None) -> None:
    settings = Settings(tpu_endpoint=Cloud.LOCAL, home=tmp_path / "home")
    with pytest.raises(UsageError, match="provider local serves no Cloud Storage for gs://elsewhere"):
        session.open_uri(settings, "gs://elsewhere/data/x")
    assert session.open_uri(settings, str(tmp_path / "dir")).uri_of("a").endswith("/dir/a")


@pytest.mark.unit
@pytest.mark.parametrize("args", [["data", "verify", "gs://elsewhere/data/x"],
                                  ["data", "ls", "gs://elsewhere/root"],
                                  ["data", "ls", "--store", "gs://elsewhere/root"]])
def test_data_commands_refuse_public_storage_on_provider_local(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    no_emulator_variable: None,
) -> None:
    monkeypatch.setenv("TPUOPS_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert run(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "gs://elsewhere" in err and "\n" not in err


@pytest.mark.unit
def test_the_emulators_face_and_process_load_no_storage_or_cryptography_until_a_bucket_is_served() -> None:
    import subprocess
    import sys

    probe = ("import sys, tpuops.emulator, tpuops.emulator.server, tpuops.session; print(sorted(m for m in sys.modules "
             "if m.startswith('cryptography') or m == 'tpuops.emulator.gcs.storage'))")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True).stdout.strip() == "[]"
