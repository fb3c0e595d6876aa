"""Build the local TF 2.9 runtime: a venv made from the packaged pin file (``tpuops runtime install``).

Invariants: the pins are the package's own ``requirements-tf29.txt`` (the file the startup
script installs on a TPU VM), so the emulator runs what a VM runs. The stamp is written last,
after ``import tensorflow`` reported a 2.9 version; until then the venv is not a runtime (see
``tpuops.tfenv.locate``), and a failed build removes what it made. A directory that is not a
venv is never deleted: installing there is refused instead.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tpuops.core.errors import TpuopsError, UsageError
from tpuops.core.resources import PIN_FILE, TF_VERSION_PREFIX, pin_file_text
from tpuops.tfenv.locate import STAMP, read_stamp, venv_python
from tpuops.tfenv.pythons import DEFAULT_VERSIONS, find_python

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Built:
    venv: Path
    python: Path
    stamp: dict[str, object]
    reused: bool
    """True when a complete venv of the same pins was there already and nothing was built."""


def pins_sha256() -> str:
    return hashlib.sha256(pin_file_text().encode()).hexdigest()


def install(venv: Path, *, force: bool = False, base_python: str | None = None,
            versions: Sequence[str] = DEFAULT_VERSIONS, progress: Progress = lambda _text: None) -> Built:
    """Make ``venv`` a TF 2.9 runtime; reuse it when it is one of the same pins (unless ``force``).

    Raises:
        UsageError: no Python 3.8-3.10 to build with, or ``venv`` is a directory that is not a venv.
        TpuopsError: pip failed, or TensorFlow did not import as 2.9 (the half-built venv is removed).
    """
    venv = venv.expanduser().absolute()
    stamp = read_stamp(venv)
    if stamp is not None and stamp.get("pins_sha256") == pins_sha256() and not force:
        return Built(venv, venv_python(venv), stamp, reused=True)
    _refuse_foreign(venv)
    python = base_python or find_python(versions)
    progress(f"creating a venv in {venv} with {python}")
    shutil.rmtree(venv, ignore_errors=True)
    try:
        _run([python, "-m", "venv", str(venv)], "python -m venv")
        stamp = _fill(venv, progress)
    except BaseException:
        shutil.rmtree(venv, ignore_errors=True)
        raise
    return Built(venv, venv_python(venv), stamp, reused=False)


def _refuse_foreign(venv: Path) -> None:
    if venv.exists() and not (venv / "pyvenv.cfg").is_file() and (not venv.is_dir() or any(venv.iterdir())):
        raise UsageError(f"{venv} exists and is not a Python venv: remove it or install elsewhere (--path)")


def _fill(venv: Path, progress: Progress) -> dict[str, object]:
    python = str(venv_python(venv))
    pins = venv / PIN_FILE
    pins.write_text(pin_file_text())
    progress("installing the TF 2.9 pins (several hundred MB unless pip has them cached)")
    # Byte-compiled at install (~15 s of CPU once): every node boot imports TensorFlow, which from source costs
    # ~5 s of CPU more each time wherever the bytecode cannot be written later (PYTHONDONTWRITEBYTECODE, a
    # read-only venv).
    _pip(python, ["install", "--progress-bar", "off", "-r", str(pins)], progress)
    progress("checking that TensorFlow imports")
    tf_version = _run([python, "-c", "import tensorflow as tf; print(tf.__version__)"], "import tensorflow")
    tf_version = tf_version.strip().splitlines()[-1] if tf_version.strip() else ""
    if not tf_version.startswith(TF_VERSION_PREFIX + "."):
        raise TpuopsError(f"the runtime imports TensorFlow {tf_version or '?'}, not {TF_VERSION_PREFIX}: "
                          f"check the pins in {pins}")
    version = _run([python, "-c", "import platform; print(platform.python_version())"], "python").strip()
    stamp: dict[str, object] = {
        "pins_sha256": pins_sha256(),
        "python": version,
        "tensorflow": tf_version,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "built_by": f"tpuops on Python {platform.python_version()} ({sys.executable})",
    }
    tmp = venv / (STAMP + ".tmp")
    tmp.write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
    tmp.replace(venv / STAMP)
    return stamp


def _pip(python: str, args: list[str], progress: Progress) -> None:
    """Run pip, reporting each package it collects; on failure, its last error line."""
    proc = subprocess.Popen([python, "-m", "pip", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1)
    assert proc.stdout is not None
    tail: list[str] = []
    collected = 0
    for raw in proc.stdout:
        line = raw.rstrip()
        tail = [*tail[-19:], line]
        if line.startswith("Collecting "):
            collected += 1
            progress(f"pip: {line} ({collected} packages so far)")
        elif line.startswith("Installing collected packages: "):
            progress(f"pip: unpacking {len(line.split(','))} packages")
    if proc.wait() != 0:
        errors = [text for text in tail if text.startswith("ERROR")] or tail or ["no output"]
        raise TpuopsError(f"pip could not install the TF 2.9 pins: {errors[-1].strip()}")


def _run(argv: list[str], what: str) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=1800)
    except OSError as err:
        raise TpuopsError(f"{what}: cannot run {argv[0]}: {err.strerror}") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise TpuopsError(f"{what} failed with exit code {out.returncode}: {last}")
    return out.stdout
