"""Every node provider by name: the one place a provider is registered (``node_provider`` in tpuops.toml).

Adding a provider (TPUs on GKE, a simulated cloud) is one module and one line here: the module's
class implements ``tpuops.providers.base.NodeProvider`` (optional capabilities as its other
protocols) with a ``connect(Connection)`` class method and an ``offers`` (``tpuops.providers.offers``: what its
nodes are), and the line maps its name to that class.
Nothing dispatches on names anywhere else; the ``Fleet`` holds whichever provider this returns, and
what needs no connection (a dry run's request body) asks the class itself (``provider_class``).
A line names its class by import path, and the class is imported when it is asked for: a command loads only
the one it uses. ``config`` imports no provider: the settings are checked against the registry and the
configured provider's own rules (its zones and accelerators) through ``RULES``, which the api layer hands to
``config.load_settings`` (``tpuops.api.load_settings``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Protocol

from tpuops.core.errors import UsageError

if TYPE_CHECKING:
    from tpuops.providers.base import Connection, NodeProvider
    from tpuops.providers.nodes import NodeRequest
    from tpuops.providers.offers import Offers


class ProviderClass(Protocol):
    """A provider's class: ``connect`` opens one on a ``Connection``; ``talks_to_emulator``: whether a ``local``
    cloud (``Settings.cloud``) serves it through the local Cloud TPU emulator (a provider of its own world needs none);
    ``create_body``: what its ``create_node`` would send for a request, in its own vocabulary (a dry run shows it);
    ``check_zone``, ``check_accelerator``: its rules for the settings (``UsageError``, one line), asked through
    ``RULES``; ``zones_for``: which of the configured zones (in their order) may hold an accelerator, where a
    create or recreate of it may go (``UsageError`` when none); ``offers``: what a node of each of its
    accelerators is (shape, runtimes, prices, zones: ``tpuops.providers.offers.Offers``)."""

    talks_to_emulator: bool
    offers: Offers

    def connect(self, connection: Connection) -> NodeProvider: ...

    def create_body(self, project: str, zone: str, request: NodeRequest) -> dict[str, Any]: ...

    def check_zone(self, zone: str) -> str: ...

    def check_accelerator(self, accelerator: str) -> str: ...

    def zones_for(self, accelerator: str, zones: list[str]) -> list[str]: ...


PROVIDERS: dict[str, str] = {
    "cloud-tpu": "tpuops.providers.cloud_tpu.adapter:TpuApi",
    "memory": "tpuops.providers.memory:MemoryProvider",
    "simulated": "tpuops.providers.simulated:SimulatedCloud",
}


def provider_class(name: str) -> ProviderClass:
    """The class registered as ``name``; ``UsageError`` for an unknown name."""
    path = PROVIDERS.get(name)
    if path is None:
        raise UsageError(f"unknown node provider {name!r}: expected one of {', '.join(sorted(PROVIDERS))}")
    module, _, attribute = path.partition(":")
    found: ProviderClass = getattr(importlib.import_module(module), attribute)
    return found


def offers_of(name: str) -> Offers:
    """What the provider registered as ``name`` offers: the one answer, outside ``tpuops.providers``, to what a
    node of an accelerator is (no connection needed); ``UsageError`` for an unknown name."""
    return provider_class(name).offers


def open_provider(name: str, connection: Connection) -> NodeProvider:
    """The provider registered as ``name``, opened on ``connection``; ``UsageError`` for an unknown name."""
    return provider_class(name).connect(connection)


class Rules:
    """The providers' rules as ``tpuops.config`` asks for them (``config.ProviderRules``): the registered names,
    and each provider's own zone and accelerator checks."""

    def names(self) -> list[str]:
        return sorted(PROVIDERS)

    def check_zone(self, provider: str, zone: str) -> str:
        return provider_class(provider).check_zone(zone)

    def check_accelerator(self, provider: str, accelerator: str) -> str:
        return provider_class(provider).check_accelerator(accelerator)


RULES = Rules()
"""What ``tpuops.api.load_settings`` and ``api.init`` hand to ``config``."""
