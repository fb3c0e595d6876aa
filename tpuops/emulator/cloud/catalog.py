"""The emulator's view of the shared Cloud TPU catalog (``tpuops.providers.cloud_tpu.catalog``), with the API's errors.

What the emulator serves and refuses comes from the package's one catalog file; this module
turns a lookup that fails into the error the real service answers with: an unknown zone,
an accelerator type the zone does not offer, a runtime version that does not exist. It also
derives the stable project number the metadata server and default service account show.
"""

from __future__ import annotations

import hashlib
import random

from tpuops.emulator.apierror import ApiError, invalid
from tpuops.providers.cloud_tpu.catalog import AcceleratorType, load

__all__ = ["AcceleratorType", "accelerator_for", "check_runtime_version", "check_zone", "project_number",
           "stockout_error"]


def _eid() -> str:
    return f"[EID: 0x{random.getrandbits(64):016x}]"


def check_zone(zone: str, *, allow_all: bool = False) -> None:
    """Raise INVALID_ARGUMENT unless ``zone`` is a Cloud TPU zone (or ``-`` where all zones are meant)."""
    if allow_all and zone == "-":
        return
    if not load().zone_known(zone):
        raise invalid(f'Invalid location "{zone}": Cloud TPU is not offered in this location. {_eid()}')


def accelerator_for(name: str, zone: str, *, preemptible: bool, reserved: bool) -> AcceleratorType:
    """The accelerator type ``name`` if ``zone`` offers it, else the API's INVALID_ARGUMENT."""
    catalog = load()
    if not catalog.offers(zone, name):
        raise invalid(
            f"Accelerator type {name} as preemptible ({str(preemptible).lower()}) and reserved "
            f"({str(reserved).lower()}) is not available in zone {zone}. {_eid()}"
        )
    return catalog.accelerators[name]


def accelerator_from_config(config_type: str, topology: str) -> AcceleratorType | None:
    return load().from_config(config_type, topology)


def check_runtime_version(version: str, zone: str) -> None:
    if version not in load().runtime_versions:
        raise invalid(
            f"Cloud TPU received a bad request. Runtime version {version!r} is not available in zone {zone}; "
            f"list the versions with ListRuntimeVersions. {_eid()}"
        )


def stockout_error(zone: str) -> ApiError:
    """The error a create operation ends with when the zone has no capacity, worded as on GCP."""
    return ApiError("RESOURCE_EXHAUSTED", f'There is no more capacity in the zone "{zone}"; you can try in another '
                    "zone where Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions) " + _eid())


def project_number(project: str) -> str:
    """A stable 12-digit project number for a project id, as the metadata server shows it."""
    digest = int(hashlib.sha256(project.encode()).hexdigest()[:12], 16)
    return str(100_000_000_000 + digest % 900_000_000_000)
