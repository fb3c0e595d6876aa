"""What Cloud TPU offers: zones, the accelerator types each zone offers, and the runtime versions.

The facts live in one package data file beside this module, ``catalog.json``, with their ``source`` and the
date they were ``retrieved``; this module only reads it (once per process, through
importlib.resources). Both the local emulator (what it serves and refuses) and Cloud TPU's offers
(``accelerators``, ``offers``; ``doctor`` asks them) read this one catalog, so they cannot drift apart.

Invariants: every accelerator type belongs to exactly one family and has exactly one
topology; a zone offers a type only if the type exists; runtime versions are API facts, while
tpuops' own rule (its jobs need a TF 2.9 image) lives in ``accelerators``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

DATA_FILE = "catalog.json"


@dataclass(frozen=True)
class AcceleratorType:
    """One accelerator type: ``v4-16`` is family ``v4``, config type ``V4``, topology ``2x2x2``, 2 hosts."""

    name: str
    family: str
    generation: str
    config_type: str
    topology: str
    size: int
    chips: int
    hosts: int
    counts_cores: bool

    @property
    def single_host(self) -> bool:
        return self.hosts == 1


@dataclass(frozen=True)
class Offerings:
    """The catalog file, parsed: what Cloud TPU offers (``tpuops.billing.pricing.Catalog`` is what it costs)."""

    source: str
    retrieved: str
    accelerators: dict[str, AcceleratorType]
    zones: dict[str, frozenset[str]]
    runtime_versions: tuple[str, ...]

    def zone_known(self, zone: str) -> bool:
        return zone in self.zones

    def offers(self, zone: str, accelerator: str) -> bool:
        return accelerator in self.zones.get(zone, frozenset())

    def accelerators_in(self, zone: str) -> list[AcceleratorType]:
        """The types ``zone`` offers, by family then size (empty for an unknown zone)."""
        names = self.zones.get(zone, frozenset())
        return sorted((self.accelerators[n] for n in names), key=lambda a: (a.family, a.size))

    def zones_offering(self, accelerator: str) -> list[str]:
        return sorted(zone for zone, names in self.zones.items() if accelerator in names)

    def from_config(self, config_type: str, topology: str) -> AcceleratorType | None:
        """The type an ``acceleratorConfig`` {type, topology} names, if any."""
        for spec in self.accelerators.values():
            if spec.config_type == config_type and spec.topology == topology:
                return spec
        return None

    def family_sizes(self, family: str) -> list[int]:
        return sorted(a.size for a in self.accelerators.values() if a.family == family)


def _product(topology: str) -> int:
    product = 1
    for part in topology.split("x"):
        product *= int(part)
    return product


def parse(data: dict) -> Offerings:
    """Build a catalog from the file's JSON layout (see ``catalog.json``)."""
    accelerators: dict[str, AcceleratorType] = {}
    for family, spec in data["families"].items():
        counts_cores = spec["counts"] == "cores"
        for name, topology in spec["topologies"].items():
            chips = _product(topology)
            hosts = 1 if chips <= spec["chips_on_one_host"] else chips // 4
            accelerators[name] = AcceleratorType(
                name=name, family=family, generation=spec["generation"], config_type=spec["config_type"],
                topology=topology, size=chips * 2 if counts_cores else chips, chips=chips, hosts=hosts,
                counts_cores=counts_cores,
            )
    zones: dict[str, frozenset[str]] = {}
    for zone, offers in data["zones"].items():
        names = set()
        for offer in offers:
            family = data["families"].get(offer)
            names.update(family["topologies"] if family else [offer])
        unknown = names - set(accelerators)
        if unknown:
            raise ValueError(f"catalog zone {zone} offers unknown accelerator types {sorted(unknown)}")
        zones[zone] = frozenset(names)
    return Offerings(
        source=data["source"], retrieved=data["retrieved"], accelerators=accelerators, zones=zones,
        runtime_versions=tuple(data["runtime_versions"]),
    )


@lru_cache(maxsize=1)
def load() -> Offerings:
    """The catalog shipped in the package, read once."""
    text = resources.files("tpuops.providers.cloud_tpu").joinpath(DATA_FILE).read_text(encoding="utf-8")
    return parse(json.loads(text))
