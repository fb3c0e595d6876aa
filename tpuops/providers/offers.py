"""What a provider offers, in neutral values: the shape of an accelerator, its runtimes, its prices, its zones.

A registered provider class carries one ``Offers`` (``ProviderClass.offers``, asked through
``tpuops.providers.registry.offers_of``): the one place that says, for an accelerator name of that provider,
how many hosts, chips and replicas a node of it has (``AcceleratorShape``), which runtime versions it accepts
and which is the default, which zones offer it, what a chip-hour costs per capacity and region (its price
table, in the layout ``tpuops.billing.pricing`` reads) and when a preempted node is free. Everything outside
``tpuops.providers`` that needs to know what a node *is* (``launch``, ``billing``, ``accounting``, ``runs``,
``api``) asks these values, never a cloud's catalog, so a provider of another cloud brings its own offers and
nothing else changes.

Standard library and ``tpuops.core`` only: the protocol names no catalog.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from tpuops.core.errors import UsageError


@dataclass(frozen=True)
class AcceleratorShape:
    """What one node of an accelerator type is, whatever the cloud calls its parts.

    ``v3-32`` on Cloud TPU: generation ``v3``, 16 chips on 4 hosts, 32 replicas (TensorCores); the same slice
    as a GKE JobSet is 4 pods of 4 chips each.
    """

    type: str
    """The accelerator type exactly as the provider spells it (``v5litepod-8``)."""
    generation: str
    """The TPU generation its chips are priced by (``v3``, ``v5e``)."""
    chips: int
    hosts: int
    """The hosts (workers, pods) of one node: the job runs on worker 0, every worker must stay healthy."""
    replicas: int
    """The replicas of TPUStrategy (TensorCores): a global batch is split over them."""

    @property
    def multi_host(self) -> bool:
        """A slice spanning hosts: a preemption of any host takes the whole slice."""
        return self.hosts > 1

    def __str__(self) -> str:
        return self.type


class Offers(Protocol):
    """One provider's offers (see the module docstring). Pure lookups: no call leaves the process, and every
    method is safe to call from many threads at once."""

    def shape(self, accelerator: str) -> AcceleratorShape:
        """The shape of a node of ``accelerator``.

        Raises:
            UsageError: the provider offers no such accelerator (one line naming what it does offer).
        """
        ...

    def runtime_version(self, shape: AcceleratorShape, requested: str | None = None) -> str:
        """The runtime to create a node of ``shape`` with: ``requested`` after checking it fits, else the default.

        Raises:
            UsageError: ``requested`` is not one of the provider's runtimes or cannot boot on ``shape`` (the
                message names the right one), or ``shape`` has no runtime that runs tpuops' jobs.
        """
        ...

    def zones_offering(self, accelerator: str) -> list[str]:
        """The zones where the provider offers ``accelerator`` (empty for an unknown one); never raises."""
        ...

    def price_table(self) -> Mapping[str, Any]:
        """The provider's chip-hour prices, in the layout of ``tpuops.billing.pricing.Catalog.from_toml``:
        ``source``, ``retrieved``, ``currency``, ``base_region``, ``chip_hour`` by generation and ``regions``
        overrides. Read once per process."""
        ...

    def spot_priced(self) -> frozenset[str]:
        """The capacities (their ``Capacity`` values) billed at the spot price."""
        ...

    def preemption_is_free(self, capacity: str, created_s: float, preempted_s: float) -> bool:
        """Whether a node of ``capacity`` created at ``created_s`` and preempted at ``preempted_s`` (epoch seconds)
        costs nothing (Cloud TPU: a spot node preempted in its first minute)."""
        ...


def check_sizes(offers: Offers, sizes: list[str]) -> list[AcceleratorShape]:
    """The shapes of an elastic run's ``sizes`` (``accelerator: [v3-32, v3-8]``), checked: each offered, one
    generation (a checkpoint moves between sizes of one chip, not between chips), strictly largest first (the
    controller moves down the list on a stockout and back up when the larger returns).

    Raises:
        UsageError: one line naming the size that breaks a rule and what would be right.
    """
    shapes = [offers.shape(size) for size in sizes]
    for before, after in itertools.pairwise(shapes):
        if after.generation != before.generation:
            raise UsageError(f"accelerator sizes {before} and {after} are of different generations "
                             f"({before.generation}, {after.generation}); list sizes of one generation")
        if after.chips >= before.chips:
            raise UsageError(f"accelerator sizes must be listed largest first: {after} ({after.chips} chips) comes "
                             f"after {before} ({before.chips} chips)")
    return shapes


def hosts_of(offers: Offers, accelerator: str) -> int:
    """The hosts of a node of ``accelerator``, or 1 for a type the provider does not know (a node listed with
    one, an old ledger row): shown as one host, never an error."""
    try:
        return offers.shape(accelerator).hosts
    except UsageError:
        return 1
