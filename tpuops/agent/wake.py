"""The wake-up: once the save on a preemption notice is done, tell the control plane at once.

A detached run is otherwise recovered at the next pass of ``tpuops watch`` (every 30 s) or of the
scheduled reconcile (every 5 minutes), while the preempted VM knows first. Two doors, both best
effort: a failure is logged and never raised, because the checkpoint is whole already and the
next regular pass recovers the run anyway.

- The marker ``wake/<run>`` in the store (its one home in the layout: ``tpuops.runs.layout``; its document
  in the contract, ``tpuops.contract.wake``). ``tpuops watch``
  and ``tpuops reconcile`` look for markers between passes and hurry (``tpuops.controller.wake``).
- When the node's metadata names a Cloud Run job (attribute ``WAKE_JOB_ATTRIBUTE``, the full
  resource name ``projects/P/locations/R/jobs/J`` that infra/ outputs), the Cloud Run Admin API's
  ``jobs.run`` on it with the VM's metadata token: the job runs ``tpuops reconcile``, which finds
  the marker and hurries. The VM's account may run that one job and nothing else (infra/). The
  request has no body fields: overriding the job's arguments would need a broader role.

The marker is written with ``paths.write_whole``, which imports TensorFlow (loaded by then).
"""

import json
import logging
import os
import time
import urllib.error
import urllib.request
from typing import Dict, Optional, Tuple

from tpuops.agent.paths import join, write_whole
from tpuops.contract.wake import WAKE_JOB_ATTRIBUTE, WAKE_PREFIX, marker_key, marker_text

log = logging.getLogger(__name__)

RUN_API = "https://run.googleapis.com"
"""The Cloud Run Admin API; ``TPUOPS_RUN_API`` replaces it (a stand-in server in tests)."""
_TIMEOUT_S = 5.0
"""Per request: the wake-up must fit in what is left of the 30-s notice."""


def write_marker(store_root: str, run_id: str, attempt: int, now: Optional[float] = None) -> None:
    """Write ``wake/<run>`` under ``store_root``."""
    import tensorflow as tf  # loaded by then (module docstring)

    tf.io.gfile.makedirs(join(store_root, WAKE_PREFIX))  # a local store needs the folder
    write_whole(join(store_root, marker_key(run_id)), marker_text(run_id, attempt, time.time() if now is None else now))


def run_request(job: str, token: str, endpoint: str = RUN_API) -> urllib.request.Request:
    """The Cloud Run Admin API v2 ``jobs.run`` request for ``job`` (``projects/P/locations/R/jobs/J``)."""
    if job.count("/") != 5 or not job.startswith("projects/") or "/locations/" not in job or "/jobs/" not in job:
        raise ValueError(f"{WAKE_JOB_ATTRIBUTE} must be projects/P/locations/R/jobs/J, got {job!r}")
    return urllib.request.Request(
        f"{endpoint.rstrip('/')}/v2/{job}:run",
        data=b"{}",
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )


def _metadata(host: str, path: str) -> Optional[str]:
    """A metadata server value; None when it has none (404)."""
    request = urllib.request.Request(f"http://{host}/computeMetadata/v1/{path}", headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
            return response.read().decode("utf-8")
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return None
        raise


def start_job(host: str, environ: Optional[Dict[str, str]] = None) -> Tuple[str, str]:
    """Start the node's wake job, if its metadata names one: (job, operation name); ("", "") when none."""
    job = (_metadata(host, f"instance/attributes/{WAKE_JOB_ATTRIBUTE}") or "").strip()
    if not job:
        return "", ""
    token = json.loads(_metadata(host, "instance/service-accounts/default/token") or "{}").get("access_token", "")
    endpoint = (environ if environ is not None else os.environ).get("TPUOPS_RUN_API") or RUN_API
    with urllib.request.urlopen(run_request(job, token, endpoint), timeout=_TIMEOUT_S) as response:
        operation = json.loads(response.read().decode("utf-8") or "{}")
    return job, str(operation.get("name", ""))


def wake(store_root: str, run_id: str, attempt: int, metadata_host: Optional[str]) -> None:
    """After the notice's save: the marker, then the job (when there is a metadata server); never raises."""
    try:
        write_marker(store_root, run_id, attempt)
        log.info("wake marker written for the control plane")
    except Exception:  # best effort: the next regular pass recovers the run
        log.warning("could not write the wake marker", exc_info=True)
    if not metadata_host:
        return
    try:
        job, operation = start_job(metadata_host)
        if job:
            log.info("started the wake job %s (%s)", job, operation or "no operation name")
    except Exception:
        log.warning("could not start the wake job", exc_info=True)
