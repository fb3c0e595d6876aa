"""The VM bootstrap (templates/fetch_bundle.py): checks the bundle, then runs the agent in its own process.

A real interpreter runs the bootstrap on a bundle whose "agent" reports what it saw, with a fake
``tensorflow`` package first on the path: it logs every import, and its import lasts until the
agent has started (30 s at most), so an agent that starts only after the import shows. The gs://
bundle comes from fake-gcs-server.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from fake_gcs import FakeGcsServer

from tpuops.launch.bundle import bootstrap_source

FAKE_AGENT = """
import json, os, sys, time
started = time.time()
loading = "tensorflow" in sys.modules
half_loaded = loading and not hasattr(sys.modules["tensorflow"], "__version__")
open(os.environ["AGENT_STARTED"], "w").close()
import tensorflow
with open(os.environ["REPORT"], "w") as out:
    json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(), "loading_at_start": loading,
               "half_loaded_at_start": half_loaded, "started": started}, out)
sys.exit(7)
"""
FAKE_TENSORFLOW = """
import os, time
with open(os.environ["IMPORTS"], "a") as log:
    log.write("%f\\n" % time.time())
deadline = time.time() + 30
while not os.path.exists(os.environ["AGENT_STARTED"]) and time.time() < deadline:
    time.sleep(0.01)  # the import lasts until the agent has started, or 30 s
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


AGENT_BUNDLE = {"tpuops/__init__.py": "", "tpuops/agent/__init__.py": "", "tpuops/agent/__main__.py": FAKE_AGENT}


def _bootstrap(tmp_path: Path, data: bytes, sha256: str, uri: str = "",
               **env_vars: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    bundle, work, site = tmp_path / "bundle.tar.gz", tmp_path / "job", tmp_path / "site"
    bundle.write_bytes(data)
    work.mkdir()
    (site / "tensorflow").mkdir(parents=True)
    (site / "tensorflow" / "__init__.py").write_text(FAKE_TENSORFLOW)
    env = dict(os.environ, PYTHONPATH=str(site), REPORT=str(tmp_path / "report.json"),
               IMPORTS=str(tmp_path / "imports"), AGENT_STARTED=str(tmp_path / "agent-started"),
               TPUOPS_RUN_ID="run-1", **env_vars)
    status = tmp_path / "status.json"
    argv = [sys.executable, "-c", bootstrap_source(), uri or str(bundle), sha256, "spec.json", str(status), "train"]
    done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=60, check=False)
    return done, status


@pytest.mark.unit
def test_agent_runs_in_process_with_tensorflow_already_loading(tmp_path: Path) -> None:
    data = _bundle(AGENT_BUNDLE)
    done, status = _bootstrap(tmp_path, data, hashlib.sha256(data).hexdigest())

    assert done.returncode == 7, done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["argv"] == ["train", "spec.json"]
    assert Path(report["cwd"]).name.startswith("bundle-") and Path(report["cwd"]).parent == tmp_path / "job"
    assert report["loading_at_start"], "TensorFlow must be loading before the agent starts"
    assert len((tmp_path / "imports").read_text().splitlines()) == 1, "TensorFlow is imported once per boot"
    assert not status.exists()


@pytest.mark.unit
def test_a_bundle_with_another_digest_never_runs(tmp_path: Path) -> None:
    data = _bundle(AGENT_BUNDLE)
    (tmp_path / "agent-started").touch()  # no agent will start: the import need not wait for one
    done, status = _bootstrap(tmp_path, data, "0" * 64)

    assert done.returncode == 3
    assert json.loads(status.read_text())["exit_class"] == "user-error"
    assert not (tmp_path / "report.json").exists()
    assert "refusing to run it" in done.stderr


@pytest.mark.emulator
def test_gs_bundle_downloads_while_tensorflow_still_imports(tmp_path: Path, fake_gcs: FakeGcsServer,
                                                            gcs_bucket: str) -> None:
    data = _bundle(AGENT_BUNDLE)
    name = "prefix/bundles/b.tar.gz"
    upload = (f"{fake_gcs.endpoint}/upload/storage/v1/b/{gcs_bucket}/o?uploadType=media&"
              + urllib.parse.urlencode({"name": name}))
    urllib.request.urlopen(urllib.request.Request(upload, data=data, method="POST"), timeout=30).close()
    done, _ = _bootstrap(tmp_path, data, hashlib.sha256(data).hexdigest(), uri=f"gs://{gcs_bucket}/{name}",
                         STORAGE_EMULATOR_HOST=fake_gcs.endpoint)

    assert done.returncode == 7, done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["half_loaded_at_start"], "the download and unpacking must not wait for the TensorFlow import"
    assert len((tmp_path / "imports").read_text().splitlines()) == 1
