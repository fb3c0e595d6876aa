"""Find an interpreter to build the TF 2.9 runtime with: Python 3.8 (the TPU VM image's), else 3.9 or 3.10.

TF 2.9 has no wheels for Python >= 3.11, so the control plane's own interpreter cannot run
the agent. Each version is looked for on PATH (``python3.8``), then under pyenv
(``$PYENV_ROOT/versions/3.8.*``, newest first), then through uv (``uv python find``); a
candidate counts only if it runs and reports that version. None found is one ``UsageError``
line saying what to install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

from tpuops.core.errors import UsageError

DEFAULT_VERSIONS = ("3.8", "3.9", "3.10")


def _reports_version(exe: str, version: str) -> bool:
    try:
        out = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30, check=False)
    except OSError:
        return False
    return out.returncode == 0 and out.stdout.strip() == version


def _candidates(version: str) -> Iterator[str]:
    on_path = shutil.which(f"python{version}")
    if on_path:
        yield on_path
    pyenv_root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    for folder in sorted((pyenv_root / "versions").glob(f"{version}.*"), reverse=True):
        yield str(folder / "bin" / "python")
    uv = shutil.which("uv")
    if uv:
        found = subprocess.run([uv, "python", "find", version], capture_output=True, text=True, check=False)
        if found.returncode == 0 and found.stdout.strip():
            yield found.stdout.strip()


def find_python(versions: Sequence[str] = DEFAULT_VERSIONS) -> str:
    """Return the path of the first interpreter of ``versions`` that runs."""
    for version in versions:
        for exe in _candidates(version):
            if _reports_version(exe, version):
                return exe
    wanted = ", ".join(versions)
    first = versions[0]
    raise UsageError(f"no Python {wanted} found on PATH, under pyenv or through uv: install one "
                     f"(e.g. 'pyenv install {first}', 'uv python install {first}' or your OS's python{first})")

