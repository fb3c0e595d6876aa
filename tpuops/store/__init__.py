"""The store root behind one interface: ``Store`` (contract in ``base``), ``GcsStore`` and ``LocalStore``.

``open_store(uri)`` picks the implementation from the URI scheme through an explicit table;
google-cloud-storage is imported only when a ``gs://`` store is opened. ``lease`` builds leases on
the store's compare-and-swap.

May import: the standard library, google-cloud-storage (only when a ``gs://`` store is opened) and
``tpuops.core``; nothing that knows a run, a node or a price: every wing that keeps documents stands on the
store, so the store stands on nothing but the core.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from tpuops.core.errors import IntegrityError, PreconditionFailed, UsageError
from tpuops.store.base import ObjectInfo, Store
from tpuops.store.local import LocalStore

if TYPE_CHECKING:
    from google.cloud import storage

__all__ = [
    "IntegrityError",
    "LocalStore",
    "ObjectInfo",
    "PreconditionFailed",
    "Store",
    "gcs_client",
    "open_store",
    "split_gcs_uri",
]


def gcs_client(endpoint: str | None = None, project: str | None = None) -> storage.Client:
    """A Cloud Storage client: anonymous against ``endpoint`` (an emulator) if given, else the SDK default.

    Without ``endpoint`` the SDK decides: ``STORAGE_EMULATOR_HOST`` if set, otherwise
    Application Default Credentials.
    """
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    if endpoint:
        return storage.Client(
            project=project or "tpuops-local",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": endpoint},
        )
    from tpuops.store.gcs import convert_error

    try:
        return storage.Client(project=project)
    except Exception as err:
        converted = convert_error(err, "gs://")
        if converted is None:
            raise
        raise converted from err


def split_gcs_uri(uri: str) -> tuple[str, str]:
    """``gs://bucket/a/b`` → ``("bucket", "a/b")``."""
    parsed = urlparse(uri)
    if parsed.scheme != "gs" or not parsed.netloc:
        raise UsageError(f"{uri!r} is not a bucket URI (expected gs://BUCKET[/PREFIX])")
    return parsed.netloc, parsed.path.strip("/")


def _open_gcs(uri: str, endpoint: str | None) -> Store:
    from tpuops.store.gcs import GcsStore

    bucket, prefix = split_gcs_uri(uri)
    return GcsStore(bucket, prefix, client=gcs_client(endpoint))


def _open_local(uri: str, endpoint: str | None) -> Store:
    path = urlparse(uri).path if uri.startswith("file://") else uri
    if not path:
        raise UsageError(f"{uri!r} is not a directory path")
    root = Path(path).expanduser().absolute()
    _refuse_a_file_in_the_way(uri, root)
    return LocalStore(root)


def _refuse_a_file_in_the_way(uri: str, root: Path) -> None:
    """A local store is a folder: a file at its root (or above it) is the user's mistake, said before any write.

    Without this, a write under it failed with the OS's "Not a directory" as a failure of the world (exit 1).
    """
    for place in (root, *root.parents):
        try:
            if place.is_dir():
                return
            if not place.exists():
                continue
        except OSError:  # unreadable: the store's own calls say so, as a failure of the world
            return
        where = "is a file" if place == root else f"is inside {str(place)!r}, which is a file"
        raise UsageError(f"{uri!r} {where}: a store or dataset location is a folder (or gs://BUCKET/PREFIX)")


_OPENERS: dict[str, Callable[[str, str | None], Store]] = {
    "gs": _open_gcs,
    "file": _open_local,
    "": _open_local,
}


def open_store(uri: str, *, gcs_endpoint: str | None = None) -> Store:
    """The store for ``uri``: ``gs://BUCKET[/PREFIX]`` → GcsStore; a path or ``file://`` URI → LocalStore.

    Args:
        gcs_endpoint: talk to this Cloud Storage endpoint (fake-gcs-server) with anonymous credentials.
    Raises:
        UsageError: an unsupported scheme.
    """
    scheme = urlparse(uri).scheme if "://" in uri else ""
    opener = _OPENERS.get(scheme)
    if opener is None:
        raise UsageError(f"{uri!r}: unsupported store scheme {scheme!r} (use gs://BUCKET/PREFIX or a directory)")
    return opener(uri, gcs_endpoint)
