"""Read what a training attempt needs first while TensorFlow imports: the spec, the last status, the newest checkpoint.

Importing TensorFlow takes seconds, and a resumed attempt then reads the run spec, the previous
attempt's ``status.json`` and its newest checkpoint from the store, one after the other, every
second of it billed. ``__main__`` starts ``Prefetch`` before that import, so those reads run in
a thread alongside it: the standard library only (``urllib`` for ``gs://``, ``open`` for a local
store), since nothing here may wait for TensorFlow.

Invariants:

* Prefetching is never authoritative. A piece that could not be fetched is ``None`` and its
  reader goes to the store through ``tf.io.gfile`` as it would without prefetching; a failure
  here is logged, never raised. Absent files are told apart from failures: a missing status
  comes back as ``""`` (which ``status.Previous`` reads as "no previous attempt").
* The checkpoint is fetched only from a remote (``gs://``) store: a local store is already the
  local copy. The newest ``ckpt-<step>.index`` listed is downloaded, its data files first and its
  index last, into a directory of the run's under ``tempfile.gettempdir()/tpuops-prefetch``
  (``copy_directory``), emptied first; a half-downloaded copy therefore has no index and is no
  checkpoint. The copy is only a candidate: ``checkpoints.Checkpointer.restore_newest`` validates
  it like a store checkpoint (every tensor's CRC32C) and reads the store when it fails. A corrupt
  copy says nothing about the store's files, so only the store's own validation deletes anything
  from the store.
* The store has no writer while an attempt starts (the attempt before is over), so the newest
  checkpoint listed here is still the newest when the restore runs.
* The local copy is removed by ``discard`` once the attempt no longer reads it (after its first
  call: optimizer slots are restored when that call creates them), and each attempt's prefetch
  first removes what an earlier attempt of the run left behind on this machine.

The ``gs://`` reads use the Cloud Storage JSON API with the VM service account's token from the
metadata server, or ``STORAGE_EMULATOR_HOST`` without a token, as the bundle bootstrap
(``templates/fetch_bundle.py``) does; that file runs before the agent's code is unpacked, so it
cannot share this one.
"""

import json
import logging
import os
import shutil
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

from tpuops.agent.paths import CHECKPOINT_INDEX, RunPaths, join, local_directory
from tpuops.agent.preemption import metadata_host
from tpuops.contract.runspec import SpecError, parse_spec

log = logging.getLogger(__name__)

PREFETCH_ROOT = os.path.join(tempfile.gettempdir(), "tpuops-prefetch")
# Per socket operation: a store that does not answer hands the attempt back to its gfile reads.
_TIMEOUT_S = 10.0
_CHUNK = 1 << 20


class _Gcs:
    """Just enough of the Cloud Storage JSON API: read an object, list names under a prefix."""

    def __init__(self) -> None:
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        self._host = (emulator or "https://storage.googleapis.com").rstrip("/")
        self._headers: Dict[str, str] = {}
        if not emulator:
            metadata = metadata_host()
            if metadata is None:
                raise OSError("no metadata server to get a token from (not a Google VM)")
            url = f"http://{metadata}/computeMetadata/v1/instance/service-accounts/default/token"
            token = json.loads(self._get(url, {"Metadata-Flavor": "Google"}).read())["access_token"]
            self._headers["Authorization"] = "Bearer " + token

    @staticmethod
    def _get(url: str, headers: Dict[str, str]) -> Any:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=_TIMEOUT_S)

    def _object_url(self, uri: str) -> str:
        bucket, _, name = uri[len("gs://"):].partition("/")
        return f"{self._host}/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}?alt=media"

    def read(self, uri: str) -> Optional[bytes]:
        """The object's bytes, or None when it does not exist."""
        try:
            with self._get(self._object_url(uri), self._headers) as response:
                return response.read()
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return None
            raise

    def download(self, uri: str, target: str) -> None:
        with self._get(self._object_url(uri), self._headers) as response, open(target, "wb") as out:
            shutil.copyfileobj(response, out, _CHUNK)

    def names(self, directory: str) -> List[str]:
        """The names (without the directory) of the objects directly under ``directory``."""
        bucket, _, prefix = directory[len("gs://"):].partition("/")
        prefix = prefix.rstrip("/") + "/"
        found, page = [], ""
        while True:
            query = urllib.parse.urlencode({"prefix": prefix, "delimiter": "/", "pageToken": page})
            with self._get(f"{self._host}/storage/v1/b/{bucket}/o?{query}", self._headers) as response:
                listing = json.loads(response.read())
            found += [item["name"][len(prefix):] for item in listing.get("items", [])]
            page = listing.get("nextPageToken", "")
            if not page:
                return found


def _newest_index(names: List[str]) -> Optional[int]:
    steps = [int(match.group(1)) for match in map(CHECKPOINT_INDEX.match, names) if match]
    return max(steps) if steps else None


class Prefetch:
    """The fetching thread and what it fetched; each piece is ``None`` until fetched (or when it failed).

    ``command`` decides what is worth fetching: a ``train`` attempt restores a checkpoint, other
    commands need the spec and the status only.
    """

    def __init__(self, spec_location: str, command: str) -> None:
        self._spec_location = spec_location
        self._command = command
        self._gcs: Optional[_Gcs] = None
        self._texts_ready = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._discarded = False
        self._directory: Optional[str] = None
        self.spec: Optional[str] = None
        self.status: Optional[str] = None
        self.checkpoint: Optional[Tuple[int, str]] = None
        """(step, local prefix) of the newest checkpoint's copy, when one was downloaded."""
        self._thread = threading.Thread(target=self._run, name="tpuops-prefetch", daemon=True)

    def start(self) -> "Prefetch":
        self._thread.start()
        return self

    def texts(self) -> Tuple[Optional[str], Optional[str]]:
        """(spec text, status text) once their fetch is over; ``""`` for a status that does not exist."""
        self._texts_ready.wait()
        return self.spec, self.status

    def newest_checkpoint(self) -> Optional[Tuple[int, str]]:
        """(step, local prefix) of the prefetched checkpoint once the fetch is over, or None."""
        self._done.wait()
        return self.checkpoint

    def discard(self) -> None:
        """Remove the local copy; a fetch still running removes it when it ends."""
        with self._lock:
            self._discarded = True
            directory, self._directory, self.checkpoint = self._directory, None, None
        if directory:
            shutil.rmtree(directory, ignore_errors=True)

    def _read(self, location: str) -> Optional[bytes]:
        if "://" not in location:
            try:
                with open(location, "rb") as src:
                    return src.read()
            except FileNotFoundError:
                return None
        if not location.startswith("gs://"):
            raise OSError(f"cannot prefetch from {location}")
        if self._gcs is None:
            self._gcs = _Gcs()
        return self._gcs.read(location)

    def _run(self) -> None:
        try:
            paths = self._fetch_texts()
            if paths is not None and self._command == "train" and paths.ckpt.startswith("gs://"):
                self._fetch_checkpoint(paths.ckpt)
        except Exception as err:  # whatever failed is read from the store instead
            log.warning("prefetch: %s: %s; reading the store instead", type(err).__name__, err)
        finally:
            self._texts_ready.set()
            self._done.set()

    def _fetch_texts(self) -> Optional[RunPaths]:
        try:
            data = self._read(self._spec_location)
            if data is None:
                return None
            self.spec = data.decode("utf-8")
            try:
                spec = parse_spec(self.spec)
            except SpecError:  # the agent reports it when it parses the same text
                return None
            paths = RunPaths(spec.store_root, spec.run_id)
            status = self._read(paths.status)
            self.status = "" if status is None else status.decode("utf-8", "replace")
            return None if spec.script is not None else paths
        finally:
            self._texts_ready.set()

    def _fetch_checkpoint(self, directory: str) -> None:
        assert self._gcs is not None
        names = self._gcs.names(directory)
        step = _newest_index(names)
        if step is None:
            return
        local = copy_directory(directory)
        shutil.rmtree(local, ignore_errors=True)  # an earlier attempt's copy
        os.makedirs(local)
        with self._lock:
            self._directory = local
        stem = f"ckpt-{step}."
        files = sorted((n for n in names if n.startswith(stem)), key=lambda name: name.endswith(".index"))
        for name in files:
            self._gcs.download(join(directory, name), os.path.join(local, name))
        with self._lock:
            if not self._discarded:
                self.checkpoint = (step, os.path.join(local, f"ckpt-{step}"))
                return
        shutil.rmtree(local, ignore_errors=True)


def copy_directory(directory: str) -> str:
    """Where the checkpoints of the store directory ``directory`` are copied: one place per run."""
    return local_directory(PREFETCH_ROOT, directory)
