"""Conformance: the Google Cloud CLI drives the emulator unmodified (``gcloud compute tpus``).

gcloud talks to the emulator through its own configuration only: a private CLOUDSDK_CONFIG,
``api_endpoint_overrides/tpu`` and ``auth/disable_credentials`` (as environment properties), so
the emulator runs with ``--no-auth`` as it must for a third-party client. Each step is one
gcloud command, run in order against one emulator for the module; a step checks the exit code
and the output a user would read. ``bench/bench_conformance.py`` counts the passing steps.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.emulator,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("gcloud") is None, reason="gcloud (Google Cloud CLI) is not on PATH"),
]

# bench/bench_conformance.py points the same steps at another emulator (the baseline) through this.
OTHER_ENDPOINT = "TPUOPS_CONFORMANCE_ENDPOINT"
# (step id, gcloud arguments, expected exit code, text the output must contain)
STEPS: list[tuple[str, list[str], int, list[str]]] = [
    ("locations-list", ["compute", "tpus", "locations", "list"], 0, ["us-south1-a", "us-central2-b"]),
    ("locations-describe", ["compute", "tpus", "locations", "describe", "us-south1-a"], 0, ["locationId: us-south1-a"]),
    ("accelerator-types-list", ["compute", "tpus", "accelerator-types", "list", "--zone", "us-south1-a"], 0,
     ["v5litepod-1"]),
    ("accelerator-types-describe",
     ["compute", "tpus", "accelerator-types", "describe", "v2-8", "--zone", "us-central1-b"], 0, ["type: v2-8"]),
    ("versions-list", ["compute", "tpus", "versions", "list", "--zone", "us-central1-b"], 0, ["2.9.3", "2.17.0"]),
    ("tpu-vm-accelerator-types-list",
     ["compute", "tpus", "tpu-vm", "accelerator-types", "list", "--zone", "us-south1-a"], 0, ["v5litepod-256"]),
    ("tpu-vm-versions-list", ["compute", "tpus", "tpu-vm", "versions", "list", "--zone", "us-south1-a"], 0,
     ["tpu-vm-tf-2.17.0-pjrt", "v2-alpha-tpuv5-lite"]),
    ("tpu-vm-versions-describe",
     ["compute", "tpus", "tpu-vm", "versions", "describe", "tpu-vm-tf-2.17.0-pjrt", "--zone", "us-south1-a"], 0,
     ["version: tpu-vm-tf-2.17.0-pjrt"]),
    ("service-identity-create",
     ["compute", "tpus", "tpu-vm", "service-identity", "create", "--zone", "us-central1-b"], 0,
     ["@cloud-tpu.iam.gserviceaccount.com"]),
    ("tpu-vm-create",
     ["compute", "tpus", "tpu-vm", "create", "conf-v5e", "--zone", "us-south1-a", "--accelerator-type",
      "v5litepod-1", "--version", "tpu-vm-tf-2.17.0-pjrt"], 0, []),
    ("tpu-vm-create-unknown-version",
     ["compute", "tpus", "tpu-vm", "create", "conf-bad", "--zone", "us-south1-a", "--accelerator-type",
      "v5litepod-1", "--version", "tpu-vm-tf-9.9.9"], 1, ["INVALID_ARGUMENT"]),
    ("tpu-vm-list", ["compute", "tpus", "tpu-vm", "list", "--zone", "us-south1-a"], 0, ["conf-v5e", "READY"]),
    ("tpu-vm-describe", ["compute", "tpus", "tpu-vm", "describe", "conf-v5e", "--zone", "us-south1-a"], 0,
     ["state: READY", "acceleratorType: v5litepod-1"]),
    ("tpu-vm-update",
     ["compute", "tpus", "tpu-vm", "update", "conf-v5e", "--zone", "us-south1-a", "--description", "conformance"],
     0, []),
    ("tpu-vm-stop", ["compute", "tpus", "tpu-vm", "stop", "conf-v5e", "--zone", "us-south1-a"], 0, []),
    ("tpu-vm-start", ["compute", "tpus", "tpu-vm", "start", "conf-v5e", "--zone", "us-south1-a"], 0, []),
    ("tpu-vm-delete", ["compute", "tpus", "tpu-vm", "delete", "conf-v5e", "--zone", "us-south1-a", "--quiet"], 0, []),
    ("queued-resources-create",
     ["compute", "tpus", "queued-resources", "create", "conf-qr", "--node-id", "conf-qn", "--zone",
      "us-central1-b", "--accelerator-type", "v2-8", "--runtime-version", "tpu-vm-tf-2.17.0-pjrt",
      "--valid-until-duration", "1h"], 0, []),
    ("queued-resources-list", ["compute", "tpus", "queued-resources", "list", "--zone", "us-central1-b"], 0,
     ["conf-qr"]),
    ("queued-resources-describe",
     ["compute", "tpus", "queued-resources", "describe", "conf-qr", "--zone", "us-central1-b"], 0,
     ["validUntilTime"]),
    ("queued-resources-delete",
     ["compute", "tpus", "queued-resources", "delete", "conf-qr", "--zone", "us-central1-b", "--force", "--quiet"],
     0, []),
    ("alpha-tpu-vm-list", ["alpha", "compute", "tpus", "tpu-vm", "list", "--zone", "us-central1-b"], 0, []),
    ("alpha-queued-resources-list",
     ["alpha", "compute", "tpus", "queued-resources", "list", "--zone", "us-central1-b"], 0, []),
    ("v1-nodes-deprecated", ["compute", "tpus", "list", "--zone", "us-central1-b"], 1, ["deprecated"]),
]


@pytest.fixture(scope="module")
def gcloud_env(tmp_path_factory: pytest.TempPathFactory):
    from tpuops.emulator import control

    root = tmp_path_factory.mktemp("gcloud")
    endpoint = os.environ.get(OTHER_ENDPOINT) or control.start_background(
        root / "emulator", boot_delay_s=0.1, grace_s=1.0, auth=False).endpoint
    config = root / "cloudsdk"
    config.mkdir()
    env = {
        **os.environ,
        "CLOUDSDK_CONFIG": str(config),
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": endpoint + "/",
        "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
        "CLOUDSDK_CORE_PROJECT": "proj-conformance",
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
        "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true",
        "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true",
    }
    try:
        yield env
    finally:
        control.stop(root / "emulator")


def run_gcloud(env: dict[str, str], args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["gcloud", *args], check=False, env=env, capture_output=True, text=True, timeout=180,
                          cwd=Path(env["CLOUDSDK_CONFIG"]))


@pytest.mark.parametrize(("args", "code", "expected"), [step[1:] for step in STEPS], ids=[s[0] for s in STEPS])
def test_gcloud_command(gcloud_env: dict[str, str], args: list[str], code: int, expected: list[str]) -> None:
    done = run_gcloud(gcloud_env, args)
    output = done.stdout + done.stderr
    assert done.returncode == code, output
    for text in expected:
        assert text in output, output
    assert "Traceback" not in output
