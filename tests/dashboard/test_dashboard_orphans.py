"""The dashboard's "delete an orphan node" action over the real emulator (the official client over HTTP).

A node labelled for a run the store does not know is an orphan: the action, through the web app with
the token and the CSRF header, deletes it and it leaves the listing. A node of a run the store knows
is refused and stays; so is a node of no tpuops run at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import poll
from starlette.testclient import TestClient

from tests.runs.test_runs import declare
from tpuops import api
from tpuops.config import Settings
from tpuops.core.errors import UsageError
from tpuops.core.kinds import Capacity
from tpuops.core.naming import labels_for
from tpuops.dashboard.app import Dashboard
from tpuops.dashboard.auth import COOKIE, CSRF_HEADER, csrf_value
from tpuops.dashboard.source import bound_source
from tpuops.providers.base import wait_for
from tpuops.providers.nodes import NodeRequest
from tpuops.session import connect, store

pytestmark = pytest.mark.emulator

ZONE = "us-central1-a"
TOKEN = "t0ken-for-orphans"


@pytest.fixture
def settings(tmp_path: Path, emulator: Any) -> Settings:
    return Settings(project="proj-test", zones=[ZONE], tpu_endpoint=emulator.endpoint,
                    home=tmp_path / "home", store=str(tmp_path / "store"), poll_interval_s=0.05,
                    api_deadline_s=20)


def make_node(settings: Settings, name: str, labels: dict[str, str]) -> None:
    provider = connect(settings)
    request = NodeRequest(name=name, accelerator="v3-8", runtime="tpu-vm-tf-2.9.3", capacity=Capacity.SPOT,
                          labels=labels)
    wait_for(provider, provider.create_node(ZONE, request), timeout_s=30)


def listed(settings: Settings) -> set[str]:
    return {node.name for node in connect(settings).list_nodes(ZONE)}


def delete(web: TestClient, name: str) -> Any:
    return web.post(f"/actions/nodes/{ZONE}/{name}/delete", headers={CSRF_HEADER: csrf_value(TOKEN)},
                    json={"confirm": name})


def test_an_orphan_node_is_deleted_and_a_known_runs_node_is_refused_and_stays(settings: Settings) -> None:
    declare(store(settings), "known")
    make_node(settings, "ghost", labels_for(run_id="ghost"))
    make_node(settings, "known", labels_for(run_id="known"))
    make_node(settings, "stranger", {"team": "ml"})
    web = TestClient(Dashboard(bound_source(settings), token=TOKEN, read_only=False, refresh_s=0.05).asgi(),
                     base_url="http://127.0.0.1")
    web.cookies.set(COOKIE, TOKEN)

    shown = {row["name"]: row for row in web.get("/data/nodes").json()}
    assert (shown["ghost"]["run_id"], shown["ghost"]["orphan"]) == ("ghost", True)
    assert (shown["known"]["run_id"], shown["known"]["orphan"]) == ("known", False)
    assert 'data-action="/actions/nodes/us-central1-a/ghost/delete"' in web.get("/nodes").text

    refused = delete(web, "known")
    assert refused.status_code == 400 and "belongs to run known" in refused.json()["error"]
    with pytest.raises(UsageError, match="not a tpuops run's node"):
        api.delete_orphan(settings, ZONE, "stranger")

    done = delete(web, "ghost")
    assert done.status_code == 200 and "ghost" in done.json()["done"]
    poll(lambda: "ghost" not in listed(settings), "the orphan to be gone", timeout_s=30)
    assert listed(settings) == {"known", "stranger"}


def test_the_nodes_page_shows_a_slices_hosts(settings: Settings) -> None:
    provider = connect(settings)
    request = NodeRequest(name="pod", accelerator="v2-32", runtime="tpu-vm-tf-2.9.3-pod", capacity=Capacity.SPOT,
                          labels=labels_for(run_id="pod"))
    wait_for(provider, provider.create_node(ZONE, request), timeout_s=30)
    make_node(settings, "one", labels_for(run_id="one"))
    web = TestClient(Dashboard(bound_source(settings), token=TOKEN, read_only=True, refresh_s=0.05).asgi(),
                     base_url="http://127.0.0.1")
    web.cookies.set(COOKIE, TOKEN)
    shown = {row["name"]: row for row in web.get("/data/nodes").json()}
    assert [(shown[n]["hosts"], shown[n]["unhealthy_workers"]) for n in ("pod", "one")] == [(4, []), (1, [])]
    assert "<td>v2-32</td><td>4</td>" in web.get("/nodes").text
