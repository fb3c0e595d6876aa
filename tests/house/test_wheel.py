"""tpuops as a user gets it: a wheel installed into a fresh venv outside the checkout, run from elsewhere.

The wheel is built from a copy of the sources (so it cannot lean on the checkout) and installed
on the oldest and the newest supported Python. Both answer ``--help``, ``up --dry-run`` and
``train --dry-run``; on 3.13 a missing TF runtime is one line, and the emulator runs with an
explicit ``tf_python``; on 3.10 ``tpuops runtime install`` builds the TF 2.9 runtime under
``$TPUOPS_HOME`` from the packaged pins and the README's digits flow runs on it. A missing
interpreter skips its test with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import REPO, TF_PYTHON

from tpuops.core.errors import UsageError
from tpuops.launch.bundle import build_bundle
from tpuops.tfenv.pythons import find_python

SOURCES = ("pyproject.toml", "README.md", "tpuops", "templates")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, src / name)
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)],
                   check=True, capture_output=True, text=True, timeout=600)
    (built,) = dist.glob("tpuops-*.whl")
    return built


@dataclass
class Installed:
    """A fresh venv with the wheel in it, a working directory and a TPUOPS_HOME, all outside the checkout."""

    venv: Path
    work: Path
    env: dict[str, str]

    def __call__(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.venv / "bin" / "tpuops"), *args], cwd=self.work, env=self.env,
                              capture_output=True, text=True, timeout=timeout, check=False)

    def ok(self, *args: str, timeout: float = 300) -> str:
        done = self(*args, timeout=timeout)
        assert done.returncode == 0, f"tpuops {' '.join(args)}: {done.stderr}"
        assert "Traceback" not in done.stderr
        return done.stdout


def install(wheel: Path, version: str, root: Path, extras: str = "") -> Installed:
    try:
        python = find_python([version])
    except UsageError as err:
        pytest.skip(f"the control plane on Python {version} is not tested here: {err}")
    venv, work, home = root / "venv", root / "work", root / "home"
    work.mkdir()
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-compile", f"{wheel}{extras}"], check=True,
                   capture_output=True, text=True, timeout=900)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TPUOPS_", "VIRTUAL_ENV", "PYTHON", "GOOGLE_"))}
    env["TPUOPS_HOME"] = str(home)
    return Installed(venv, work, env)


def front_door(tpuops: Installed) -> None:
    """``--help``, ``init``, ``up --dry-run`` and ``train --dry-run`` work from anywhere and call nothing."""
    where = subprocess.run([str(tpuops.venv / "bin" / "python"), "-c", "import tpuops; print(tpuops.__file__)"],
                           cwd=tpuops.work, env=tpuops.env, capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(tpuops.venv)
    assert "runtime" in tpuops.ok("--help")
    tpuops.ok("init")
    up = json.loads(tpuops.ok("up", "node-1", "--dry-run", "--json"))
    assert up["body"]["runtimeVersion"] == "tpu-vm-tf-2.9.3"
    assert "tensorflow-cpu==2.9.3" in up["body"]["metadata"]["startup-script"]  # the packaged pin file
    shutil.copytree(REPO / "experiments", tpuops.work / "experiments", ignore=shutil.ignore_patterns("__pycache__"))
    from tpuops.data.samples import digits

    digits(tpuops.work / "data" / "digits")
    plan = json.loads(tpuops.ok("train", "experiments/digits_cnn.yaml", "--dry-run"))
    assert "tpuops/agent/train.py" in plan["bundle"]["files"]
    assert plan["bundle"]["sha256"] == build_bundle(tpuops.work / "experiments").sha256  # the checkout's agent
    assert not (Path(tpuops.env["TPUOPS_HOME"]) / "emulator").exists()


@pytest.mark.emulator  # the wheel tests' lane (make test): it builds the wheel, as they do
@pytest.mark.slow
def test_the_wheel_carries_each_providers_data_beside_its_code(wheel: Path) -> None:
    """Cloud TPU's catalog and prices are package data of ``tpuops/providers/cloud_tpu/``, read from there."""
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    for data in ("catalog.json", "prices.toml", "offers.py", "adapter.py"):
        assert f"tpuops/providers/cloud_tpu/{data}" in names


@pytest.fixture
def stop_emulator() -> Iterator[list[Installed]]:
    started: list[Installed] = []
    yield started
    for tpuops in started:
        tpuops("emulator", "stop")


@pytest.mark.emulator
@pytest.mark.slow
def test_the_wheel_ships_every_emulator_wing_and_what_a_worker_reads_by_path(wheel: Path) -> None:
    """A ``-pod`` slice's workers run ``tpu_runtime.py`` and build ``bindaddr.c`` from beside ``vm/workers.py``;
    a glob in pyproject's package data that missed the move would leave an installed emulator without them."""
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    wings = [f"tpuops/emulator/{wing}/__init__.py" for wing in ("api", "cloud", "gcs", "vm")]
    needed = [*wings, "tpuops/emulator/vm/bindaddr.c", "tpuops/emulator/vm/tpu_runtime.py",
              "tpuops/emulator/cloud/slices.py"]
    assert not [name for name in needed if name not in names], sorted(n for n in names if "emulator" in n)


@pytest.mark.emulator
@pytest.mark.slow
def test_wheel_on_python_313_without_a_runtime_then_with_tf_python(
        wheel: Path, tmp_path: Path, stop_emulator: list[Installed]) -> None:
    tpuops = install(wheel, "3.13", tmp_path)
    front_door(tpuops)

    refused = tpuops("up", "node-1")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        "error: provider 'local' needs a TF 2.9 runtime and there is none: run 'tpuops runtime install' "
        f"(builds it in {tpuops.env['TPUOPS_HOME']}/runtime/tf29) or set tf_python")
    assert tpuops("runtime", "status").returncode == 1

    if not TF_PYTHON.exists():
        pytest.skip(f"{TF_PYTHON} is missing (make setup): the emulator half is not tested")
    tpuops.env["TPUOPS_TF_PYTHON"] = str(TF_PYTHON)
    assert json.loads(tpuops.ok("runtime", "status", "--json"))["runtime"] == str(TF_PYTHON)
    stop_emulator.append(tpuops)
    tpuops.ok("emulator", "start")
    assert json.loads(tpuops.ok("status", "--json"))["nodes"] == []


@pytest.mark.emulator
@pytest.mark.tf
@pytest.mark.slow
def test_wheel_on_python_310_installs_its_runtime_and_trains_digits(
        wheel: Path, tmp_path: Path, stop_emulator: list[Installed]) -> None:
    tpuops = install(wheel, "3.10", tmp_path, extras="[samples]")
    front_door(tpuops)

    runtime = Path(tpuops.env["TPUOPS_HOME"]) / "runtime" / "tf29"
    built = json.loads(tpuops.ok("runtime", "install", "--json", timeout=1200))
    assert (built["venv"], built["reused"], built["tensorflow"]) == (str(runtime), False, "2.9.3")
    assert json.loads(tpuops.ok("runtime", "status", "--json"))["runtime"] == str(runtime / "bin" / "python")

    shutil.rmtree(tpuops.work / "data")
    tpuops.ok("data", "sample", "digits", "data/digits")
    stop_emulator.append(tpuops)
    result = json.loads(tpuops.ok("train", "experiments/digits_cnn.yaml", "--name", "digits-wheel", "--json",
                                  timeout=600))
    assert result["exit_class"] == "succeeded" and result["metrics"]["eval"]["accuracy"] >= 0.95
    assert json.loads(tpuops.ok("status", "--json"))["nodes"] == []
