"""The local emulator is not an open door: a bearer token for the API, a secret for each metadata server."""

from __future__ import annotations

import json
import stat
import urllib.error
import urllib.request

import pytest
from google.api_core import exceptions
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2

from tpuops.config import Settings
from tpuops.core.kinds import Capacity
from tpuops.emulator import control
from tpuops.providers.base import wait_for
from tpuops.providers.nodes import NodeRequest
from tpuops.session import connect

pytestmark = pytest.mark.emulator

PARENT = "projects/proj-test/locations/us-central1-b"


def _request(url: str, method: str = "GET", token: str | None = None, headers: dict | None = None):
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    if token:
        all_headers["Authorization"] = f"Bearer {token}"
    data = b"{}" if method == "POST" else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, method=method, headers=all_headers),
                                    timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _client(endpoint: str, credentials) -> tpu_v2.TpuClient:
    return tpu_v2.TpuClient(credentials=credentials, transport="rest", client_options={"api_endpoint": endpoint})


def test_token_file_is_private_and_requests_without_it_get_401(emulator):
    token_file = emulator.state_dir / "token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert token_file.read_text().strip() == emulator.token

    for path in (f"/v2/{PARENT}/nodes", "/_admin/nodes"):
        status, body = _request(emulator.endpoint + path)
        assert status == 401
        error = json.loads(body)["error"]
        assert error["status"] == "UNAUTHENTICATED"
        assert str(token_file) in error["message"] and "--no-auth" in error["message"]
        assert _request(emulator.endpoint + path, token="not-the-token")[0] == 401
        assert _request(emulator.endpoint + path, token=emulator.token)[0] == 200


def test_official_client_anonymous_fails_with_token_works(emulator, finish):
    # On 401 the client asks its credentials to refresh: anonymous ones cannot, and it says so.
    with pytest.raises(auth_exceptions.GoogleAuthError):
        list(_client(emulator.endpoint, AnonymousCredentials()).list_nodes(parent=PARENT))

    from google.oauth2.credentials import Credentials

    client = _client(emulator.endpoint, Credentials(emulator.token))
    assert list(client.list_nodes(parent=PARENT)) == []


def test_tpuops_client_finds_the_token_by_itself(emulator):
    api = connect(Settings(project="proj-test", tpu_endpoint=emulator.endpoint, poll_interval_s=0.05,
                           api_deadline_s=10))
    operation = api.create_node("us-central1-b", NodeRequest(name="mine", accelerator="v2-8", runtime="tpu-vm-tf-2.9.3",
                                                             capacity=Capacity.ON_DEMAND))
    wait_for(api, operation, timeout_s=20)
    assert api.get_node("us-central1-b", "mine").state.value == "READY"
    assert control.AdminClient(emulator.endpoint).health()["nodes"] == 1


def test_node_token_may_only_touch_its_own_node(emulator, tpu_client, finish, emulator_admin, wait_until):
    for name in ("own", "other"):
        finish(tpu_client.create_node(parent=PARENT, node_id=name, node=tpu_v2.Node(
            accelerator_type="v2-8", runtime_version="tpu-vm-tf-2.9.3")))
    host = next(n["metadata_host"] for n in emulator_admin.nodes() if n["name"].endswith("/own"))

    # The metadata server answers only with its secret path; then it hands out the node's token.
    port_only = host.split("/", 1)[0]
    status, _ = _request(f"http://{port_only}/computeMetadata/v1/instance/name", headers={"Metadata-Flavor": "Google"})
    assert status == 403
    status, body = _request(f"http://{host}/computeMetadata/v1/instance/service-accounts/default/token",
                            headers={"Metadata-Flavor": "Google"})
    assert status == 200
    node_token = json.loads(body)["access_token"]

    assert _request(f"{emulator.endpoint}/v2/{PARENT}/nodes/own", token=node_token)[0] == 200
    status, body = _request(f"{emulator.endpoint}/v2/{PARENT}/nodes/other", token=node_token)
    assert status == 403 and json.loads(body)["error"]["status"] == "PERMISSION_DENIED"
    assert _request(f"{emulator.endpoint}/v2/{PARENT}/nodes/other", "DELETE", token=node_token)[0] == 403
    assert _request(f"{emulator.endpoint}/_admin/nodes", token=node_token)[0] == 403
    assert _request(f"{emulator.endpoint}/v2/{PARENT}/nodes/own", "DELETE", token=node_token)[0] == 200

    def gone() -> bool:
        try:
            tpu_client.get_node(name=f"{PARENT}/nodes/own")
        except exceptions.NotFound:
            return True
        return False

    wait_until(gone)


def test_no_auth_serves_third_party_clients(tmp_path):
    info = control.start_background(tmp_path / "open", boot_delay_s=0.1, auth=False)
    try:
        assert info.token is None and not (tmp_path / "open" / "token").exists()
        assert list(_client(info.endpoint, AnonymousCredentials()).list_nodes(parent=PARENT)) == []
        assert control.status(tmp_path / "open").token is None
    finally:
        control.stop(tmp_path / "open")
