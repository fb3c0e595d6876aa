"""Small enums shared by the CLI and the library, kept free of heavy imports so that
``tpuops --help`` does not pay for pydantic or the Google clients, and the capacity ``Choice`` built on them.

``Choice`` lives here, not with the deadline policy that makes it (``tpuops.billing.deadline``), because a run's
memory records it (``tpuops.runs.memory.Memory.switch``) and runs and billing stand side by side: neither
imports the other."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from tpuops.contract.exits import ValueEnum

__all__ = ["Capacity", "Choice", "Cloud", "ValueEnum"]


class Cloud(str, Enum):
    """Where the node provider's cloud is, as ``tpu_endpoint`` names it (``tpuops init --provider``).

    ``local``: this machine (the Cloud TPU emulator, started on demand, which also serves a ``gs://`` store and runs
    the nodes on this CPU; or a provider's own in-process world); ``gcp``: Google's endpoints."""

    LOCAL = "local"
    GCP = "gcp"


class Capacity(str, Enum):
    SPOT = "spot"
    PREEMPTIBLE = "preemptible"
    ON_DEMAND = "on-demand"


@dataclass(frozen=True)
class Choice:
    """The capacity a run should be on, and why (the text of its event)."""

    capacity: Capacity
    reason: str

    @property
    def on_demand(self) -> bool:
        return self.capacity is Capacity.ON_DEMAND
