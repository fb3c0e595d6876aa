"""Job bundles: reproducible bytes, the installed package's agent plus the experiment code, nothing else."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest
from helpers import REPO

import tpuops
from tpuops.core.resources import agent_sources
from tpuops.launch.bundle import bootstrap_source, build_bundle

pytestmark = pytest.mark.unit

PACKAGE = Path(tpuops.__file__).resolve().parent


@pytest.fixture
def experiments(tmp_path: Path) -> Path:
    folder = tmp_path / "experiments"
    (folder / "nested" / "__pycache__").mkdir(parents=True)
    (folder / "models.py").write_text("def build(hparams):\n    return None\n")
    (folder / "spec.yaml").write_text("name: x\n")
    (folder / "nested" / "layers.py").write_text("X = 1\n")
    (folder / "nested" / "__pycache__" / "layers.cpython-38.pyc").write_bytes(b"\0compiled")
    (folder / "weights.npz").write_bytes(b"not code")
    return folder


def _members(data: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return tar.getmembers()


def test_the_bundle_holds_the_agent_and_the_experiment_code_only(experiments: Path) -> None:
    bundle = build_bundle(experiments)
    agent = {f"tpuops/{p.relative_to(PACKAGE).as_posix()}"
             for wing in ("agent", "contract") for p in (PACKAGE / wing).rglob("*.py") if "__pycache__" not in p.parts}
    assert set(bundle.files) == {"tpuops/__init__.py", *agent, "experiments/models.py", "experiments/spec.yaml",
                                 "experiments/nested/layers.py"}
    assert [m.name for m in _members(bundle.data)] == sorted(bundle.files) == list(bundle.files)
    assert bundle.key == f"bundles/{bundle.sha256}.tar.gz" and bundle.sha256 == hashlib.sha256(bundle.data).hexdigest()


def test_the_agent_comes_from_the_installed_package_byte_for_byte() -> None:
    shipped = dict(agent_sources())
    assert shipped["tpuops/agent/train.py"] == (PACKAGE / "agent" / "train.py").read_bytes()
    assert shipped["tpuops/contract/status.py"] == (PACKAGE / "contract" / "status.py").read_bytes()
    assert shipped["tpuops/__init__.py"] == (PACKAGE / "__init__.py").read_bytes()


def test_the_same_code_gives_the_same_bytes_and_a_change_another_digest(experiments: Path, tmp_path: Path) -> None:
    first = build_bundle(experiments)
    (experiments / "weights.npz").write_bytes(b"other data, not code")  # not in the bundle
    assert build_bundle(experiments).data == first.data
    (experiments / "models.py").write_text("def build(hparams):\n    return 1\n")
    assert build_bundle(experiments).sha256 != first.sha256


def test_members_carry_no_time_owner_or_mode_of_this_machine(experiments: Path) -> None:
    bundle = build_bundle(experiments)
    for member in _members(bundle.data):
        assert (member.mode, member.mtime, member.uid, member.gid, member.uname, member.gname) == (
            0o644, 0, 0, 0, "", "")
    assert bundle.data[:2] == b"\x1f\x8b" and bundle.data[4:8] == b"\0\0\0\0"  # gzip header: MTIME 0


def test_the_bootstrap_is_the_packaged_template_and_compiles() -> None:
    source = bootstrap_source()
    assert source == (REPO / "templates" / "fetch_bundle.py").read_text()
    compile(source, "fetch_bundle.py", "exec")
