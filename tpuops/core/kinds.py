"""Small enums shared by the CLI and the library, kept free of heavy imports so that
``tpuops --help`` does not pay for pydantic or the Google clients."""

from __future__ import annotations

from enum import Enum


class ValueEnum(str, Enum):
    """A str enum whose members print as their JSON value, in f-strings too (Python 3.11 changed that)."""

    def __str__(self) -> str:
        return str(self.value)


class Provider(str, Enum):
    LOCAL = "local"
    GCP = "gcp"


class Capacity(str, Enum):
    SPOT = "spot"
    PREEMPTIBLE = "preemptible"
    ON_DEMAND = "on-demand"
