"""``make demo`` / ``make demo-gcs`` fail when a step fails, and still stop the emulator.

The recipes are run by the real make and shell with ``tpuops`` replaced by a recorder that fails
the step under test (a demo end to end is ``test_gcs_e2e.py`` and the CLI tests' business).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

pytestmark = pytest.mark.unit


def _stub(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def _make(tmp_path: Path, target: str, **variables: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    log = tmp_path / "calls.log"
    tpuops = _stub(tmp_path / "tpuops", f'echo "$*" >> {log}\n[ "$1" != train ]\n')
    assignments = [f"{key}={value}" for key, value in {"TPUOPS": str(tpuops), **variables}.items()]
    return subprocess.run(["make", "-s", "-C", str(REPO), "-o", "setup", target, *assignments],
                          capture_output=True, text=True, timeout=120, check=False)


def _calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls.log"
    return [line.split()[0] + (" " + line.split()[1] if line.startswith("emulator") else "")
            for line in log.read_text().splitlines()] if log.exists() else []


def test_a_failed_train_fails_make_demo_and_the_emulator_is_stopped(tmp_path: Path) -> None:
    done = _make(tmp_path, "demo", DEMO_HOME=str(tmp_path / "home"))
    assert done.returncode != 0
    assert _calls(tmp_path) == ["init", "emulator start", "data", "train", "emulator stop"]


def test_make_demo_gcs_stops_with_the_reason_where_nodes_get_no_namespaces(tmp_path: Path) -> None:
    python = _stub(tmp_path / "python", 'echo "a gs:// store on the local emulator needs root"\n')
    done = _make(tmp_path, "demo-gcs", DEMO_GCS_HOME=str(tmp_path / "home"), PY=str(python))
    assert done.returncode != 0
    assert "make demo-gcs: a gs:// store on the local emulator needs root" in done.stderr
    assert _calls(tmp_path) == [] and not (tmp_path / "home").exists()


def test_the_interpreter_probe_is_silent_about_a_pyenv_shim_of_a_missing_version(tmp_path: Path) -> None:
    """A fresh clone's ``make demo`` must not open with ``pyenv: python3.12: command not found`` on stderr."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    shims = tmp_path / "shims"
    shims.mkdir()
    for missing in ("python3.12", "python3.11"):  # what pyenv's shim says for a version it does not have
        _stub(shims / missing, f'echo "pyenv: {missing}: command not found" >&2\nexit 127\n')
    real = _stub(shims / "python3.10", f'exec "{sys.executable}" "$@"\n')
    done = subprocess.run(["make", "-s", "-C", str(REPO), "--eval", "probe: ; @$(FIND_PYTHON)", "probe"],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": f"{shims}:/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.strip() == str(real)
