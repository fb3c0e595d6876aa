"""``tpuops up --queued --dry-run`` asks the registered provider's class, never a hard-coded adapter.

The dry run needs no endpoint and no credentials (the body is a class method of the adapter),
and it refuses what the real ``up --queued`` refuses: a provider without queued resources.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import settings_at

from tpuops import api
from tpuops.core.errors import UsageError

pytestmark = pytest.mark.unit

WHERE = {"project": "proj-q", "zones": "us-central1-a"}


def test_a_provider_without_queued_resources_is_refused_in_the_dry_run_too(tmp_path: Path) -> None:
    for provider in ("memory", "simulated"):
        with pytest.raises(UsageError, match="no queued resources: run 'tpuops up' without --queued"):
            api.plan_up_queued(settings_at(tmp_path, node_provider=provider, **WHERE), "q-node")


def test_the_cloud_tpu_body_needs_no_endpoint(tmp_path: Path) -> None:
    planned = api.plan_up_queued(settings_at(tmp_path, node_provider="cloud-tpu", **WHERE), "q-node", valid_for_s=600)
    spec = planned["body"]["tpu"]["nodeSpec"][0]
    assert planned["zone"] == "us-central1-a" and planned["queued_resource_id"] == "q-node"
    assert spec["parent"] == "projects/proj-q/locations/us-central1-a" and spec["nodeId"] == "q-node"
    assert planned["body"]["queueingPolicy"] == {"validUntilDuration": "600s"}
