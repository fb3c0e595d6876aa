"""The agent's wake-up: the marker in the store, and the Cloud Run ``jobs.run`` request it sends.

Google cannot be reached from here, so the Cloud Run Admin API is a small local HTTP server that
records what it is sent and answers as jobs.run documents (a long-running Operation): this checks
the request the agent builds (method, path, token from the metadata server, body), not that Google
accepts it.
"""

import http.server
import json
import threading
from typing import ClassVar, Dict, Iterator, List

import pytest
from tpuops.agent import wake

pytestmark = pytest.mark.tf

JOB = "projects/p-1234/locations/us-central1/jobs/tpuops-reconcile"


class _Google(http.server.BaseHTTPRequestHandler):
    """The metadata server (attributes, token) and run.googleapis.com in one stand-in."""

    attributes: ClassVar[Dict[str, str]] = {}
    runs: ClassVar[List[Dict[str, str]]] = []

    def do_GET(self) -> None:
        if self.headers.get("Metadata-Flavor") != "Google":
            self._reply(403, "")
        elif self.path == "/computeMetadata/v1/instance/service-accounts/default/token":
            self._reply(200, json.dumps({"access_token": "vm-token", "expires_in": 3599, "token_type": "Bearer"}))
        elif self.path.startswith("/computeMetadata/v1/instance/attributes/"):
            name = self.path.rsplit("/", 1)[1]
            value = type(self).attributes.get(name)
            self._reply(404 if value is None else 200, value or "")
        else:
            self._reply(404, "")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
        type(self).runs.append({"path": self.path, "auth": self.headers.get("Authorization", ""), "body": body,
                                "type": self.headers.get("Content-Type", "")})
        self._reply(200, json.dumps({"name": "projects/p-1234/locations/us-central1/operations/op-1"}))

    def _reply(self, code: int, body: str) -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def google() -> Iterator[str]:
    _Google.attributes, _Google.runs = {}, []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Google)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_named_job_is_run_with_the_metadata_token(google: str) -> None:
    _Google.attributes[wake.WAKE_JOB_ATTRIBUTE] = JOB
    job, operation = wake.start_job(google, {"TPUOPS_RUN_API": f"http://{google}"})
    assert (job, operation) == (JOB, "projects/p-1234/locations/us-central1/operations/op-1")
    assert _Google.runs == [{"path": f"/v2/{JOB}:run", "auth": "Bearer vm-token", "body": "{}",
                             "type": "application/json"}]


def test_no_job_in_the_metadata_sends_nothing(google: str) -> None:
    assert wake.start_job(google, {"TPUOPS_RUN_API": f"http://{google}"}) == ("", "")
    assert _Google.runs == []


def test_wake_writes_the_marker_and_survives_an_unreachable_api(google: str, tmp_path: object) -> None:
    _Google.attributes[wake.WAKE_JOB_ATTRIBUTE] = "not a job name"
    root = str(tmp_path)
    wake.wake(root, "r1", 2, google)  # a bad job name is logged, not raised: the marker is what matters
    with open(f"{root}/wake/r1") as marker:
        document = json.load(marker)
    assert document["run_id"] == "r1" and document["attempt"] == 2 and document["at"] > 1.7e9
    assert _Google.runs == []
