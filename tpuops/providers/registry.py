"""Every node provider by name: the one place a provider is registered (``node_provider`` in tpuops.toml).

Adding a provider (TPUs on GKE, a simulated cloud) is one module and one line here: the module's
class implements ``tpuops.providers.base.NodeProvider`` (optional capabilities as its other
protocols) with a ``connect(Connection)`` class method, and the line maps its name to that class.
Nothing dispatches on names anywhere else; the ``Fleet`` holds whichever provider this returns, and
what needs no connection (a dry run's request body) asks the class itself (``provider_class``).
Invariant: this module imports nothing of tpuops above the providers (``config`` imports it to
check ``node_provider``).
"""

from __future__ import annotations

from typing import Protocol

from tpuops.errors import UsageError
from tpuops.providers.base import Connection, NodeProvider
from tpuops.providers.cloud_tpu import TpuApi
from tpuops.providers.memory import MemoryProvider
from tpuops.providers.simulated import SimulatedCloud


class ProviderClass(Protocol):
    """A provider's class: ``connect`` opens one on a ``Connection``."""

    def connect(self, connection: Connection) -> NodeProvider: ...


PROVIDERS: dict[str, ProviderClass] = {
    "cloud-tpu": TpuApi,
    "memory": MemoryProvider,
    "simulated": SimulatedCloud,
}


def provider_class(name: str) -> ProviderClass:
    """The class registered as ``name``; ``UsageError`` for an unknown name."""
    found = PROVIDERS.get(name)
    if found is None:
        raise UsageError(f"unknown node provider {name!r}: expected one of {', '.join(sorted(PROVIDERS))}")
    return found


def open_provider(name: str, connection: Connection) -> NodeProvider:
    """The provider registered as ``name``, opened on ``connection``; ``UsageError`` for an unknown name."""
    return provider_class(name).connect(connection)
