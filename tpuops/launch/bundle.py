"""Content-addressed job bundles: the agent, the experiment code and the experiment spec.

The bundle is a gzip'd tar built byte-for-byte reproducibly (sorted names, fixed times,
owners and modes, no gzip timestamp), so the same code always has the same sha256 and is
uploaded once to ``bundles/<sha256>.tar.gz``. The run spec records the digest and the VM's
bootstrap (``templates/fetch_bundle.py``) refuses to run a bundle whose bytes do not hash to it.
The agent's sources come from the installed package (``tpuops.core.resources``), so a wheel ships
the same agent as a checkout.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tpuops.core import resources
from tpuops.runs.layout import spec_key, status_key
from tpuops.store.base import uri_under

_CODE_SUFFIXES = (".py", ".yaml", ".yml", ".json", ".txt", ".sh", ".toml", ".cfg")


@dataclass(frozen=True)
class Bundle:
    data: bytes
    sha256: str
    files: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"bundles/{self.sha256}.tar.gz"


def _members(experiments_dir: Path) -> Iterable[tuple[str, bytes]]:
    yield from resources.agent_sources()
    for path in sorted(experiments_dir.rglob("*")):
        relative = path.relative_to(experiments_dir)
        if path.is_file() and path.suffix in _CODE_SUFFIXES and "__pycache__" not in relative.parts:
            yield f"experiments/{relative.as_posix()}", path.read_bytes()


def build_bundle(experiments_dir: Path) -> Bundle:
    """Pack the agent and ``experiments_dir``; the same inputs always give the same bytes."""
    raw = io.BytesIO()
    names = []
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content in sorted(_members(experiments_dir)):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mode = 0o644
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(content))
            names.append(name)
    packed = io.BytesIO()
    with gzip.GzipFile(fileobj=packed, mode="wb", mtime=0, compresslevel=6) as gz:
        gz.write(raw.getvalue())
    data = packed.getvalue()
    return Bundle(data=data, sha256=hashlib.sha256(data).hexdigest(), files=tuple(names))


def bootstrap_source() -> str:
    """The Python (3.8, TF-only) program that fetches, checks and runs a bundle on the VM."""
    return resources.template_text("fetch_bundle.py")


def job_argv(store_uri: str, bundle_sha256: str, run_id: str, command: str) -> list[str]:
    """The startup script's job for run ``run_id``: ``python3 -c <bootstrap> BUNDLE SHA256 SPEC STATUS COMMAND``.

    What a run's node runs on worker 0: the bootstrap fetches, checks and starts the run's bundle. Its
    arguments are URIs under the store root (the bundle, the run spec, the agent's status) and the agent's
    command; it takes the store's URI, not the store, so that a sweep's frozen trial template renders it
    for each trial without opening anything.
    """
    return ["python3", "-c", bootstrap_source(), uri_under(store_uri, f"bundles/{bundle_sha256}.tar.gz"),
            bundle_sha256, uri_under(store_uri, spec_key(run_id)), uri_under(store_uri, status_key(run_id)), command]
