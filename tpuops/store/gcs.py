"""``GcsStore``: the store on Cloud Storage through google-cloud-storage (or fake-gcs-server).

This is the adapter: every SDK call goes through ``_call``, which converts SDK and transport
exceptions into ``tpuops.core.errors`` exactly once and retries transient ones with
``call_with_retry``. The SDK's own retries are switched off (``retry=None``) so that there is
one retry policy.

Uploads: files above ``resumable_threshold`` go through a resumable session in
``chunk_size`` pieces (bounded memory per worker); smaller ones in one multipart request.
The local file's crc32c is computed first, sent with the upload so that Cloud Storage
rejects a mismatch, and compared with the crc32c the server reports for the new object.
A failed attempt restarts that object from byte 0 in a new session: fake-gcs-server (our test
server) cannot answer a session status query, and shards are bounded in size, so the
simple restart is the one path we can test.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

import google_crc32c

from tpuops.core.errors import (
    AlreadyExists,
    IntegrityError,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    PreconditionFailed,
    TpuopsError,
    TransientError,
    UsageError,
)
from tpuops.core.retry import call_with_retry
from tpuops.store.base import (
    ObjectInfo,
    ProgressFn,
    Store,
    check_key,
    check_prefix,
)
from tpuops.store.files import crc32c_of_file, digest_base64, open_for_reading, write_atomically

if TYPE_CHECKING:
    from google.cloud import storage

T = TypeVar("T")

MIB = 1 << 20
DEFAULT_CHUNK_SIZE = 100 * MIB  # as transfer_manager: fewer round trips; memory is workers x chunk
MULTIPART_LIMIT = 8 * MIB  # google-cloud-storage sends a known size up to this in one request
_PUBLIC_ENDPOINT = "https://storage.googleapis.com"
_CHUNK_MULTIPLE = 256 * 1024  # Cloud Storage requires resumable chunks in multiples of 256 KiB

_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def _reopen(bucket: str, prefix: str, endpoint: str | None, chunk_size: int, resumable_threshold: int,
            deadline_s: float) -> GcsStore:
    """How a pickled ``GcsStore`` comes back: the same objects, through a client of its own."""
    from tpuops.store import gcs_client

    return GcsStore(bucket, prefix, client=gcs_client(endpoint), chunk_size=chunk_size,
                    resumable_threshold=resumable_threshold, deadline_s=deadline_s)


class GcsStore(Store):
    """Objects under ``gs://bucket/prefix``.

    Args:
        bucket: the bucket name.
        prefix: the root inside the bucket ('' or 'a/b').
        client: a ``google.cloud.storage.Client`` (see ``tpuops.store.gcs_client``).
        chunk_size: bytes per resumable request, a multiple of 256 KiB.
        resumable_threshold: files larger than this use a resumable session (at most 8 MiB).
        deadline_s: how long one operation may keep retrying transient errors.
        on_retry: called with (error, seconds until the next attempt) before each retry.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        client: storage.Client,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        resumable_threshold: int = MULTIPART_LIMIT,
        deadline_s: float = 120.0,
        on_retry: Callable[[BaseException, float], None] | None = None,
    ) -> None:
        if chunk_size <= 0 or chunk_size % _CHUNK_MULTIPLE:
            raise UsageError(f"chunk size {chunk_size} is not a positive multiple of 256 KiB")
        if not 0 <= resumable_threshold <= MULTIPART_LIMIT:
            raise UsageError(f"resumable threshold {resumable_threshold} must be between 0 and 8 MiB")
        self._client = client
        self._bucket = client.bucket(bucket)
        self._prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        self._chunk_size = chunk_size
        self._threshold = resumable_threshold
        self._deadline_s = deadline_s
        self._on_retry = on_retry

    def __reduce__(self) -> tuple[Any, ...]:
        # The client does not pickle: the copy makes its own, against the same endpoint (an
        # emulator's explicitly, Cloud Storage's through the SDK default). ``on_retry`` stays behind.
        endpoint = self._client.api_endpoint
        return _reopen, (self._bucket.name, self._prefix, None if endpoint == _PUBLIC_ENDPOINT else endpoint,
                         self._chunk_size, self._threshold, self._deadline_s)

    @property
    def uri(self) -> str:
        return f"gs://{self._bucket.name}/{self._prefix}".rstrip("/")

    def stat(self, key: str) -> ObjectInfo:
        name = self._name(key)

        def get() -> ObjectInfo:
            blob = self._bucket.get_blob(name, retry=None)
            if blob is None:
                raise NotFound(f"{self.uri_of(key)}: no such object")
            return self._info(key, blob)

        return self._call(key, get)

    def read_versioned(self, key: str) -> tuple[bytes, int]:
        blob = self._bucket.blob(self._name(key))

        def read() -> tuple[bytes, int]:
            data = blob.download_as_bytes(checksum="crc32c", retry=None)
            return data, int(blob.generation)

        return self._call(key, read)

    def write_bytes(self, key: str, data: bytes) -> int:
        name = self._name(key)

        def write() -> int:
            blob = self._bucket.blob(name)
            blob.upload_from_string(data, checksum="crc32c", retry=None)
            return int(blob.generation)

        return self._call(key, write)

    def write_if_generation_match(self, key: str, data: bytes, generation: int) -> int:
        name = self._name(key)
        attempts = 0

        def write() -> int:
            nonlocal attempts
            attempts += 1
            blob = self._bucket.blob(name)
            try:
                self._sdk(key, lambda: blob.upload_from_string(
                    data, checksum="crc32c", if_generation_match=generation, retry=None))
            except PreconditionFailed:
                if attempts > 1:
                    # An earlier attempt may have landed with its answer lost: if the object now
                    # holds exactly our bytes, that write was ours.
                    with contextlib.suppress(NotFound):
                        current, current_generation = self.read_versioned(key)
                        if current == data:
                            return current_generation
                raise
            return int(blob.generation)

        return self._retry(write)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        check_prefix(prefix)
        full = self._prefix + prefix

        def listing() -> list[ObjectInfo]:
            blobs = self._client.list_blobs(self._bucket, prefix=full, retry=None)
            # Names ending in "/" are folder markers (TensorFlow's makedirs writes them), not objects
            # of this store: a local store has no such files either.
            return [self._info(blob.name[len(self._prefix):], blob) for blob in blobs if not blob.name.endswith("/")]

        return sorted(self._call(prefix, listing), key=lambda info: info.key)

    def delete(self, key: str) -> None:
        name = self._name(key)

        def delete() -> None:
            try:
                self._sdk(key, lambda: self._bucket.delete_blob(name, retry=None))
            except NotFound:
                return

        self._retry(delete)

    def upload_file(
        self,
        path: Path,
        key: str,
        *,
        expected_crc32c: str | None = None,
        progress: ProgressFn | None = None,
    ) -> ObjectInfo:
        name = self._name(key)
        path = Path(path)
        try:
            local_crc = crc32c_of_file(path)
            size = path.stat().st_size
        except OSError as err:
            raise UsageError(f"{path}: cannot read: {err.strerror or err}") from err
        if expected_crc32c is not None and local_crc != expected_crc32c:
            raise IntegrityError(
                f"{path}: crc32c is {local_crc}, expected {expected_crc32c} "
                "(the file changed since its manifest was written)"
            )
        # A size of None makes the SDK open a resumable session whatever the size.
        declared_size = size if size <= self._threshold else None

        def upload() -> ObjectInfo:
            blob = self._bucket.blob(name, chunk_size=self._chunk_size)
            with open_for_reading(path) as handle:
                stream = _ProgressReader(handle, progress)
                try:
                    self._sdk(key, lambda: blob.upload_from_file(
                        stream, size=declared_size, checksum="crc32c", crc32c_checksum_value=local_crc, retry=None,
                    ))
                except NotFound:
                    # The bucket is there, so the 404 was the resumable session (expired, or the
                    # server restarted): start the object again.
                    if self._sdk(key, lambda: self._bucket.exists(retry=None)):
                        raise TransientError(f"{self.uri_of(key)}: upload session lost; restarting") from None
                    raise
            if blob.crc32c != local_crc or blob.size != size:
                raise TransientError(
                    f"{self.uri_of(key)}: stored crc32c {blob.crc32c} / {blob.size} bytes do not match "
                    f"the local {local_crc} / {size} bytes (corrupted in transit)"
                )
            return self._info(key, blob)

        return self._call(key, upload)

    def download_file(self, key: str, path: Path) -> ObjectInfo:
        name = self._name(key)
        path = Path(path)

        def download() -> ObjectInfo:
            blob = self._bucket.blob(name)
            checksum = google_crc32c.Checksum()
            size = 0

            def fill(target: IO[bytes]) -> None:
                nonlocal size
                writer = _HashingWriter(target, checksum, path)
                blob.download_to_file(writer, checksum="crc32c", retry=None)
                size = writer.size
                if blob.crc32c is not None and digest_base64(checksum) != blob.crc32c:
                    raise TransientError(
                        f"{self.uri_of(key)}: downloaded bytes do not match crc32c {blob.crc32c}"
                    )

            write_atomically(path, fill)
            return ObjectInfo(key, size, digest_base64(checksum), int(blob.generation))

        return self._call(key, download)

    def location(self) -> str | None:
        """The bucket's location; a configurable dual-region as its regions joined by '+'."""

        def reload() -> str | None:
            self._bucket.reload(retry=None)
            regions = self._bucket.data_locations
            return "+".join(regions) if regions else self._bucket.location

        return self._call("", reload)

    def _name(self, key: str) -> str:
        return self._prefix + check_key(key)

    def _info(self, key: str, blob: storage.Blob) -> ObjectInfo:
        return ObjectInfo(key, int(blob.size or 0), blob.crc32c or "", int(blob.generation))

    def _call(self, key: str, fn: Callable[[], T]) -> T:
        """Run one SDK operation on ``key`` ('' for the store itself) with conversion and the retry policy."""
        return self._retry(lambda: self._sdk(key, fn))

    def _retry(self, fn: Callable[[], T]) -> T:
        return call_with_retry(fn, deadline_s=self._deadline_s, on_retry=self._on_retry)

    def _sdk(self, key: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` once, converting SDK failures (the one place that inspects them)."""
        try:
            return fn()
        except TpuopsError:
            raise
        except Exception as err:
            converted = convert_error(err, f"{self.uri}/{key}" if key else self.uri)
            if converted is None:
                raise
            raise converted from err


class _HashingWriter(io.RawIOBase):
    """A write-only file that checksums what passes through; local write errors become UsageError."""

    def __init__(self, target: IO[bytes], checksum: google_crc32c.Checksum, path: Path) -> None:
        super().__init__()
        self._target = target
        self._checksum = checksum
        self._path = path
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self._checksum.update(bytes(data))
        try:
            self._target.write(data)
        except OSError as err:
            raise UsageError(f"{self._path}: cannot write: {err.strerror or err}") from err
        self.size += len(data)
        return len(data)


class _ProgressReader(io.RawIOBase):
    """A read-only view of a file that reports how far the SDK has read (the bytes sent)."""

    def __init__(self, handle: IO[bytes], progress: ProgressFn | None) -> None:
        super().__init__()
        self._handle = handle
        self._progress = progress

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        if self._progress is not None:
            self._progress(self._handle.tell())
        return data

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def tell(self) -> int:
        return self._handle.tell()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._handle.seek(offset, whence)


def convert_error(err: BaseException, where: str) -> TpuopsError | None:
    """Map a google-cloud-storage / transport exception onto the taxonomy; None if it is not one."""
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth
    from google.cloud.storage.exceptions import DataCorruption, InvalidResponse
    from requests import exceptions as http
    from urllib3 import exceptions as urllib3_errors

    if isinstance(err, api.GoogleAPICallError):
        return _from_status(err.code, where, _first_line(err.message))
    if isinstance(err, InvalidResponse):
        status = getattr(err.response, "status_code", None)
        return _from_status(status, where, f"unexpected HTTP {status}")
    if isinstance(err, DataCorruption):
        return TransientError(f"{where}: checksum mismatch in transit")
    if isinstance(err, auth.DefaultCredentialsError):
        return PermissionDenied(
            f"{where}: no Google Cloud credentials (run 'gcloud auth application-default login')"
        )
    if isinstance(err, auth.RefreshError):
        return PermissionDenied(f"{where}: credentials were refused: {_first_line(str(err))}")
    if isinstance(err, http.RequestException | urllib3_errors.HTTPError | auth.TransportError | ConnectionError):
        return TransientError(f"{where}: connection failed: {type(err).__name__}")
    return None


def _from_status(status: int | None, where: str, detail: str) -> TpuopsError:
    if status in _TRANSIENT_STATUS:
        return TransientError(f"{where}: HTTP {status} {detail}")
    if status == 404:
        return NotFound(f"{where}: no such object or bucket")
    if status == 410:
        return TransientError(f"{where}: upload session expired (HTTP 410)")
    if status in (401, 403):
        return PermissionDenied(f"{where}: permission denied (HTTP {status})")
    if status == 412:
        return PreconditionFailed(f"{where}: generation precondition failed (someone else wrote it)")
    if status == 409:
        return AlreadyExists(f"{where}: conflict (HTTP 409) {detail}")
    if status == 400:
        return InvalidRequest(f"{where}: rejected (HTTP 400) {detail}")
    return TpuopsError(f"{where}: HTTP {status} {detail}")


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:200] if text and text.strip() else ""
