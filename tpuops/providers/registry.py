"""Every node provider by name: the one place a provider is registered (``node_provider`` in tpuops.toml).

Adding a provider (TPUs on GKE, a simulated cloud) is one module and one line here: the module's
class implements ``tpuops.providers.base.NodeProvider`` (optional capabilities as its other
protocols) with a ``connect(Connection)`` class method, and the line maps its name to that method.
Nothing dispatches on names anywhere else; the ``Fleet`` holds whichever provider this returns.
"""

from __future__ import annotations

from collections.abc import Callable

from tpuops.errors import UsageError
from tpuops.providers.base import Connection, NodeProvider
from tpuops.providers.cloud_tpu import TpuApi
from tpuops.providers.memory import MemoryProvider
from tpuops.providers.simulated import SimulatedCloud

PROVIDERS: dict[str, Callable[[Connection], NodeProvider]] = {
    "cloud-tpu": TpuApi.connect,
    "memory": MemoryProvider.connect,
    "simulated": SimulatedCloud.connect,
}


def open_provider(name: str, connection: Connection) -> NodeProvider:
    """The provider registered as ``name``, opened on ``connection``; ``UsageError`` for an unknown name."""
    factory = PROVIDERS.get(name)
    if factory is None:
        raise UsageError(f"unknown node provider {name!r}: expected one of {', '.join(sorted(PROVIDERS))}")
    return factory(connection)
