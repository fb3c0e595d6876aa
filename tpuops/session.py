"""Wiring: turn ``Settings`` into the live collaborators a command needs.

Kept apart from the modules it wires so each of them takes its collaborators as
arguments (tests build them directly), and so that starting the local emulator on demand
happens in exactly one place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tpuops.config import Settings
from tpuops.kinds import Provider
from tpuops.ledger import Ledger
from tpuops.tpu import TpuApi

if TYPE_CHECKING:
    from tpuops.provision import Provisioner
    from tpuops.store import Store


def tpu_endpoint(settings: Settings) -> str | None:
    """The Cloud TPU API endpoint: configured, else the local emulator (started if needed)."""
    if settings.tpu_endpoint:
        return settings.tpu_endpoint
    if settings.provider is Provider.LOCAL:
        from tpuops.emulator.control import ensure_running

        return ensure_running(settings.emulator_dir, image_python=settings.emulated_image_python).endpoint
    return None


def connect(settings: Settings) -> TpuApi:
    return TpuApi(settings.project, endpoint=tpu_endpoint(settings), deadline_s=settings.api_deadline_s,
                  poll_interval_s=settings.poll_interval_s)


def open_ledger(settings: Settings) -> Ledger:
    settings.home.mkdir(parents=True, exist_ok=True)
    return Ledger(settings.ledger_path)


def provisioner(settings: Settings, progress: Callable[[str], None] | None = None) -> Provisioner:
    """The node engine for the configured project (``up``, ``down``, ``status``)."""
    from tpuops.provision import Provisioner

    return Provisioner(connect(settings), settings, open_ledger(settings), progress or (lambda _text: None))


def store(settings: Settings) -> Store:
    """The store root (a local directory is created by its first write, so a refused command leaves none)."""
    from tpuops.store import open_store

    return open_store(settings.store_root)
