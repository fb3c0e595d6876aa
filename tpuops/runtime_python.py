"""Find the interpreter for the TF 2.9 data plane: Python 3.8 (the TPU VM image's), else 3.9 or 3.10.

TF 2.9 has no wheels for Python >= 3.11, so the control plane's own interpreter cannot run
the agent. Looked for on PATH, then under pyenv, then through uv; ``python -m
tpuops.runtime_python 3.8 3.9 3.10`` prints the first that works or one line saying what
to install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from tpuops.errors import UsageError

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
    raise UsageError(f"no Python {wanted} found on PATH, under pyenv or through uv: TF 2.9 needs one of them "
                     "(e.g. 'pyenv install 3.8' or 'uv python install 3.8')")


def main(argv: Sequence[str]) -> int:
    try:
        print(find_python(argv or DEFAULT_VERSIONS))
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
