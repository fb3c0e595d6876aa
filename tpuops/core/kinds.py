"""Small enums shared by the CLI and the library, kept free of heavy imports so that
``tpuops --help`` does not pay for pydantic or the Google clients."""

from __future__ import annotations

from enum import Enum

from tpuops.agent.exits import ValueEnum

__all__ = ["Capacity", "Provider", "ValueEnum"]


class Provider(str, Enum):
    LOCAL = "local"
    GCP = "gcp"


class Capacity(str, Enum):
    SPOT = "spot"
    PREEMPTIBLE = "preemptible"
    ON_DEMAND = "on-demand"
