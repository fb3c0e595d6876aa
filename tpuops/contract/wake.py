"""The wake marker: what a preempted agent leaves in the store after its save, and where it looks for a job.

The agent writes ``wake/<run>`` once the save on a preemption notice is whole (``tpuops.agent.wake``);
``tpuops watch`` and ``tpuops reconcile`` look for markers between passes and hurry the run's recovery
(``tpuops.controller.wake``). The marker is JSON ``{"run_id", "attempt", "at"}``, ``at`` in epoch seconds
of the VM's clock; a later notice of the same run overwrites it. The node metadata attribute
``WAKE_JOB_ATTRIBUTE`` may name a Cloud Run job (``projects/P/locations/R/jobs/J``) the agent starts too.
"""

import json
from typing import Any, Dict

WAKE_PREFIX = "wake/"
"""Store keys of the markers: ``wake/<run>`` (one per run; a later notice overwrites it)."""
WAKE_JOB_ATTRIBUTE = "tpuops-wake-job"
"""The node metadata attribute that names the Cloud Run job to start (``MetadataKey.WAKE_JOB``)."""
MARKER_FIELDS = ("run_id", "attempt", "at")
"""The marker document's fields, in the order the agent writes them."""


def marker_key(run_id: str) -> str:
    """The marker's key under the store root."""
    return f"{WAKE_PREFIX}{run_id}"


def marker_text(run_id: str, attempt: int, at: float) -> str:
    """The marker document the agent writes: the run, its attempt, the VM's epoch seconds of the save."""
    document: Dict[str, Any] = dict(zip(MARKER_FIELDS, (run_id, attempt, at)))
    return json.dumps(document)


def marker_at(data: bytes) -> float:
    """When the marker says the save ended (epoch seconds); raises ValueError or KeyError on a bad marker."""
    return float(json.loads(data)["at"])
