"""Small enums shared by the CLI and the library, kept free of heavy imports so that
``tpuops --help`` does not pay for pydantic or the Google clients."""

from __future__ import annotations

from enum import Enum

from tpuops.agent.exits import ValueEnum

__all__ = ["Capacity", "Cloud", "ValueEnum"]


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
