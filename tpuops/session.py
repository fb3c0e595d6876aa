"""Wiring: turn ``Settings`` into the live collaborators a command needs.

Kept apart from the modules it wires so each of them takes its collaborators as
arguments (tests build them directly), and so that starting the local emulator on demand
happens in exactly one place.

With provider ``local`` and a ``gs://`` store, the emulator also serves the store's bucket
through fake-gcs-server (nodes reach it as storage.googleapis.com); ``store`` then points this
process's Cloud Storage clients at it with ``STORAGE_EMULATOR_HOST``, the variable the SDK
itself honours, so that every store opened from a URI here (datasets, sweeps) reaches it too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tpuops.config import Settings
from tpuops.kinds import Provider
from tpuops.ledger import Ledger

if TYPE_CHECKING:
    from tpuops.fleet import Fleet
    from tpuops.providers.base import NodeProvider
    from tpuops.store import Store


def emulated_buckets(settings: Settings) -> list[str]:
    """The buckets the local emulator serves: the store's, when provider ``local`` has a ``gs://`` store."""
    if settings.provider is Provider.LOCAL and settings.store_root.startswith("gs://"):
        from tpuops.store import split_gcs_uri

        return [split_gcs_uri(settings.store_root)[0]]
    return []


def tpu_endpoint(settings: Settings) -> str | None:
    """The Cloud TPU API endpoint: configured, else the local emulator (started if needed)."""
    if settings.tpu_endpoint:
        return settings.tpu_endpoint
    if settings.provider is Provider.LOCAL:
        from tpuops.emulator.control import ensure_running

        return ensure_running(settings.emulator_dir, image_python=emulated_image_python(settings),
                              gcs_buckets=emulated_buckets(settings)).endpoint
    return None


def emulated_image_python(settings: Settings) -> str:
    """The interpreter that plays the TPU VM image's python3 on the emulator: the local TF 2.9 runtime.

    Raises ``UsageError`` (one line: how to get one) when there is none (``tpuops.tfenv``).
    """
    from tpuops.tfenv.locate import require

    return str(require(settings))


def connect(settings: Settings) -> NodeProvider:
    """The configured node provider (``node_provider``, default Cloud TPU) on the configured endpoint.

    A local endpoint's bearer token (the emulator's) is looked up here, the one place that knows
    about the emulator, and handed to the provider.
    """
    from tpuops.providers.base import Connection
    from tpuops.providers.registry import open_provider

    endpoint = tpu_endpoint(settings)
    token = None
    if endpoint and endpoint.startswith("http://"):
        from tpuops.emulator.control import token_for

        token = token_for(endpoint)
    return open_provider(settings.node_provider, Connection(
        settings.project, endpoint=endpoint, token=token, deadline_s=settings.api_deadline_s,
        poll_interval_s=settings.poll_interval_s))


def open_ledger(settings: Settings) -> Ledger:
    settings.home.mkdir(parents=True, exist_ok=True)
    return Ledger(settings.ledger_path)


def fleet(settings: Settings, progress: Callable[[str], None] | None = None) -> Fleet:
    """The configured project's nodes: the one holder of the provider (``up``, ``down``, ``status``, the controller)."""
    from tpuops.fleet import Fleet

    return Fleet(connect(settings), settings, open_ledger(settings), progress or (lambda _text: None))


def store(settings: Settings) -> Store:
    """The store root (a local directory is created by its first write, so a refused command leaves none)."""
    from tpuops.store import open_store

    if emulated_buckets(settings):
        import os

        from tpuops.emulator.control import storage_endpoint

        tpu_endpoint(settings)
        endpoint = storage_endpoint(settings.emulator_dir)
        if endpoint:
            os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    return open_store(settings.store_root)
