"""The pieces that make Cloud Storage and metadata reachable by Google's names on an emulated node.

Against a real fake-gcs-server and real sockets: the CA and its certificate (keys 0600, trusted
for the storage hosts only through the bundle), the HTTPS front (TensorFlow's upload headers,
``Expect: 100-continue``, injected 503 / 429 / resets that never reach the server), the hosts
file seen inside a node's mount namespace and not outside, and the metadata door that answers a
node's own processes and nobody else. TensorFlow's own use of all this is ``test_gcs_e2e.py``.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuops.emulator.faults import Faults
from tpuops.emulator.gcs import storage
from tpuops.emulator.gcs.storage import StorageUnavailable
from tpuops.emulator.gcs.tls import STORAGE_HOSTS
from tpuops.emulator.stats import RpcStats
from tpuops.emulator.vm.metadata import MetadataServer, MetadataView
from tpuops.emulator.vm.metadoor import MetadataDoor
from tpuops.emulator.vm.netview import GOOGLE_HOSTS, enter_command, unavailable_reason

pytestmark = pytest.mark.emulator


STATS = RpcStats()
AUTH = {"Authorization": "Bearer owner-token"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[storage.Storage, Faults]]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    faults = Faults()
    served = storage.serve(tmp_path_factory.mktemp("storage"), ["bkt"], faults, STATS,
                           lambda header: header == AUTH["Authorization"])
    yield served, faults
    served.close()


def _https(served: storage.Storage, host: str = "www.googleapis.com") -> http.client.HTTPSConnection:
    """A client that dials the front's address but speaks to ``host``, trusting only the bundle."""
    context = ssl.create_default_context(cafile=served.network.ca_bundle)
    connection = http.client.HTTPSConnection(host, 443, context=context, timeout=10)
    connection.sock = context.wrap_socket(socket.create_connection((served.front.address, 443), timeout=10),
                                          server_hostname=host)
    return connection


def _upload_session(connection: http.client.HTTPSConnection, name: str, size: int) -> str:
    """Start a resumable upload of ``size`` bytes to ``bkt/name`` as TensorFlow does; its session URI."""
    connection.request("POST", f"/upload/storage/v1/b/bkt/o?uploadType=resumable&name={name}", body=b"",
                       headers={"X-Upload-Content-Length": str(size), **AUTH})
    session = connection.getresponse()
    session.read()
    assert session.status == 200
    return str(session.getheader("Location"))


def test_keys_are_private_and_the_certificate_is_trusted_only_for_the_storage_hosts(
        served: tuple[storage.Storage, Faults]) -> None:
    front = served[0]
    tls = Path(front.network.ca_bundle).parent
    assert {path.name: path.stat().st_mode & 0o777 for path in tls.glob("*.key")} == \
        {"ca.key": 0o600, "server.key": 0o600}
    for host in STORAGE_HOSTS:
        connection = _https(front, host)
        connection.request("GET", "/storage/v1/b", headers=AUTH)
        assert connection.getresponse().status == 200
    with pytest.raises(ssl.SSLCertVerificationError):
        _https(front, "tpu.googleapis.com")
    with pytest.raises(ssl.SSLCertVerificationError):
        context = ssl.create_default_context()
        context.wrap_socket(socket.create_connection((front.front.address, 443)), server_hostname=STORAGE_HOSTS[0])


def test_front_takes_tensorflows_upload_headers_and_answers_resumable_sessions_in_https(
        served: tuple[storage.Storage, Faults]) -> None:
    front = served[0]
    connection = _https(front)
    location = _upload_session(connection, "dir%2Fobj", 5)
    assert location.startswith("https://www.googleapis.com/upload/")
    # What TensorFlow 2.9's curl sends: Go's server alone refuses "Transfer-Encoding: identity" (501).
    connection.putrequest("PUT", location.removeprefix("https://www.googleapis.com"))
    for key, value in (("Transfer-Encoding", "identity"), ("Content-Length", "5"), ("Expect", "100-continue"),
                       ("Content-Range", "bytes 0-4/5"), *AUTH.items()):
        connection.putheader(key, value)
    connection.endheaders()
    connection.send(b"hello")
    done = connection.getresponse()
    assert done.status == 200, done.read()
    assert json.loads(done.read())["size"] == "5"
    reader = _https(front, "storage.googleapis.com")
    reader.request("GET", "/bkt/dir%2Fobj", headers={"Range": "bytes=1-3", **AUTH})
    ranged = reader.getresponse()
    assert (ranged.status, ranged.read()) == (206, b"ell")


def test_a_status_query_on_an_upload_session_publishes_nothing_as_on_google(
        served: tuple[storage.Storage, Faults]) -> None:
    # TensorFlow 2.9 asks "how far did it get?" after every failed upload request. fake-gcs-server
    # alone answers 200 and publishes a zero-byte object: an empty status.json behind injected faults.
    front = served[0]
    connection = _https(front)
    path = _upload_session(connection, "queried", 5).removeprefix("https://www.googleapis.com")

    def status_query() -> tuple[int, str | None, bytes]:
        connection.request("PUT", path, body=b"", headers={"Content-Range": "bytes */5", **AUTH})
        answer = connection.getresponse()
        return answer.status, answer.getheader("Range"), answer.read()

    assert status_query() == (308, None, b"")
    connection.request("GET", "/storage/v1/b/bkt/o/queried", headers=AUTH)
    absent = connection.getresponse()
    assert (absent.status, absent.read() and None) == (404, None)
    connection.request("PUT", path, body=b"hello", headers={"Content-Range": "bytes 0-4/5", **AUTH})
    uploaded = connection.getresponse()
    assert (uploaded.status, json.loads(uploaded.read())["size"]) == (200, "5")
    status, _, body = status_query()
    assert (status, json.loads(body)["size"]) == (200, "5")
    reader = _https(front, "storage.googleapis.com")
    reader.request("GET", "/bkt/queried", headers=AUTH)
    assert reader.getresponse().read() == b"hello"


def test_injected_faults_are_503_429_and_resets_that_never_reach_the_server(
        served: tuple[storage.Storage, Faults]) -> None:
    front, faults = served
    faults.update({"gcs_error_rate": 1.0})
    try:
        seen = []
        for attempt in range(3):
            connection = _https(front)
            try:
                connection.request("POST", f"/upload/storage/v1/b/bkt/o?uploadType=media&name=faulted-{attempt}",
                                   body=b"x", headers=AUTH)
                response = connection.getresponse()
                seen.append(response.status)
                assert json.loads(response.read())["error"]["code"] == response.status
            except (ConnectionResetError, http.client.RemoteDisconnected):
                seen.append("reset")
    finally:
        faults.update({"gcs_error_rate": 0.0})
    assert seen == [503, 429, "reset"]
    counts = STATS.snapshot()
    assert [counts.get(f"storage:injected-{kind}") for kind in ("503", "429", "reset")] == [1, 1, 1]
    connection = _https(front)
    connection.request("GET", "/storage/v1/b/bkt/o?prefix=faulted-", headers=AUTH)
    assert json.loads(connection.getresponse().read()).get("items", []) == []


@pytest.mark.parametrize("authorization", [None, "Bearer someone-else", "Basic b3duZXI="])
def test_requests_without_an_accepted_token_are_401_as_from_google(served: tuple[storage.Storage, Faults],
                                                                  authorization: str | None) -> None:
    connection = _https(served[0])
    headers = {"Authorization": authorization} if authorization else {}
    connection.request("POST", "/upload/storage/v1/b/bkt/o?uploadType=media&name=anonymous", body=b"x",
                       headers=headers)
    response = connection.getresponse()
    assert (response.status, json.loads(response.read())["error"]["code"]) == (401, 401)
    connection.request("GET", "/storage/v1/b/bkt/o/anonymous", headers=AUTH)
    assert connection.getresponse().status == 404


def test_hosts_file_applies_inside_a_node_namespace_only(served: tuple[storage.Storage, Faults]) -> None:
    front = served[0]
    resolve = [sys.executable, "-c", "import socket, sys; print(*[socket.gethostbyname(h) for h in sys.argv[1:]])",
               *GOOGLE_HOSTS]
    inside = subprocess.run(enter_command(front.network.hosts, resolve), capture_output=True, text=True,
                            check=True, timeout=30)
    assert inside.stdout.split() == [front.front.address] * len(GOOGLE_HOSTS)
    assert front.front.address not in Path("/etc/hosts").read_text()


def test_metadata_door_answers_a_nodes_processes_and_refuses_others(served: tuple[storage.Storage, Faults]) -> None:
    front = served[0]
    view = MetadataView({"name": "node-a", "zone": "projects/1/zones/us-central1-a"}, {"project-id": "p"}, {})
    metadata = MetadataServer(view)
    node = subprocess.Popen(
        enter_command(front.network.hosts, [sys.executable, "-c", (
            "import sys, urllib.request\n"
            "sys.stdin.readline()\n"
            "for url in ('http://metadata.google.internal', 'http://metadata'):\n"
            "    r = urllib.request.Request(url + '/computeMetadata/v1/instance/name',"
            " headers={'Metadata-Flavor': 'Google'})\n"
            "    print(urllib.request.urlopen(r, timeout=10).read().decode())\n"
            "sys.stdin.read()\n")]),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    door = MetadataDoor(front.front.address, lambda: {node.pid: metadata.host})
    try:
        assert node.stdin is not None and node.stdout is not None
        node.stdin.write("go\n")
        node.stdin.flush()
        assert [node.stdout.readline().strip(), node.stdout.readline().strip()] == ["node-a", "node-a"]
        outsider = http.client.HTTPConnection(front.front.address, 80, timeout=10)
        outsider.request("GET", "/computeMetadata/v1/instance/name", headers={"Metadata-Flavor": "Google"})
        assert outsider.getresponse().status == 403
    finally:
        node.communicate("", timeout=10)
        door.close()
        metadata.close()
    assert node.returncode == 0


def test_fake_gcs_server_stops_with_the_emulator_even_when_the_emulator_was_killed(tmp_path: Path) -> None:
    from tpuops.emulator import control
    from tpuops.emulator.vm.sandbox import live_groups

    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    for killed in (False, True):
        state_dir = tmp_path / f"emulator-{killed}"
        info = control.start_background(state_dir, boot_delay_s=0.1, gcs_buckets=["together"])
        try:
            front = storage.read_front(state_dir)
            assert front is not None and front.pid in live_groups()
            assert storage.chain_problem(state_dir, "together", info.token) is None
            if killed:
                os.kill(info.pid, signal.SIGKILL)
        finally:
            assert control.stop(state_dir)
        assert front.pid not in live_groups()
        assert storage.read_front(state_dir) is None


def test_the_front_skips_an_address_whose_metadata_port_is_taken(tmp_path: Path) -> None:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    for last in range(2, 255):
        try:
            taken.bind((f"127.0.0.{last}", 80))
            break
        except OSError:
            continue
    taken.listen()
    try:
        served = storage.serve(tmp_path, ["bkt"], Faults(), STATS, lambda header: True)
        try:
            assert served.front.address != taken.getsockname()[0]
            MetadataDoor(served.front.address, dict).close()
        finally:
            served.close()
    finally:
        taken.close()


def test_a_storage_failure_at_start_is_one_line_and_leaves_nothing_running(tmp_path: Path) -> None:
    from tpuops.core.errors import TpuopsError
    from tpuops.emulator import control

    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    state_dir = tmp_path / "emulator"
    state_dir.mkdir()
    (state_dir / "tls").write_text("a file where the CA directory goes")
    with pytest.raises(StorageUnavailable, match="certificate authority") as direct:
        storage.serve(state_dir, ["bkt"], Faults(), STATS, lambda header: True)
    assert "\n" not in str(direct.value) and storage.read_front(state_dir) is None
    with pytest.raises(TpuopsError) as started:
        control.start_background(state_dir, boot_delay_s=0.1, gcs_buckets=["bkt"])
    assert "cannot serve Cloud Storage: cannot make the emulator's certificate authority" in str(started.value)
    log = (state_dir / control.LOG_FILE).read_text()
    assert "Traceback" not in log
    assert control.status(state_dir) is None and storage.read_front(state_dir) is None


def test_the_control_planes_storage_calls_ride_through_injected_faults_on_our_retry_policy(
        served: tuple[storage.Storage, Faults], tmp_path: Path) -> None:
    """google-cloud-storage through the control plane's front with 2 % of requests failed (503, 429, reset).

    The SDK's own retries are off in ``GcsStore``, so every injected failure is one retry of ``tpuops.core.retry``.
    """
    from tpuops.core.errors import TpuopsError
    from tpuops.store import gcs_client
    from tpuops.store.gcs import GcsStore

    front, faults = served
    retried: list[BaseException] = []
    store = GcsStore("bkt", "control", client=gcs_client(front.front.http_endpoint), deadline_s=60,
                     on_retry=lambda err, _wait: retried.append(err))
    before = STATS.snapshot()
    faults.update({"gcs_error_rate": 0.02, "seed": 20})
    try:
        for n in range(60):
            generation = store.write_bytes(f"obj-{n}", f"value {n}".encode())
            store.write_if_generation_match(f"obj-{n}", f"value {n}, again".encode(), generation)
        big = tmp_path / "big"
        big.write_bytes(os.urandom(9 << 20))  # above the multipart limit: a resumable upload
        store.upload_file(big, "big")
        store.download_file("big", tmp_path / "back")
        listed = store.list("obj-")
        read = {info.key: store.read_bytes(info.key) for info in listed}
        for n in range(0, 60, 2):
            store.delete(f"obj-{n}")
        left = sorted(info.key for info in store.list("obj-"))
    finally:
        faults.update({"gcs_error_rate": 0.0})
    after = STATS.snapshot()
    injected = {kind: after.get(name, 0) - before.get(name, 0)
                for kind in ("503", "429", "reset") for name in [f"control-storage:injected-{kind}"]}
    assert all(injected.values()), injected
    assert len(retried) == sum(injected.values()) and all(isinstance(e, TpuopsError) and e.retryable
                                                          for e in retried), (injected, retried)
    assert read == {f"obj-{n}": f"value {n}, again".encode() for n in range(60)}
    assert (tmp_path / "back").read_bytes() == big.read_bytes()
    assert left == sorted(f"obj-{n}" for n in range(1, 60, 2))
    assert after.get("control-storage:POST", 0) > before.get("control-storage:POST", 0)
