"""Many clients at once: 64 nodes created and deleted concurrently, as the benchmark does."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from google.cloud import tpu_v2
from google.oauth2.credentials import Credentials

pytestmark = pytest.mark.emulator

PARENT = "projects/proj-test/locations/us-central1-b"
COUNT = 64


def test_64_concurrent_creates_and_deletes(emulator, tpu_client, emulator_admin, finish):
    def client():
        return tpu_v2.TpuClient(
            credentials=Credentials(emulator.token), transport="rest",
            client_options={"api_endpoint": emulator.endpoint}
        )

    node = tpu_v2.Node(accelerator_type="v2-8", runtime_version="tpu-vm-tf-2.9.3", metadata={"startup-script": "true"})

    def create(index):
        return finish(client().create_node(parent=PARENT, node_id=f"c{index:02d}", node=node), timeout=60)

    def delete(name):
        return finish(client().delete_node(name=name), timeout=60)

    with ThreadPoolExecutor(max_workers=16) as pool:
        created = list(pool.map(create, range(COUNT)))
        assert all(n.state == tpu_v2.Node.State.READY for n in created)
        assert len({n.id for n in created}) == COUNT
        listed = list(tpu_client.list_nodes(request={"parent": PARENT, "page_size": 1000}))
        assert len(listed) == COUNT
        list(pool.map(delete, [n.name for n in created]))

    assert list(tpu_client.list_nodes(parent=PARENT)) == []
    stats = emulator_admin.stats()
    assert (stats["CreateNode"], stats["DeleteNode"]) == (COUNT, COUNT)
    billed = {interval["node_uid"] for interval in emulator_admin.billing() if interval["end_reason"] == "deleted"}
    assert billed == {str(n.id) for n in created}
