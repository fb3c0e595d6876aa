"""Helpers shared by the test modules (fixtures live in conftest.py)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import pytest

from tpuops.config import Settings, load_settings
from tpuops.emulator.control import AdminClient, EmulatorInfo, start_background, stop
from tpuops.store import Store, open_store

if TYPE_CHECKING:
    from tpuops.sim.engine import Simulation

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[1]
TF_PYTHON = REPO / ".venv-tf29" / "bin" / "python"




def cli_env(work: Path, info: EmulatorInfo, config_text: str = 'zones = ["us-central1-a", "us-central1-b"]\n'
            ) -> dict[str, str]:
    """The environment of a ``tpuops`` subprocess in a test project (``work``) against the emulator ``info``:
    this machine's, without its ``TPUOPS_`` settings, and ``work/tpuops.toml`` holding ``config_text`` (two zones)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUOPS_")}
    config = work / "tpuops.toml"
    config.write_text(config_text)
    return {**env, "TPUOPS_HOME": str(work / "home"), "TPUOPS_CONFIG": str(config),
            "TPUOPS_TPU_ENDPOINT": info.endpoint, "TPUOPS_POLL_INTERVAL_S": "0.2"}

def start_cli(work: Path, info: EmulatorInfo, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``tpuops ARGS`` started in the test project ``work`` against the emulator ``info`` (``cli_env`` unless
    ``env`` is given), no stdin, its output captured as text: the end-to-end tests' one way to run the CLI."""
    return subprocess.Popen([sys.executable, "-m", "tpuops", *args], cwd=work, env=env or cli_env(work, info),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_dir(work: Path, run: str) -> Path:
    """A run's folder in the local store of a test project laid out as ``work/home/store``."""
    return work / "home" / "store" / "runs" / run


def run_status(work: Path, run: str) -> dict[str, Any]:
    """The run's ``status.json`` as written (``{}`` before the agent wrote one)."""
    import json

    path = run_dir(work, run) / "status.json"
    return json.loads(path.read_text()) if path.exists() else {}

LIVE = {"command": "train", "attempt": 1, "phase": "training", "step": 10, "total_steps": 1000}
"""An agent's status while it trains: the run is alive and has work left."""


def write_status(store: Store, run_id: str, fields: dict[str, Any]) -> None:
    """``run_id``'s ``status.json`` holding ``fields``, as its agent writes it."""
    from tpuops import runs

    store.write_bytes(runs.status_key(run_id), runs.AgentStatus.model_validate(
        {**fields, "run_id": run_id}).model_dump_json().encode())


def declare_run(settings: Settings, store: Store, run_id: str, zone: str, *, budget_usd: float | None = None,
                metadata: dict[str, str] | None = None, experiment: str = "x") -> None:
    """A spot v2-8 train run in ``zone`` as ``jobs.declare`` leaves it, its agent training (``LIVE``): what a
    controller's pass acts on, without an experiment to launch (``metadata``: the node's, a startup script say)."""
    from tpuops import runs
    from tpuops.core.kinds import Capacity
    from tpuops.launch.provision import plan_up

    request = plan_up(settings, run_id, accelerator="v2-8", capacity=Capacity.SPOT, zone=zone, run_id=run_id).request
    if metadata is not None:
        request = request.model_copy(update={"metadata": metadata})
    record = runs.RunRecord(run_id=run_id, kind=runs.RunKind.TRAIN, node=runs.NodeSpec.of(request, [zone]),
                            experiment=experiment, budget_usd=budget_usd)
    store.write_bytes(runs.record_key(run_id), record.model_dump_json().encode())
    write_status(store, run_id, LIVE)
    runs.mark_active(store, run_id)


def poll(check: Callable[[], T], what: str, timeout_s: float = 60.0, interval_s: float = 0.05) -> T:
    """Call ``check`` until it returns something truthy; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


class _Stop(Exception):
    """Ends a ``watching`` thread from its own sleep."""


@contextlib.contextmanager
def watching(settings: Settings, interval_s: float, *, wake: bool = True) -> Iterator[list[BaseException]]:
    """``api.watch`` (what ``tpuops watch`` runs) in a thread for the block; yields the errors it stopped on."""
    from tpuops import api

    halt = threading.Event()
    failures: list[BaseException] = []

    def sleep(seconds: float) -> None:
        if halt.wait(seconds):
            raise _Stop

    def loop() -> None:
        try:
            api.watch(settings, interval_s=interval_s, sleep=sleep, wake=wake)
        except _Stop:
            pass
        except BaseException as err:  # the test asserts there is none
            failures.append(err)

    thread = threading.Thread(target=loop, name="watch", daemon=True)
    thread.start()
    try:
        yield failures
    finally:
        halt.set()
        thread.join(60)


def example_datasets(data: Path) -> None:
    """The example experiments' datasets under ``data``: digits, diabetes, topics (``experiments/sample_data.py``)."""
    from tpuops.data.samples import digits

    spec = importlib.util.spec_from_file_location("sample_data", REPO / "experiments" / "sample_data.py")
    assert spec is not None and spec.loader is not None
    samples = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(samples)
    digits(data / "digits")
    samples.diabetes(data / "diabetes")
    samples.topics(data / "topics")


def digits_project(work: Path) -> str:
    """``work`` laid out as a digits project (its data, ``experiments/models.py``); the text of
    experiments/digits_cnn.yaml, for a test to write its variants next to the models."""
    from tpuops.data.samples import digits

    digits(work / "data" / "digits")
    experiments = work / "experiments"
    experiments.mkdir()
    (experiments / "models.py").write_text((REPO / "experiments" / "models.py").read_text())
    return (REPO / "experiments" / "digits_cnn.yaml").read_text()


def small_digits(text: str, steps: int = 60, expected_hours: float = 0.01) -> str:
    """experiments/digits_cnn.yaml's ``text`` made small: ``steps`` steps, an evaluation and a checkpoint every 20."""
    for old, new in (("name: digits-cnn", "name: small"), ("steps: 600", f"steps: {steps}"),
                     ("steps_per_call: 20", "steps_per_call: 10"), ("every_steps: 100", "every_steps: 20"),
                     ("per_replica: 64", "per_replica: 32"), ("\neval:\n", "\neval:\n  every_steps: 20\n")):
        assert old in text, old
        text = text.replace(old, new)
    return text + f"expected_hours: {expected_hours}\n"


def spec_variant(work: Path, example: str, name: str, replace: dict[str, str]) -> Path:
    """A copy of ``work``/experiments/<example>.yaml next to it (same bundle folder) with lines replaced."""
    text = (work / "experiments" / f"{example}.yaml").read_text()
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    path = work / "experiments" / f"{name}.yaml"
    path.write_text(text)
    return path


def local_or_gcs_store(request: Any, tmp_path: Path) -> Store:
    """The store a ``LOCAL_AND_GCS``-parametrized fixture stands for: a fresh local one, or one in a fresh bucket
    on the session's fake-gcs-server."""
    from tpuops.store import LocalStore, gcs_client
    from tpuops.store.gcs import GcsStore

    if request.param == "local":
        return LocalStore(tmp_path / "store")
    server = request.getfixturevalue("fake_gcs")
    bucket = request.getfixturevalue("gcs_bucket")
    return GcsStore(bucket, "root", client=gcs_client(server.endpoint), deadline_s=10)


@dataclass
class TfWorld:
    """A working directory, an emulator running real TF 2.9 and what drives it: the base of the e2e worlds."""

    work: Path
    info: EmulatorInfo
    env: dict[str, str]
    settings: Settings
    store: Store
    admin: AdminClient

    def tpuops(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """``tpuops ARGS`` as a user runs it: a separate process in the working directory."""
        return subprocess.run([sys.executable, "-m", "tpuops", *args], cwd=self.work, env=self.env,
                              capture_output=True, text=True, timeout=timeout, check=False)

    def controller(self, holder: str, **overrides: Any) -> Any:
        """A controller of this world's store, its passes advancing the sweeps (as ``tpuops.api.controller``'s),
        with ``overrides`` applied to its settings."""
        from tpuops.session import fleet
        from tpuops.sweeps.advance import SweepStep

        settings = self.settings.model_copy(update=overrides)
        return controller_over(settings, self.store, fleet(settings), sweeps=SweepStep(), holder=holder)


TWO_ZONES = 'zones = ["us-central1-a", "us-central1-b"]\n'


def tf_emulator_env(work: Path, config: Path, lease_ttl_s: float, *, grace_s: float = 20.0
                    ) -> tuple[EmulatorInfo, dict[str, str]]:
    """A TF emulator under ``work/home`` and the environment a ``tpuops`` process needs to drive it fast (this
    machine's without its ``TPUOPS_`` settings); the caller stops the emulator (``open_tf_world`` does)."""
    info = start_tf_emulator(work / "home" / "emulator", grace_s=grace_s)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUOPS_")}
    env.update(TPUOPS_HOME=str(work / "home"), TPUOPS_CONFIG=str(config), TPUOPS_TPU_ENDPOINT=info.endpoint,
               TPUOPS_POLL_INTERVAL_S="0.2", TPUOPS_LEASE_TTL_S=str(lease_ttl_s))
    return info, env


@contextlib.contextmanager
def open_tf_world(work: Path, config: str = TWO_ZONES, *, lease_ttl_s: float = 5.0, grace_s: float = 20.0,
                  env: Mapping[str, str] | None = None, world: type[TfWorld] = TfWorld) -> Iterator[TfWorld]:
    """``work/tpuops.toml`` holding ``config``, an emulator under ``work/home`` whose nodes run real TF 2.9, and
    the environment to drive it (``tf_emulator_env``'s, then ``env``); the emulator stops on leaving."""
    path = work / "tpuops.toml"
    path.write_text(config)
    info, environ = tf_emulator_env(work, path, lease_ttl_s, grace_s=grace_s)
    try:
        environ.update(env or {})
        settings = load_settings(environ=environ)
        yield world(work, info, environ, settings, open_store(settings.store_root), AdminClient(info.endpoint))
    finally:
        stop(info.state_dir)


def tf_world(name: str, edits: Callable[[str], Mapping[str, str]] | None = None, *,
             layout: Callable[[Path], str] = digits_project, config: str = TWO_ZONES, lease_ttl_s: float = 5.0,
             grace_s: float = 20.0, scope: Literal["function", "module"] = "module",
             world: type[TfWorld] = TfWorld) -> Any:
    """A test module's ``world`` fixture (``world = tf_world("train", ...)``): a fresh folder named ``name`` laid out
    by ``layout`` (default: the digits project, whose experiment text it returns), the experiments ``edits`` makes
    from that text (file name in ``experiments/``: content), and ``open_tf_world`` over it.

    Module-scoped by default: one emulator and one project for the file (``make test`` keeps a file on one
    worker, ``--dist loadfile``). ``world`` is the class handed out, for a module that adds its own verbs."""

    def fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TfWorld]:
        work = tmp_path_factory.mktemp(name)
        source = layout(work)
        for file, text in (edits(source) if edits else {}).items():
            (work / "experiments" / file).write_text(text)
        with open_tf_world(work, config, lease_ttl_s=lease_ttl_s, grace_s=grace_s, world=world) as opened:
            yield opened

    fixture.__doc__ = f"The {name!r} world: {tf_world.__name__}'s project and a TF 2.9 emulator."
    return pytest.fixture(scope=scope, name="world")(fixture)


def settings_at(tmp: Path, config: str = "", **env: object) -> Settings:
    """The settings a user in ``tmp`` gets: ``tmp/tpuops.toml`` holding ``config`` (empty: the defaults), the home
    ``tmp/home`` and ``env`` as ``TPUOPS_<NAME>`` variables (``zones=("a", "b")``, ``poll_interval_s=0.05``), and
    nothing from this machine's environment."""
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "tpuops.toml"
    path.write_text(config)
    environ = {"TPUOPS_HOME": str(tmp / "home")}
    for key, value in env.items():
        environ[f"TPUOPS_{key.upper()}"] = ",".join(value) if isinstance(value, (list, tuple)) else str(value)
    return load_settings(config_path=path, environ=environ)


def use_home(tmp: Path, monkeypatch: pytest.MonkeyPatch, config: str) -> Path:
    """Make ``tmp`` the user's folder for the test's length: ``tmp/tpuops.toml`` holds ``config`` and is the one
    the CLI and api read, the home is ``tmp/home``, and no project comes from this machine's environment."""
    (tmp / "tpuops.toml").write_text(config)
    monkeypatch.chdir(tmp)
    monkeypatch.setenv("TPUOPS_HOME", str(tmp / "home"))
    monkeypatch.setenv("TPUOPS_CONFIG", str(tmp / "tpuops.toml"))
    for name in ("GOOGLE_CLOUD_PROJECT", "TPUOPS_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    return tmp / "home"


def emulator_fleet(info: EmulatorInfo, home: Path, zone: str) -> Any:
    """A ``Fleet`` over ``info``'s emulator with its own home (ledger) in ``zone``, polling operations every 50 ms."""
    from tpuops.billing.ledger import Ledger
    from tpuops.fleet import Fleet
    from tpuops.providers.cloud_tpu.adapter import TpuApi

    settings = load_settings(environ={"TPUOPS_HOME": str(home), "TPUOPS_ZONES": zone}, config_path=None)
    api = TpuApi(settings.project, endpoint=info.endpoint, token=info.token, poll_interval_s=0.05)
    return Fleet(api, settings, Ledger(settings.ledger_path))


def start_tf_emulator(state_dir: Path, *, boot_delay_s: float = 0.2, grace_s: float = 2.0) -> EmulatorInfo:
    """An emulator whose nodes' python3 is the TF 2.9 environment, as on a tpu-vm-tf-2.9 image."""
    return start_background(state_dir, boot_delay_s=boot_delay_s, grace_s=grace_s, image_python=str(TF_PYTHON))


# The stand-in below: a run's job is the bootstrap given its bundle (launch/bundle.job_argv's BUNDLE_URI).
STAND_IN_IMAGE = """#!/bin/sh
case "$3" in
  */bundles/*.tar.gz) exec sleep 86400 ;;
esac
PYTHONPATH={site} exec {python} -S "$@"
"""


def stand_in_image(folder: Path) -> Path:
    """A VM image's ``python3`` that has TensorFlow 2.9.3 by its package metadata and no TensorFlow: nodes
    that boot and start their run's job by the hundred and cost no TensorFlow (an emulator's ``image_python``).

    The startup script runs every line of Python it has for real on this interpreter (its image and pin
    check reads package metadata, the self-delete parses its token), so a change to those lines cannot
    leave nodes hanging in a check nobody answers; only the run's job (the bootstrap, told where the
    run's bundle is) sleeps where it would train, until the preemption notice ends it.
    """
    dist = folder / "site" / "tensorflow-2.9.3.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorflow\nVersion: 2.9.3\n")
    (dist / "top_level.txt").write_text("tensorflow\n")
    path = folder / "image-python"
    path.write_text(STAND_IN_IMAGE.format(site=shlex.quote(str(dist.parent)), python=shlex.quote(sys.executable)))
    path.chmod(0o755)
    return path


# Run by TF_PYTHON with two checkpoint prefixes: exit 0 when every tensor is bit-identical, or, given a relative
# and an absolute tolerance after them, when every tensor agrees within them (numpy.allclose: |a - b| <= atol +
# rtol |b|); either way it prints how far apart they are (the largest |a - b|, and |a - b| / |b| where |b| >= 1e-3).
# How many saves a run made is bookkeeping, not state: a preempted run saves once more.
COMPARE_CHECKPOINTS = """
import sys
import numpy as np
import tensorflow as tf

BOOKKEEPING = ("save_counter/.ATTRIBUTES/VARIABLE_VALUE", "_CHECKPOINTABLE_OBJECT_GRAPH")

def tensors(prefix):
    reader = tf.train.load_checkpoint(prefix)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map() if name not in BOOKKEEPING}

def numbers(value):
    return np.asarray(value, np.float64) if np.issubdtype(np.asarray(value).dtype, np.number) else None

def same(a, b):
    if len(sys.argv) < 5 or numbers(a) is None:
        return np.array_equal(a, b)
    return np.allclose(a, b, float(sys.argv[3]), float(sys.argv[4]))

left, right = tensors(sys.argv[1]), tensors(sys.argv[2])
assert set(left) == set(right), sorted(set(left) ^ set(right))
assert any("optimizer" in name for name in left), "optimizer slots must be compared"
different = [name for name in left if not same(left[name], right[name])]
pairs = [(numbers(left[name]), numbers(right[name])) for name in left if numbers(left[name]) is not None]
gaps = [(np.abs(a - b), (np.abs(a - b) / np.abs(b))[np.abs(b) >= 1e-3]) for a, b in pairs]
print(len(left), "tensors;", len(different), "different:", different[:5], "largest |a - b|:",
      max(float(gap.max(initial=0)) for gap, _ in gaps), "largest |a - b| / |b| where |b| >= 1e-3:",
      max(float(scaled.max(initial=0)) for _, scaled in gaps))
sys.exit(1 if different else 0)
"""


SMALL_SWEEP = """
name: {name}
experiment: ../experiments/digits_cnn.yaml
space:
  learning_rate: {{type: float, low: 0.001, high: 0.1, log: true}}
sampler: {{type: random, seed: 5}}
trials: 2
parallel: 2
"""


def sweeps_world(tmp_path: Path, names: tuple[str, ...], *, config_tail: str = "") -> Simulation:
    """A simulated world (one zone, jobs of 100 s of steps) whose store holds one started ``SMALL_SWEEP`` per name
    (``config_tail``: more of tpuops.toml, a ``[notify]`` table say)."""
    import shutil

    from tpuops.config import load_settings
    from tpuops.data.samples import digits
    from tpuops.providers.cloud_model import CloudModel
    from tpuops.sim.engine import Simulation
    from tpuops.sim.model import AgentModel
    from tpuops.sweeps.start import plan_sweep, start_sweep

    digits(tmp_path / "data" / "digits")
    (tmp_path / "experiments").mkdir()
    (tmp_path / "sweeps").mkdir()
    for name in ("digits_cnn.yaml", "models.py"):
        shutil.copy(REPO / "experiments" / name, tmp_path / "experiments" / name)
    config = tmp_path / "tpuops.toml"
    config.write_text('zones = ["us-central1-a"]\n' + config_tail)
    settings = load_settings(config_path=config, environ={"TPUOPS_HOME": str(tmp_path / "home")})
    sim = Simulation(settings, tmp_path / "world", CloudModel(), AgentModel(total_steps=1000, steps_per_s=10),
                     notify=bool(config_tail))
    for name in names:
        path = tmp_path / "sweeps" / f"{name}.yaml"
        path.write_text(SMALL_SWEEP.format(name=name))
        start_sweep(plan_sweep(settings, path, sim.store, base_dir=tmp_path), sim.store, lambda _: None,
                    upload=False)
    return sim


def controller_over(settings: Any, store: Any, fleet: Any, **options: Any) -> Any:
    """A controller over ``fleet``, handed that fleet's billing observer: the tests' composition root, as
    ``tpuops.api.controller`` is the users' (the controller itself never reaches into its fleet for it)."""
    from tpuops.controller.reconcile import Controller

    return Controller(settings, store, fleet, billing=fleet.billing, **options)
