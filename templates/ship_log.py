"""Run on a slice's worker N >= 1 by the startup script: ship this worker's log to the run's store.

    python3 -c "<this file>" LOG_FILE LOGS_URI INTERVAL_S START_BYTES

Python 3.8 and the standard library: no TensorFlow on a worker that runs no job. Worker 0's log is the
agent's, which ships itself (``tpuops/agent/logs.py``); the other workers run no job, so this process is what
makes ``tpuops logs RUN --worker N`` read anything. It stays for as long as the worker lives and ships the
whole lines LOG_FILE gained past START_BYTES (where this boot's lines begin: a rebooted VM, and the
emulator's recreated node, append to the same file) as the next chunk under LOGS_URI every INTERVAL_S
seconds, and once more when it is told to stop (SIGTERM: a preemption, a stop, a delete), so a worker's
last lines are shipped before the VM goes. The chunks follow the agent's contract (``tpuops/agent/logs.py``):
each one written whole, once, named ``<writer>-<NNNNNN>.log`` where the writer is this process's start time,
so that a later boot's shipper never writes over an earlier one's chunks and name order is write order.

A gs:// store is written through the Cloud Storage JSON API with the VM service account's token from the
metadata server, as the bundle is read (``fetch_bundle.py``); a local one (the emulator's) as a file renamed
into place. A failed ship is said on stderr (which is the log, so the next ship carries it) and retried at
the next tick with the same lines: nothing is skipped.
"""

import datetime
import json
import os
import signal
import sys
import threading
import time
import urllib.parse
import urllib.request

# One ship's requests (token, upload) each give up after this: the last ship must fit a short shutdown.
REQUEST_TIMEOUT_S = 10


class Shipper:
    def __init__(self, log_file, logs_uri, start):
        self.log_file = log_file
        self.logs_uri = logs_uri.rstrip("/")
        self.writer = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
        self.number = 1
        self.offset = start
        self.token = None
        self.token_until = 0.0

    def ship(self):
        """Ship the whole lines written since the last ship as the next chunk; whether all is shipped."""
        try:
            with open(self.log_file, "rb") as src:
                src.seek(self.offset)
                data = src.read()
        except OSError:
            return True  # nothing logged yet
        data = data[: data.rfind(b"\n") + 1]
        if not data:
            return True
        name = f"{self.writer}-{self.number:06d}.log"
        try:
            self.write(self.logs_uri + "/" + name, data)
        except Exception as err:  # any failure: said in the log, and the same lines go with the next ship
            print(f"tpuops log shipper: shipping {name} failed: {err}", file=sys.stderr, flush=True)
            return False
        self.offset += len(data)
        self.number += 1
        return True

    def write(self, uri, data):
        if not uri.startswith("gs://"):
            os.makedirs(os.path.dirname(uri), exist_ok=True)
            tmp = uri + ".tmp-ship"
            with open(tmp, "wb") as out:
                out.write(data)
            os.replace(tmp, uri)
            return
        bucket, _, name = uri[len("gs://"):].partition("/")
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        headers = {"Content-Type": "text/plain"}
        if not emulator:
            headers["Authorization"] = "Bearer " + self.bearer()
        host = (emulator or "https://storage.googleapis.com").rstrip("/")
        query = urllib.parse.urlencode({"uploadType": "media", "name": name})
        request = urllib.request.Request(f"{host}/upload/storage/v1/b/{bucket}/o?{query}", data=data,
                                         headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            response.read()

    def bearer(self):
        """The service account's token, asked again a minute before it expires."""
        if self.token is None or time.monotonic() >= self.token_until:
            metadata = os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")
            request = urllib.request.Request(
                f"http://{metadata}/computeMetadata/v1/instance/service-accounts/default/token",
                headers={"Metadata-Flavor": "Google"})
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                answer = json.loads(response.read())
            self.token = answer["access_token"]
            self.token_until = time.monotonic() + max(float(answer.get("expires_in", 300)) - 60, 0)
        return self.token


def main(argv):
    log_file, logs_uri, interval_s, start = argv[0], argv[1], float(argv[2]), int(argv[3])
    shipper = Shipper(log_file, logs_uri, start)
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: stopping.set())
    while not stopping.wait(interval_s):
        shipper.ship()
    shipper.ship()


main(sys.argv[1:])
