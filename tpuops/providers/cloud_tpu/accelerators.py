"""Cloud TPU accelerator types and the TF 2.9 runtime versions that fit them: the one place for these rules.

An accelerator type is ``<family>-<N>``. For v2, v3, v4 and v5p, N counts TensorCores (two per
chip) and every host carries 4 chips: v3-8 is 4 chips on one host, v3-32 is 16 chips on 4 hosts.
For v5e (``v5litepod-N``) and v6e, N counts chips: up to 8 chips sit on one host; a larger slice
spans hosts of 4 chips each (v5litepod-16 is 4 hosts). The types, their sizes and the zones that
offer them come from the shared Cloud TPU catalog (``catalog``), the one the emulator serves:
refusing an unknown size here is cheaper than a 400 from the API.

TensorFlow 2.9 runtime images exist for v2, v3 and v4 only (docs/cloud-tpu.md): ``tpu-vm-tf-2.9.x`` on a
single host, ``-pod`` on a multi-host slice, and v4 adds ``-v4`` (``tpu-vm-tf-2.9.3-pod-v4``).
v5e, v5p and v6e need TF >= 2.15 with PJRT, so asking for a TF 2.9 runtime there is a usage error.
"""

from __future__ import annotations

import functools
import re

from tpuops.core.errors import UsageError
from tpuops.core.naming import check_zone_name
from tpuops.core.resources import TF_VERSION, TF_VERSION_PREFIX
from tpuops.providers.cloud_tpu import catalog as tpu_catalog
from tpuops.providers.offers import AcceleratorShape

_TF29_RUNTIME = re.compile(
    r"tpu-vm-tf-(?P<version>" + re.escape(TF_VERSION_PREFIX) + r"\.\d+)(?P<pod>-pod)?(?P<v4>-v4)?"
)
_ACCELERATOR = re.compile(r"(?P<family>[a-z0-9]+)-(?P<size>[1-9][0-9]*)")
_EXAMPLES = "expected e.g. v2-8, v3-8, v3-32, v4-8"
_TF29_GENERATIONS = ("v2", "v3", "v4")


def _replicas(generation: str, size: int, chips: int) -> int:
    """TensorCores, the replicas of TPUStrategy: two per chip on v2-v4 and v5p (the N of the type), one on v5e
    and v6e."""
    return size if generation in ("v2", "v3", "v4", "v5p") else chips


@functools.lru_cache(maxsize=256)
def parse_accelerator(text: str) -> AcceleratorShape:
    """Parse and validate an accelerator type string against the Cloud TPU catalog.

    Cached (the packaged catalog is read once and never changes; an ``Accelerator`` is frozen): pricing a
    ledger's nodes parses one type per node, a sweep pass tens of thousands in a simulation.

    Raises:
        UsageError: not a Cloud TPU type, or a size the family does not come in.
    """
    catalog = tpu_catalog.load()
    match = _ACCELERATOR.fullmatch(text)
    sizes = catalog.family_sizes(match["family"]) if match else []
    if match is None or not sizes:
        raise UsageError(f"accelerator {text!r} is not a Cloud TPU type ({_EXAMPLES})")
    spec = catalog.accelerators.get(text)
    if spec is None:
        unit = "TensorCores" if catalog.accelerators[f"{match['family']}-{sizes[0]}"].counts_cores else "chips"
        raise UsageError(
            f"accelerator {text!r} is not a Cloud TPU type: {match['family']} comes in sizes ({unit}) "
            f"{', '.join(map(str, sizes))}"
        )
    return AcceleratorShape(type=text, generation=spec.generation, chips=spec.chips, hosts=spec.hosts,
                            replicas=_replicas(spec.generation, spec.size, spec.chips))


def check_zone(zone: str) -> str:
    """``zone`` if it is a Cloud TPU zone of the catalog; else one ``UsageError`` line with the closest one."""
    import difflib

    known = sorted(tpu_catalog.load().zones)
    if check_zone_name(zone) not in known:
        close = difflib.get_close_matches(zone, known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"Cloud TPU zones: {', '.join(known)}"
        raise UsageError(f"zone {zone!r} offers no Cloud TPUs ({hint})")
    return zone


def zones_offering(acc: AcceleratorShape | str) -> list[str]:
    """The Cloud TPU zones that offer ``acc``, from the catalog."""
    return tpu_catalog.load().zones_offering(_as_accelerator(acc).type)


def offered_zones(acc: AcceleratorShape | str, zones: list[str]) -> list[str]:
    """The zones of ``zones`` (in their order) that offer the slice ``acc``: its creates and recreates go only there.

    A single host is left to the API's answer (``zones`` unchanged), as it always was: few zones lack one.

    Raises:
        UsageError: none of them offers it (one line naming the zones that do).
    """
    acc = _as_accelerator(acc)
    if not acc.multi_host:
        return zones
    offered = tpu_catalog.load().zones_offering(acc.type)
    usable = [zone for zone in zones if zone in offered]
    if not usable:
        where = f"{', '.join(offered)} offer{'s' if len(offered) == 1 else ''} it" if offered else "no zone offers it"
        raise UsageError(f"slice {acc.type!r} is not offered in {', '.join(zones)}: {where} "
                         "(set zones in tpuops.toml, or --zone)")
    return usable


def _as_accelerator(acc: AcceleratorShape | str) -> AcceleratorShape:
    return acc if isinstance(acc, AcceleratorShape) else parse_accelerator(acc)


def _runtime_name(tf_version: str, acc: AcceleratorShape) -> str:
    pod = "-pod" if acc.multi_host else ""
    v4 = "-v4" if acc.generation == "v4" else ""
    return f"tpu-vm-tf-{tf_version}{pod}{v4}"


def _require_tf29_generation(acc: AcceleratorShape) -> None:
    if acc.generation not in _TF29_GENERATIONS:
        raise UsageError(
            f"accelerator {acc.type!r} ({acc.generation}) has no TensorFlow {TF_VERSION_PREFIX} runtime: "
            f"TF {TF_VERSION_PREFIX} images exist for v2, v3 and v4 only; {acc.generation} needs "
            "TF >= 2.15 with PJRT"
        )


def default_runtime_version(acc: AcceleratorShape | str) -> str:
    """The TF 2.9 runtime image for ``acc``, e.g. ``tpu-vm-tf-2.9.3-pod-v4`` for v4-16.

    Raises:
        UsageError: ``acc`` is not a valid type, or its generation has no TF 2.9 image.
    """
    acc = _as_accelerator(acc)
    _require_tf29_generation(acc)
    return _runtime_name(TF_VERSION, acc)


def check_runtime_version(acc: AcceleratorShape | str, runtime: str) -> str:
    """Reject a TF 2.9 runtime that cannot boot on ``acc``; return ``runtime`` unchanged otherwise.

    Runtimes of the catalog that are not TF 2.9 images pass through: a user who names another
    image knows what they want (the job itself then checks the VM's TensorFlow version).

    Raises:
        UsageError: ``runtime`` is not a Cloud TPU runtime version at all, the TF 2.9 runtime is
            wrong for ``acc`` (the message names the right one), or ``acc`` has no TF 2.9 image.
    """
    acc = _as_accelerator(acc)
    if runtime not in tpu_catalog.load().runtime_versions:
        raise UsageError(
            f"runtime version {runtime!r} is not a Cloud TPU runtime version "
            f"(e.g. {default_runtime_version(acc) if acc.generation in _TF29_GENERATIONS else 'tpu-ubuntu2204-base'})"
        )
    match = _TF29_RUNTIME.fullmatch(runtime)
    if match is None:
        return runtime
    _require_tf29_generation(acc)
    expected = _runtime_name(match["version"], acc)
    if runtime != expected:
        shape = "a multi-host slice" if acc.multi_host else "a single host"
        raise UsageError(
            f"runtime version {runtime!r} does not fit accelerator {acc.type!r} ({acc.generation}, {shape}): "
            f"use {expected!r}"
        )
    return runtime


def resolve_runtime_version(acc: AcceleratorShape | str, requested: str | None = None) -> str:
    """The runtime to create ``acc`` with: ``requested`` after checking it, else the default."""
    if requested:
        return check_runtime_version(acc, requested)
    return default_runtime_version(acc)
