"""The VM bootstrap (templates/fetch_bundle.py): checks the bundle, then runs the agent in its own process.

A real interpreter runs the bootstrap on a bundle whose "agent" reports what it saw, with a fake
``tensorflow`` package (slow to import, and it logs every import) first on the path.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tpuops.bundle import bootstrap_source

pytestmark = pytest.mark.unit

FAKE_AGENT = """
import json, os, sys, time
started = time.time()
loading = "tensorflow" in sys.modules
import tensorflow
with open(os.environ["REPORT"], "w") as out:
    json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(), "loading_at_start": loading,
               "started": started}, out)
sys.exit(7)
"""
FAKE_TENSORFLOW = """
import os, time
with open(os.environ["IMPORTS"], "a") as log:
    log.write("%f\\n" % time.time())
time.sleep(0.5)
__version__ = "2.9.3"
"""


def _bundle(files: dict[str, str]) -> bytes:
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return packed.getvalue()


def _bootstrap(tmp_path: Path, data: bytes, sha256: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    bundle, work, site = tmp_path / "bundle.tar.gz", tmp_path / "job", tmp_path / "site"
    bundle.write_bytes(data)
    work.mkdir()
    (site / "tensorflow").mkdir(parents=True)
    (site / "tensorflow" / "__init__.py").write_text(FAKE_TENSORFLOW)
    env = dict(os.environ, PYTHONPATH=str(site), REPORT=str(tmp_path / "report.json"),
               IMPORTS=str(tmp_path / "imports"), TPUOPS_RUN_ID="run-1")
    status = tmp_path / "status.json"
    done = subprocess.run([sys.executable, "-c", bootstrap_source(), str(bundle), sha256, "spec.json", str(status),
                           "train"], cwd=work, env=env, capture_output=True, text=True, timeout=60, check=False)
    return done, status


def test_agent_runs_in_process_with_tensorflow_already_loading(tmp_path: Path) -> None:
    data = _bundle({"tpuops/__init__.py": "", "tpuops/agent/__init__.py": "", "tpuops/agent/__main__.py": FAKE_AGENT})
    done, status = _bootstrap(tmp_path, data, hashlib.sha256(data).hexdigest())

    assert done.returncode == 7, done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["argv"] == ["train", "spec.json"]
    assert Path(report["cwd"]).name.startswith("bundle-") and Path(report["cwd"]).parent == tmp_path / "job"
    assert report["loading_at_start"], "TensorFlow must be loading before the agent starts"
    assert len((tmp_path / "imports").read_text().splitlines()) == 1, "TensorFlow is imported once per boot"
    assert not status.exists()


def test_a_bundle_with_another_digest_never_runs(tmp_path: Path) -> None:
    data = _bundle({"tpuops/__init__.py": "", "tpuops/agent/__init__.py": "", "tpuops/agent/__main__.py": FAKE_AGENT})
    done, status = _bootstrap(tmp_path, data, "0" * 64)

    assert done.returncode == 3
    assert json.loads(status.read_text())["exit_class"] == "user-error"
    assert not (tmp_path / "report.json").exists()
    assert "refusing to run it" in done.stderr
