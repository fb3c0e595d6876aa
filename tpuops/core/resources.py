"""Package data: every file tpuops reads at run time from its own installation.

Invariant: data files are read through ``importlib.resources`` from the installed package,
never through a path relative to a checkout, so a wheel installed anywhere (pip, pipx, uv)
behaves like the editable development install. The files:

- ``tpuops/templates/``: the repository's top-level ``templates/`` folder, linked into the
  package (a symlink in the checkout, real files in a wheel): the startup script template
  ``startup.sh.j2``, the VM bootstrap ``fetch_bundle.py``, the slice workers' log shipper ``ship_log.py``
  and the one TF 2.9 pin file ``requirements-tf29.txt`` (startup script, ``tpuops runtime install`` and ``make setup``);
  its last section, after the line starting with ``AGENT_PINS_MARKER``, pins the agent's own
  packages (``agent_pins``).
- ``tpuops/agent/**.py`` and ``tpuops/contract/**.py``: the data plane's sources and the contract it shares
  with the control plane, shipped to the VM inside each job bundle.
- ``tpuops/providers/cloud_tpu/catalog.json`` and ``prices.toml``: what Cloud TPU offers and what it costs
  (read by ``tpuops.providers.cloud_tpu``, which hands them on as its ``Offers``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.abc import Traversable

PACKAGE = "tpuops"
TF_VERSION = "2.9.3"
"""The TensorFlow release tpuops runs (the pin file's); every runtime name and the pin check derive from it."""

TF_VERSION_PREFIX = ".".join(TF_VERSION.split(".")[:2])
"""``"2.9"``: what ``tensorflow.__version__`` must start with on the VM."""

PIN_FILE = "requirements-tf29.txt"
AGENT_PINS_MARKER = "# The agent's own packages"
AGENT_WINGS = ("agent", "contract")
"""The packages a job bundle ships: the agent and the contract it shares with the control plane."""


def _package() -> Traversable:
    return resources.files(PACKAGE)


@functools.cache
def template_text(name: str) -> str:
    """The text of ``tpuops/templates/<name>``, read once per process (package data does not change under it; a
    sweep renders every trial's startup script from it)."""
    return (_package() / "templates" / name).read_text(encoding="utf-8")


def pin_file_text() -> str:
    """The TF 2.9 pin file, byte for byte."""
    return template_text(PIN_FILE)


def agent_pins(pin_file: str) -> list[str]:
    """The ``name==version`` pins after the pin file's ``AGENT_PINS_MARKER`` line: what the agent imports
    beyond TF 2.9 (for ``infer`` only), which a VM image with TF 2.9 does not have."""
    lines = pin_file.splitlines()
    start = next((n for n, line in enumerate(lines) if line.startswith(AGENT_PINS_MARKER)), len(lines))
    pins = [line.strip() for line in lines[start + 1:] if line.strip() and not line.startswith("#")]
    for pin in pins:
        name, _, version = pin.partition("==")
        if not name or not version or "=" in version or any(char in pin for char in " <>!~;[,"):
            raise ValueError(f"agent pin {pin!r}: expected name==version")
    return pins


def agent_sources() -> Iterator[tuple[str, bytes]]:
    """``(name, bytes)`` of ``tpuops/__init__.py`` and every ``.py`` under ``tpuops/agent`` and ``tpuops/contract``
    (what the agent imports: ``tpuops.contract``'s docstring), names posix and in order."""
    package = _package()
    yield f"{PACKAGE}/__init__.py", (package / "__init__.py").read_bytes()
    for wing in AGENT_WINGS:
        yield from _python_files(package / wing, f"{PACKAGE}/{wing}")


def _python_files(folder: Traversable, prefix: str) -> Iterator[tuple[str, bytes]]:
    for entry in sorted(folder.iterdir(), key=lambda item: item.name):
        if entry.is_dir():
            if entry.name != "__pycache__":
                yield from _python_files(entry, f"{prefix}/{entry.name}")
        elif entry.name.endswith(".py"):
            yield f"{prefix}/{entry.name}", entry.read_bytes()
