"""Where the local TF 2.9 runtime is: the search order of ``tpuops.tfenv``, and what a runtime holds.

Pure lookups: nothing here builds, installs or deletes. ``find`` walks the documented order;
``require`` turns "none found" into the one line that says how to get one.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuops.config import Settings
from tpuops.core.errors import UsageError

STAMP = "tpuops-runtime.json"
"""Written last by ``tpuops runtime install``: the venv is complete (TensorFlow imported)."""

CHECKOUT = Path(__file__).resolve().parents[2]
"""The repository when tpuops runs from a checkout (an editable install); site-packages otherwise."""


@dataclass(frozen=True)
class Candidate:
    """One place of the search order and what is there."""

    source: str
    """``tf_python``, ``home`` or ``checkout``."""
    python: Path
    found: bool


def home_runtime(settings: Settings) -> Path:
    """The venv ``tpuops runtime install`` builds: ``$TPUOPS_HOME/runtime/tf29``."""
    return settings.home / "runtime" / "tf29"


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def read_stamp(venv: Path) -> dict[str, Any] | None:
    """The stamp of a completely built venv, or ``None`` (missing, or not ours)."""
    try:
        return json.loads((venv / STAMP).read_text())
    except (OSError, ValueError):
        return None


def candidates(settings: Settings) -> list[Candidate]:
    """The search order, each place marked found or not; an explicit ``tf_python`` is the only place.

    The checkout's ``.venv-tf29`` is a place only when tpuops runs from a checkout.
    """
    if settings.tf_python:
        python = Path(settings.tf_python).expanduser()
        return [Candidate("tf_python", python, python.is_file())]
    home = home_runtime(settings)
    found = [Candidate("home", venv_python(home), read_stamp(home) is not None and venv_python(home).exists())]
    if (CHECKOUT / "pyproject.toml").is_file():
        checkout = venv_python(CHECKOUT / ".venv-tf29")
        found.append(Candidate("checkout", checkout, checkout.exists()))
    return found


def find(settings: Settings) -> Candidate | None:
    """The first runtime of the search order that exists, or ``None``."""
    return next((c for c in candidates(settings) if c.found), None)


def require(settings: Settings) -> Path:
    """The runtime's interpreter; ``UsageError`` (one line, how to get one) when there is none."""
    found = find(settings)
    if found is None:
        raise UsageError(missing_message(settings))
    return found.python


def missing_message(settings: Settings) -> str:
    """What to do when the search order finds no runtime (one line)."""
    if settings.tf_python:
        return (f"tf_python = {settings.tf_python!r}: no such interpreter (expected the python of a "
                "TF 2.9 venv, or unset it to use the one 'tpuops runtime install' builds)")
    return (f"provider 'local' needs a TF 2.9 runtime and there is none: run 'tpuops runtime install' "
            f"(builds it in {home_runtime(settings)}) or set tf_python")


@dataclass(frozen=True)
class RuntimeReport:
    """``tpuops runtime status``: the search order, the runtime used, and what it holds."""

    candidates: list[Candidate]
    chosen: Candidate | None
    tensorflow: str | None = None
    stamp: dict[str, Any] | None = None
    missing: str | None = None
    """With no runtime: the one line that says how to get one (``require``'s message)."""

    def to_json(self) -> dict[str, Any]:
        rows = [{"source": c.source, "python": str(c.python), "found": c.found, "used": c == self.chosen}
                for c in self.candidates]
        out: dict[str, Any] = {"runtime": str(self.chosen.python) if self.chosen else None, "candidates": rows}
        if self.chosen is not None:
            out["tensorflow"] = self.tensorflow
            out["stamp"] = self.stamp
        return out


def report(settings: Settings) -> RuntimeReport:
    """Walk the search order once and describe what it finds (TensorFlow's version read without importing it)."""
    chosen = find(settings)
    if chosen is None:
        return RuntimeReport(candidates(settings), None, missing=missing_message(settings))
    return RuntimeReport(candidates(settings), chosen, tensorflow_version(chosen.python),
                         read_stamp(chosen.python.parent.parent))


def tensorflow_version(python: Path) -> str | None:
    """The installed TensorFlow's version from package metadata (fast: TF is not imported)."""
    probe = ("import importlib.metadata as m\n"
             "for name in ('tensorflow-cpu', 'tensorflow'):\n"
             "    try:\n        print(m.version(name)); break\n"
             "    except m.PackageNotFoundError:\n        pass\n")
    try:
        out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    except OSError:
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    return out.stdout.strip()
