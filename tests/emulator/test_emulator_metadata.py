"""The per-node metadata server answers like GCE's: flavor header, listings, long polls."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest
from google.cloud import tpu_v2

pytestmark = pytest.mark.emulator

PROJECT = "proj-test"
ZONE = "us-central1-b"
PARENT = f"projects/{PROJECT}/locations/{ZONE}"


@pytest.fixture
def metadata_host(tpu_client, emulator_admin, finish):
    node = tpu_v2.Node(
        accelerator_type="v2-8", runtime_version="tpu-vm-tf-2.9.3", metadata={"run-id": "r1", "store-root": "/s"}
    )
    finish(tpu_client.create_node(parent=PARENT, node_id="meta", node=node))
    [described] = emulator_admin.nodes()
    return described["metadata_host"]


def _get(host, path, flavor=True, timeout=10.0):
    headers = {"Metadata-Flavor": "Google"} if flavor else {}
    request = urllib.request.Request(f"http://{host}/computeMetadata/v1/{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode(), response.headers
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(), err.headers


def test_flavor_header_is_required_and_echoed(metadata_host):
    status, _, headers = _get(metadata_host, "instance/name", flavor=False)
    assert status == 403
    status, body, headers = _get(metadata_host, "instance/name")
    assert (status, body) == (200, "meta")
    assert headers["Metadata-Flavor"] == "Google"
    assert _get(metadata_host, "instance/attributes/absent")[0] == 404


def test_listings_and_recursive_json(metadata_host):
    status, listing, _ = _get(metadata_host, "instance/attributes/")
    assert status == 200
    assert listing.splitlines() == ["accelerator-type", "agent-worker-number", "run-id", "store-root"]
    _, recursive, _ = _get(metadata_host, "instance/attributes/?recursive=true")
    assert json.loads(recursive)["run-id"] == "r1"
    assert _get(metadata_host, "instance/hostname")[1].startswith("meta")
    assert _get(metadata_host, "project/numeric-project-id")[1].isdigit()


def test_wait_for_change_times_out_with_the_current_value(metadata_host):
    status, body, _ = _get(metadata_host, "instance/preempted?wait_for_change=true&timeout_sec=0.2")
    assert (status, body) == (200, "FALSE")


def test_wait_for_change_wakes_on_update_node(metadata_host, tpu_client, finish):
    _, value, headers = _get(metadata_host, "instance/attributes/run-id")
    assert value == "r1"
    seen = {}

    def watch():
        # last_etag makes the wait race-free: a change before the request arrives returns at once.
        path = f"instance/attributes/run-id?wait_for_change=true&timeout_sec=20&last_etag={headers['ETag']}"
        seen["value"] = _get(metadata_host, path, timeout=30)[1]

    watcher = threading.Thread(target=watch)
    watcher.start()
    finish(
        tpu_client.update_node(
            node=tpu_v2.Node(name=f"{PARENT}/nodes/meta", metadata={"run-id": "r2"}),
            update_mask={"paths": ["metadata"]},
        )
    )
    watcher.join(timeout=30)
    assert seen["value"] == "r2"
    assert _get(metadata_host, "instance/attributes/run-id")[1] == "r2"


def test_guest_attributes_reach_the_api(metadata_host, tpu_client):
    request = urllib.request.Request(
        f"http://{metadata_host}/computeMetadata/v1/instance/guest-attributes/tpuops/phase",
        data=b"training",
        method="PUT",
        headers={"Metadata-Flavor": "Google"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
    answer = tpu_client.get_guest_attributes(request={"name": f"{PARENT}/nodes/meta", "query_path": "tpuops/"})
    [item] = answer.guest_attributes[0].query_value.items
    assert (item.namespace, item.key, item.value) == ("tpuops", "phase", "training")
