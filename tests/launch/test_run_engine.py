"""A run's node against the emulator: frozen at declare time, and a run the controller ended is not active.

The nodes' "image python" is a stand-in that answers the startup script's TensorFlow check and
then sleeps where the agent would train, so these tests cost no TensorFlow; the runs are
declared by the real ``jobs.plan_train`` / ``jobs.declare`` and driven by real controller passes.
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import REPO, controller_over, poll, stand_in_image

from tpuops import runs
from tpuops.billing.ledger import Ledger
from tpuops.cli.main import run as cli_run
from tpuops.config import Settings, load_settings
from tpuops.controller.reconcile import Controller
from tpuops.core.naming import ATTEMPT_KEY, PREEMPTIONS_KEY
from tpuops.data.samples import digits
from tpuops.emulator.control import AdminClient, EmulatorInfo, start_background, stop
from tpuops.launch import jobs
from tpuops.providers.nodes import NodeState
from tpuops.session import connect, fleet, store

pytestmark = pytest.mark.emulator

PROJECT = "tpuops-local"
A, B, C = "us-central1-a", "us-central1-b", "us-central1-c"
VM_ACCOUNT = f"tpuops-vm@{PROJECT}.iam.gserviceaccount.com"


@dataclass
class World:
    work: Path
    info: EmulatorInfo
    config: Path
    env: dict[str, str]

    @property
    def admin(self) -> AdminClient:
        return AdminClient(self.info.endpoint)

    def settings(self) -> Settings:
        """What a controller started now would load (tpuops.toml as it is now)."""
        return load_settings(config_path=self.config, environ=self.env)

    def controller(self, holder: str) -> Controller:
        settings = self.settings()
        return controller_over(settings, store(settings), fleet(settings), sweeps=None, holder=holder)

    def declare(self, run_id: str, **overrides: object) -> jobs.JobPlan:
        settings = self.settings().model_copy(update=overrides)
        plan = jobs.plan_train(settings, self.work / "experiments" / "digits_cnn.yaml", store(settings),
                               run_id=run_id, base_dir=self.work)
        jobs.declare(plan, store(settings), settings, lambda _text: None)
        return plan

    def node(self, run_id: str) -> dict | None:
        return next((n for n in self.admin.nodes() if n["name"].endswith(f"/nodes/{run_id}")), None)


def attribute(node: dict, key: str) -> str:
    """A metadata attribute as the node itself sees it (its GCE-style metadata server)."""
    request = urllib.request.Request(f"http://{node['metadata_host']}/computeMetadata/v1/instance/attributes/{key}",
                                     headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read().decode()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    work = tmp_path_factory.mktemp("engine")
    digits(work / "data" / "digits")
    (work / "experiments").mkdir()
    for name in ("digits_cnn.yaml", "models.py"):
        shutil.copy(REPO / "experiments" / name, work / "experiments" / name)
    info = start_background(work / "home" / "emulator", boot_delay_s=0.1, grace_s=1.0,
                            image_python=str(stand_in_image(work / "image")))
    config = work / "tpuops.toml"
    config.write_text(f'zones = ["{A}", "{B}"]\naccelerator = "v3-8"\ncapacity = "spot"\n'
                      f'service_account = "{VM_ACCOUNT}"\n\n[labels]\nteam = "ml"\n')
    env = {"TPUOPS_HOME": str(work / "home"), "TPUOPS_TPU_ENDPOINT": info.endpoint, "TPUOPS_POLL_INTERVAL_S": "0.05",
           "TPUOPS_LEASE_TTL_S": "1"}
    try:
        yield World(work, info, config, env)
    finally:
        stop(info.state_dir)


def test_a_preempted_run_comes_back_on_its_frozen_node_whatever_tpuops_toml_says_now(world: World) -> None:
    plan = world.declare("frozen-1")
    first = world.controller("first")
    poll(lambda: first.run_pass(only="frozen-1") and (n := world.node("frozen-1")) and n["state"] == "READY",
         "the run's first node READY", timeout_s=60)
    original = world.node("frozen-1")
    assert original is not None and f"/locations/{A}/" in original["name"]
    first.release()

    before = world.config.read_text()
    world.config.write_text(f'zones = ["{C}", "{B}"]\naccelerator = "v2-8"\ncapacity = "preemptible"\n'
                            f'max_run_hours = 1\nservice_account = "other@{PROJECT}.iam.gserviceaccount.com"\n'
                            f'\n[labels]\nteam = "other"\n')
    try:
        later = world.controller("after-the-edit")  # 'tpuops watch' started after the edit, or on another machine
    finally:
        world.config.write_text(before)  # the controller has read it: the edit is in its settings
    assert later.settings.accelerator == "v2-8" and later.settings.zones == [C, B]
    world.admin.preempt(PROJECT, A, "frozen-1", grace_s=0.0)

    def replaced() -> dict | None:
        later.run_pass()
        node = world.node("frozen-1")
        return node if node and node["uid"] != original["uid"] and node["state"] == "READY" else None

    again = poll(replaced, "the replacement node READY", timeout_s=60)
    assert f"/locations/{A}/" in again["name"]
    api = connect(later.settings)
    info = api.get_node(A, "frozen-1")
    want = plan.record.node
    assert (info.accelerator, info.runtime, info.capacity) == (want.accelerator, want.runtime, want.capacity)
    # the frozen labels, and the attempt and preemptions count the replacement carries (tpuops.core.naming.CARRIED_KEYS)
    assert info.labels == {**want.labels, ATTEMPT_KEY: "2", PREEMPTIONS_KEY: "1"} and info.labels["team"] == "ml"
    assert want.service_account == VM_ACCOUNT
    assert api.client.get_node(name=api.node_path(A, "frozen-1")).service_account.email == VM_ACCOUNT
    script = want.metadata["startup-script"]
    assert attribute(again, "startup-script") == script and plan.bundle.sha256 in script
    assert attribute(again, "tpuops-max-run-seconds") == want.metadata["tpuops-max-run-seconds"] == str(72 * 3600)
    memory = runs.load_memory(store(later.settings), "frozen-1")[0]
    assert (memory.preemptions, memory.attempts) == (1, 2)
    ledger = Ledger(later.settings.ledger_path).nodes(PROJECT, run_id="frozen-1")
    assert {(r.zone, r.accelerator, r.capacity) for r in ledger} == {(A, "v3-8", "spot")}
    assert [n for n in api.list_nodes(C)] == []
    for done in api.list_nodes(A):
        api.delete_node(A, done.name)


def test_status_never_shows_a_run_the_controller_ended_before_any_agent_status(
        world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """v3-8 is not offered in us-central1-c: the create is refused, the run ends failed, no agent ever ran."""
    world.declare("refused-1", zones=[C])
    controller = world.controller("refusing")
    poll(lambda: controller.run_pass(only="refused-1") is not None
         and runs.load_memory(store(controller.settings), "refused-1")[0].finished, "the run to finish", timeout_s=30)
    controller.release()
    assert runs.read_status(store(controller.settings), "refused-1") is None
    for key, value in {**world.env, "TPUOPS_CONFIG": str(world.config)}.items():
        monkeypatch.setenv(key, value)

    def cli_json(*args: str) -> dict:
        capsys.readouterr()
        assert cli_run([*args, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    shown = cli_json("status")["runs"]
    assert "refused-1" not in [r["run_id"] for r in shown] and all(not r["finished"] for r in shown)
    listed = {r["run_id"]: r for r in cli_json("runs")["runs"]}
    assert (listed["refused-1"]["phase"], listed["refused-1"]["outcome"]) == ("finished", "failed")
    capsys.readouterr()
    assert cli_run(["logs", "refused-1", "--follow"]) == 0  # ends at once: the run is over
    assert runs.active_run_ids(store(controller.settings)).count("refused-1") == 1  # until a full pass drops it
    controller.run_pass()
    controller.release()
    assert "refused-1" not in runs.active_run_ids(store(controller.settings))
    assert NodeState.READY not in {n.state for n in controller.nodes.provider.list_nodes(C)}


def test_a_watching_controller_rereads_a_ready_nodes_status_only_when_due_and_a_targeted_pass_always(
        world: World) -> None:
    """A node that stays READY when its agent ends (its dead-man's switch failed): a long-lived controller reads
    the status again when it is due, a targeted pass (``train``'s own controller) at once."""
    plan = world.declare("kept-1", zones=[A])
    settings = world.settings()
    root = store(settings)
    watching = controller_over(settings, root, fleet(settings), sweeps=None, holder="watching",
                               status_refresh_s=3600.0)
    poll(lambda: watching.run_pass() and (n := world.node("kept-1")) and n["state"] == "READY"
         and runs.load_memory(root, "kept-1")[0].ready_since is not None, "the node READY and seen so", timeout_s=60)
    root.write_bytes(runs.status_key("kept-1"), json.dumps({"run_id": "kept-1", "attempt": 1, "phase": "training",
                                                             "step": 10}).encode())
    watching.run_pass()  # the node is READY and was seen READY: its status is not due yet
    root.write_bytes(runs.status_key("kept-1"), json.dumps({"run_id": "kept-1", "attempt": 1, "phase": "done",
                                                             "step": 600, "exit_class": "succeeded"}).encode())
    for _ in range(3):
        report = watching.run_pass()
        assert "kept-1" not in report.finished and world.node("kept-1")["state"] == "READY"
    assert watching.run_pass(only="kept-1").finished == {"kept-1": "succeeded"}  # what 'train' and 'drive' run
    assert runs.load_memory(root, "kept-1")[0].outcome == "succeeded"
    assert plan.record.node.name == "kept-1"
    poll(lambda: watching.run_pass() is not None and world.node("kept-1") is None, "the finished run's node to go",
         timeout_s=60)
    watching.run_pass()  # the first pass that lists no node takes the finished run out of the index
    assert "kept-1" not in runs.active_run_ids(root)
    watching.release()
