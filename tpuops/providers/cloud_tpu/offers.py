"""Cloud TPU's offers: the one answer, for the ``cloud-tpu`` provider, to what a node of an accelerator is.

``CLOUD_TPU`` (an ``tpuops.providers.offers.Offers``) says the shape of a type (``accelerators``, from the
catalog), its runtimes (the TF 2.9 rules of ``accelerators``), the zones that offer it, the chip-hour prices
(``prices.toml``, package data beside this module) and the first-minute rule (``billing_rules``).
``CloudTpuRules`` holds the same facts as the class methods the registry asks when it checks the settings; the
adapter (``adapter``) and the in-process worlds that model Cloud TPU (``memory``, ``simulated``) derive
from it, so each answers with Cloud TPU's offers.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping
from importlib import resources
from typing import Any, ClassVar

from tpuops.providers.cloud_tpu import accelerators, billing_rules
from tpuops.providers.cloud_tpu import catalog as tpu_catalog
from tpuops.providers.offers import AcceleratorShape, Offers

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

PRICES_FILE = "prices.toml"


class CloudTpuOffers:
    """Cloud TPU's ``Offers``: the catalog, the TF 2.9 runtime rules, the price list and the first-minute rule."""

    def shape(self, accelerator: str) -> AcceleratorShape:
        return accelerators.parse_accelerator(accelerator)

    def runtime_version(self, shape: AcceleratorShape, requested: str | None = None) -> str:
        return accelerators.resolve_runtime_version(shape, requested)

    def zones_offering(self, accelerator: str) -> list[str]:
        return tpu_catalog.load().zones_offering(accelerator)

    def price_table(self) -> Mapping[str, Any]:
        return _price_table()

    def spot_priced(self) -> frozenset[str]:
        return billing_rules.PREEMPTIBLE_CAPACITIES

    def preemption_is_free(self, capacity: str, created_s: float, preempted_s: float) -> bool:
        return billing_rules.preemption_is_free(capacity, created_s, preempted_s)


@functools.cache
def _price_table() -> Mapping[str, Any]:
    text = resources.files("tpuops.providers.cloud_tpu").joinpath(PRICES_FILE).read_text(encoding="utf-8")
    return tomllib.loads(text)


CLOUD_TPU: Offers = CloudTpuOffers()
"""Cloud TPU's offers, one per process."""


class CloudTpuRules:
    """A provider's rules and offers (``tpuops.providers.registry.ProviderClass``) as Cloud TPU's: its zones and
    accelerator types for the settings, ``offers`` for everything else. A provider of another cloud says its own:
    ``check_zone``, ``check_accelerator`` and ``zones_for`` class methods that raise ``UsageError`` (one line),
    and an ``offers`` of its own."""

    offers: ClassVar[Offers] = CLOUD_TPU

    @classmethod
    def check_zone(cls, zone: str) -> str:
        return accelerators.check_zone(zone)

    @classmethod
    def check_accelerator(cls, accelerator: str) -> str:
        return accelerators.parse_accelerator(accelerator).type

    @classmethod
    def zones_for(cls, accelerator: str, zones: list[str]) -> list[str]:
        return accelerators.offered_zones(accelerator, zones)
