"""TPU prices: the configured provider's price table, its region overrides and the user's.

Prices are kept per chip-hour so that one number per generation covers every slice size: a
node's hourly price is ``chips * chip-hour price`` for its generation, capacity and region,
with the chips and generation of the accelerator's shape as the provider's offers give it
(``tpuops.providers.offers``: v3-8 is 4 chips on Cloud TPU, v5litepod-8 is 8). The capacities the
offers call spot-priced (Cloud TPU: spot and preemptible) take the spot price.

The price table is the provider's (Cloud TPU's is ``tpuops/providers/cloud_tpu/prices.toml``, package data).
A region with no override there is priced like the base region (an estimate). Users replace
prices with ``Catalog.with_overrides`` (fed from the ``prices`` table of ``tpuops.toml``); an
override of a generation applies in every region.

Lookups are pure; only ``catalog_of`` asks the offers for their table (once per process and provider).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from tpuops.core.errors import UsageError
from tpuops.core.kinds import Capacity
from tpuops.core.naming import is_zone_name
from tpuops.providers.offers import Offers

_FIELDS = ("on_demand", "spot")


@dataclass(frozen=True)
class ChipHour:
    """USD per chip-hour of one generation in one region."""

    on_demand: float
    spot: float


def parse_capacity(capacity: str | Capacity) -> Capacity:
    """``spot``, ``preemptible`` or ``on-demand`` as a ``Capacity``; anything else is a ``UsageError``."""
    try:
        return Capacity(capacity)
    except ValueError:
        allowed = ", ".join(c.value for c in Capacity)
        raise UsageError(f"capacity {capacity!r} is not one of {allowed}") from None


def region_of(zone: str) -> str:
    """``us-central1-a`` → ``us-central1``.

    Raises:
        UsageError: ``zone`` is not a zone name.
    """
    if not is_zone_name(zone):
        raise UsageError(f"zone {zone!r} is not a zone name such as 'us-central1-a'")
    return zone.rsplit("-", 1)[0]


def _price_fields(where: str, table: Any, *, complete: bool) -> dict[str, float]:
    """Validate one ``{on_demand, spot}`` table; ``complete`` demands both fields."""
    if not isinstance(table, Mapping):
        raise UsageError(f"{where}: expected a table such as {{on_demand = 2.0, spot = 0.5}}")
    unknown = sorted(set(table) - set(_FIELDS))
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(_FIELDS)})")
    missing = [name for name in _FIELDS if name not in table]
    if complete and missing:
        raise UsageError(f"{where}: {missing[0]} is missing")
    fields: dict[str, float] = {}
    for name, value in table.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise UsageError(f"{where}.{name} = {value!r} is not allowed: expected USD per chip-hour (>= 0)")
        fields[name] = float(value)
    return fields


@dataclass(frozen=True)
class Catalog:
    """Chip-hour prices by generation, with complete per-region prices where they differ."""

    source: str
    retrieved: date
    currency: str
    base_region: str
    base: Mapping[str, ChipHour]
    """Generation → price in ``base_region``, used in every region without an override."""
    regions: Mapping[str, Mapping[str, ChipHour]]
    """Region → generation → price (base fields replaced by the region's overrides)."""
    offers: Offers = field(repr=False, compare=False)
    """The provider whose prices these are: what an accelerator's shape is, which capacities are spot-priced,
    which preemptions are free (``tpuops.billing.cost``)."""

    @classmethod
    def from_toml(cls, data: Mapping[str, Any], offers: Offers) -> Catalog:
        """Build a catalog of ``offers``' accelerators from the parsed ``prices.toml`` layout.

        Raises:
            UsageError: a missing key, an unknown generation in a region, or a bad price.
        """
        try:
            base = {gen: ChipHour(**_price_fields(f"chip_hour.{gen}", table, complete=True))
                    for gen, table in data["chip_hour"].items()}
            regions: dict[str, dict[str, ChipHour]] = {}
            for region, generations in data.get("regions", {}).items():
                for gen, table in generations.items():
                    where = f"regions.{region}.{gen}"
                    if gen not in base:
                        raise UsageError(f"{where}: no base price for generation {gen!r}")
                    fields = _price_fields(where, table, complete=False)
                    regions.setdefault(region, {})[gen] = dataclasses.replace(base[gen], **fields)
            return cls(source=str(data["source"]), retrieved=data["retrieved"], currency=str(data["currency"]),
                       base_region=str(data["base_region"]), base=base, regions=regions, offers=offers)
        except KeyError as err:
            raise UsageError(f"price catalog: {err.args[0]!r} is missing") from None

    @property
    def generations(self) -> list[str]:
        return sorted(self.base)

    def chip_hour(self, generation: str, region: str) -> ChipHour:
        """The price of one chip of ``generation`` in ``region``.

        Raises:
            UsageError: the catalog has no price for ``generation``.
        """
        price = self.regions.get(region, {}).get(generation) or self.base.get(generation)
        if price is None:
            raise UsageError(f"no price for TPU generation {generation!r} "
                             f"(priced: {', '.join(self.generations)}); add it under [prices] in tpuops.toml")
        return price

    def price_per_hour(self, accelerator_type: str, capacity: str | Capacity, zone: str) -> float:
        """USD per hour of one node of ``accelerator_type`` bought as ``capacity`` in ``zone``.

        Raises:
            UsageError: an unknown accelerator type, capacity or generation, or a bad zone name.
        """
        shape = self.offers.shape(accelerator_type)
        price = self.chip_hour(shape.generation, region_of(zone))
        return shape.chips * (price.spot if self.spot_priced(capacity) else price.on_demand)

    def spot_priced(self, capacity: str | Capacity) -> bool:
        """Whether ``capacity`` is billed at the spot price (``UsageError`` for an unknown capacity)."""
        return parse_capacity(capacity).value in self.offers.spot_priced()

    def with_overrides(self, overrides: Mapping[str, Mapping[str, float]]) -> Catalog:
        """A catalog where the user's prices replace ours, in every region.

        ``overrides`` is keyed by generation, e.g. ``{"v3": {"on_demand": 1.8, "spot": 0.45}}``;
        a field left out keeps the catalog's price (per region).

        Raises:
            UsageError: an unknown generation or key, or a price that is not a number >= 0.
        """
        if not overrides:
            return self
        fields_by_gen: dict[str, dict[str, float]] = {}
        for gen, table in overrides.items():
            if gen not in self.base:
                raise UsageError(f"prices.{gen}: unknown TPU generation (known: {', '.join(self.generations)})")
            fields_by_gen[gen] = _price_fields(f"prices.{gen}", table, complete=False)

        def apply(prices: Mapping[str, ChipHour]) -> dict[str, ChipHour]:
            return {gen: dataclasses.replace(price, **fields_by_gen.get(gen, {})) for gen, price in prices.items()}

        return dataclasses.replace(self, base=apply(self.base),
                                   regions={region: apply(prices) for region, prices in self.regions.items()})


@functools.cache
def catalog_of(offers: Offers) -> Catalog:
    """The prices of ``offers`` (a provider's, ``tpuops.providers.registry.offers_of``), built once per process.

    Raises:
        UsageError: the provider's price table is malformed.
    """
    return Catalog.from_toml(offers.price_table(), offers)
