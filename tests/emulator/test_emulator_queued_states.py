"""Queued resources: every state reachable through faults, and moves in the same step as their nodes."""

from __future__ import annotations

import pytest
from google.cloud import tpu_v2

pytestmark = pytest.mark.emulator

PARENT = "projects/proj-test/locations/us-central1-b"


def _queue(tpu_client, finish, qr_id: str, **policy):
    node = tpu_v2.Node(accelerator_type="v2-8", runtime_version="tpu-vm-tf-2.9.3")
    resource = tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(
            parent=PARENT, node_id=f"{qr_id}-node", node=node)]),
        queueing_policy=tpu_v2.QueuedResource.QueueingPolicy(**policy),
    )
    return finish(tpu_client.create_queued_resource(parent=PARENT, queued_resource_id=qr_id,
                                                     queued_resource=resource))


def _state(tpu_client, qr_id: str) -> str:
    return tpu_client.get_queued_resource(name=f"{PARENT}/queuedResources/{qr_id}").state.state.name


def test_states_through_faults(tpu_client, finish, emulator_admin, wait_until):
    emulator_admin.set_faults(hold_queued=True)
    created = _queue(tpu_client, finish, "held", valid_until_duration="3600s")
    assert created.queueing_policy.valid_until_time.timestamp() > created.create_time.timestamp() + 3500
    assert _state(tpu_client, "held") == "ACCEPTED"

    emulator_admin.set_faults(hold_queued=False, stockout_zones=["us-central1-b"])
    wait_until(lambda: _state(tpu_client, "held") == "WAITING_FOR_RESOURCES")

    emulator_admin.set_faults(stockout_zones=[], fail_queued_zones=["us-central1-b"])
    _queue(tpu_client, finish, "doomed")
    wait_until(lambda: _state(tpu_client, "doomed") == "FAILED")
    assert _state(tpu_client, "held") == "FAILED"  # every waiting request of the zone fails

    emulator_admin.clear_faults()
    finish(tpu_client.reset_queued_resource(name=f"{PARENT}/queuedResources/held"))
    wait_until(lambda: _state(tpu_client, "held") == "ACTIVE")
    assert _state(tpu_client, "doomed") == "FAILED"


def test_node_delete_suspends_in_the_same_step(tpu_client, finish, wait_until):
    _queue(tpu_client, finish, "quick")
    wait_until(lambda: _state(tpu_client, "quick") == "ACTIVE")
    operation = tpu_client.delete_node(name=f"{PARENT}/nodes/quick-node")
    assert _state(tpu_client, "quick") in ("SUSPENDING", "SUSPENDED")  # SUSPENDED once the node is gone
    finish(operation)
    # No tick in between: the non-force delete is accepted right after the node's delete is done.
    assert _state(tpu_client, "quick") == "SUSPENDED"
    finish(tpu_client.delete_queued_resource(name=f"{PARENT}/queuedResources/quick"))
