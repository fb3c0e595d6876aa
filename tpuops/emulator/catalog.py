"""The emulator's built-in catalogue: zones, accelerator types and runtime versions.

It is a small, fixed picture of what Cloud TPU offers (docs/cloud-tpu.md), enough for the
validation errors the real API gives: an accelerator type unknown to a zone is rejected the
way the real service rejects it, so tpuops's zone fallback can be exercised locally.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class AcceleratorSpec:
    """One accelerator type: ``v4-16`` has generation enum ``V4``, topology ``2x2x2`` and 2 hosts."""

    name: str
    config_type: str
    topology: str
    hosts: int

    @property
    def single_host(self) -> bool:
        return self.hosts == 1


def _multiply(topology: str) -> int:
    product = 1
    for part in topology.split("x"):
        product *= int(part)
    return product


# Per generation: name prefix, AcceleratorConfig.Type, whether the suffix counts TensorCores
# (2 per chip) or chips, the largest chip count on one host, and the topologies offered.
_GENERATIONS: tuple[tuple[str, str, bool, int, tuple[str, ...]], ...] = (
    ("v2", "V2", True, 4, ("2x2", "4x4", "8x8", "8x16", "16x16")),
    ("v3", "V3", True, 4, ("2x2", "4x4", "4x8", "8x8", "8x16", "16x16", "16x32", "32x32")),
    (
        "v4",
        "V4",
        True,
        4,
        ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16"),
    ),
    ("v5litepod", "V5LITE_POD", False, 8, ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")),
    ("v5p", "V5P", True, 4, ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8")),
    ("v6e", "V6E", False, 8, ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")),
)


def _build_accelerators() -> dict[str, AcceleratorSpec]:
    specs: dict[str, AcceleratorSpec] = {}
    for prefix, config_type, counts_cores, chips_per_host, topologies in _GENERATIONS:
        for topology in topologies:
            chips = _multiply(topology)
            size = chips * 2 if counts_cores else chips
            # Multi-host slices of every generation carry 4 chips per host.
            hosts = 1 if chips <= chips_per_host else chips // 4
            name = f"{prefix}-{size}"
            specs[name] = AcceleratorSpec(name, config_type, topology, hosts)
    return specs


ACCELERATORS: dict[str, AcceleratorSpec] = _build_accelerators()

ZONE_GENERATIONS: dict[str, tuple[str, ...]] = {
    "us-central1-a": ("v3", "v5litepod", "v5p"),
    "us-central1-b": ("v2", "v3", "v6e"),
    "us-central1-c": ("v2",),
    "us-central1-f": ("v2",),
    "us-central2-b": ("v4",),
    "europe-west4-a": ("v2", "v3", "v5litepod", "v6e"),
    "us-east1-d": ("v6e",),
    "us-east5-a": ("v5p", "v6e"),
}

RUNTIME_VERSIONS: tuple[str, ...] = (
    *(f"tpu-vm-tf-2.9.{patch}{suffix}" for patch in (1, 2, 3) for suffix in ("", "-pod", "-v4", "-pod-v4")),
    "tpu-vm-base",
    "tpu-vm-v4-base",
    "tpu-ubuntu2204-base",
    "v2-alpha-tpuv5-lite",
    "v2-alpha-tpuv5",
    "v2-alpha-tpuv6e",
)


def zone_known(zone: str) -> bool:
    return zone in ZONE_GENERATIONS


def accelerators_in_zone(zone: str) -> list[AcceleratorSpec]:
    """The accelerator types offered in ``zone`` (empty for an unknown zone)."""
    generations = ZONE_GENERATIONS.get(zone, ())
    return [spec for spec in ACCELERATORS.values() if spec.name.rsplit("-", 1)[0] in generations]


def accelerator_in_zone(name: str, zone: str) -> AcceleratorSpec | None:
    """The spec of ``name`` if ``zone`` offers it, else None."""
    spec = ACCELERATORS.get(name)
    if spec is None or spec.name.rsplit("-", 1)[0] not in ZONE_GENERATIONS.get(zone, ()):
        return None
    return spec


def accelerator_from_config(config_type: str, topology: str) -> AcceleratorSpec | None:
    """The accelerator type an ``acceleratorConfig`` {type, topology} names, if any."""
    for spec in ACCELERATORS.values():
        if spec.config_type == config_type and spec.topology == topology:
            return spec
    return None


def project_number(project: str) -> str:
    """A stable 12-digit project number for a project id, as the metadata server shows it."""
    digest = int(hashlib.sha256(project.encode()).hexdigest()[:12], 16)
    return str(100_000_000_000 + digest % 900_000_000_000)
