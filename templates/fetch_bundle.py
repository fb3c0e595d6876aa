"""Run on the TPU VM by the startup script: fetch the job bundle, check its sha256, run the agent.

    python3 -c "<this file>" BUNDLE_URI SHA256 SPEC_URI STATUS_URI COMMAND

Python 3.8 and the standard library. A gs:// bundle is downloaded through the Cloud Storage
JSON API with the VM service account's token from the metadata server (``STORAGE_EMULATOR_HOST``
points it at an emulator, without a token), so that the download does not wait for TensorFlow;
a refusal writes the status through TensorFlow's gfile. A bundle whose bytes do not hash to
SHA256 never runs: the run's status says so (user-error) and the exit code is 3. Extraction
refuses members that would land outside the bundle directory.

TensorFlow is imported once per boot: a thread starts importing it (seconds) at once, while the
bundle is downloaded, checked and unpacked, and the agent then runs in this same process
(``runpy``, as ``python -m tpuops.agent COMMAND SPEC_URI`` would), where its own import finds
the module already loaded. The agent's exit code is this process's. The import thread is not a
daemon, so a refusal exits only after it, never while TensorFlow is half-loaded. A preemption
notice before the agent has installed its handler ends the process, as it always did.
"""

import datetime
import hashlib
import http.client
import io
import json
import os
import runpy
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

# Transient download failures (connection, reset, 408, 429, 5xx) are retried after these pauses.
RETRY_PAUSES_S = (1, 2, 4)


def _import_tensorflow():
    import tensorflow  # noqa: F401


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


def _get(url, headers):
    request = urllib.request.Request(url, headers=headers)
    for pause in (*RETRY_PAUSES_S, None):
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                return response.read()
        except urllib.error.HTTPError as err:
            if pause is None or not (err.code in (408, 429) or err.code >= 500):
                raise
        except (OSError, http.client.HTTPException):  # unreachable, a reset connection, a cut answer
            if pause is None:
                raise
        time.sleep(pause)


def _gcs_read(uri):
    bucket, _, name = uri[len("gs://"):].partition("/")
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    headers = {}
    if not emulator:
        metadata = os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")
        token = _get(f"http://{metadata}/computeMetadata/v1/instance/service-accounts/default/token",
                     {"Metadata-Flavor": "Google"})
        headers["Authorization"] = "Bearer " + json.loads(token)["access_token"]
    host = (emulator or "https://storage.googleapis.com").rstrip("/")
    return _get(f"{host}/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}?alt=media", headers)


def read(uri):
    if uri.startswith("gs://"):
        return _gcs_read(uri)
    with open(uri, "rb") as src:
        return src.read()


def write(uri, text):
    tmp = uri + ".tmp-bootstrap"
    if uri.startswith("gs://"):
        with _gfile().GFile(tmp, "w") as out:
            out.write(text)
        _gfile().rename(tmp, uri, overwrite=True)
        return
    with open(tmp, "w") as out:
        out.write(text)
    os.replace(tmp, uri)


def refuse(status_uri, run_id, message):
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    status = {"run_id": run_id, "phase": "done", "exit_class": "user-error", "exit_code": 3,
              "message": message, "heartbeat": now, "started": now}
    write(status_uri, json.dumps(status, indent=2))
    print("tpuops bootstrap: " + message, file=sys.stderr)
    sys.exit(3)


def extract(data, target):
    root = os.path.realpath(target)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            path = os.path.realpath(os.path.join(root, member.name))
            if not member.isfile() or not path.startswith(root + os.sep):
                raise ValueError("unsafe bundle member " + repr(member.name))
        tar.extractall(root)


def main(argv):
    bundle_uri, sha256, spec_uri, status_uri, command = argv
    threading.Thread(target=_import_tensorflow, name="tpuops-import-tensorflow").start()
    run_id = os.environ.get("TPUOPS_RUN_ID", "")
    data = read(bundle_uri)
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        refuse(status_uri, run_id,
               f"bundle {bundle_uri} has sha256 {digest}, the run spec expects {sha256}: refusing to run it")
    target = os.path.abspath("bundle-" + sha256[:16])
    if not os.path.isdir(target):
        partial = target + ".partial"
        os.makedirs(partial, exist_ok=True)
        try:
            extract(data, partial)
        except ValueError as err:
            refuse(status_uri, run_id, str(err))
        os.replace(partial, target)
    os.chdir(target)
    os.environ["PYTHONPATH"] = target + os.pathsep + os.environ.get("PYTHONPATH", "")
    sys.path.insert(0, target)
    sys.argv = [sys.argv[0], command, spec_uri]
    runpy.run_module("tpuops.agent", run_name="__main__", alter_sys=True)


main(sys.argv[1:])
