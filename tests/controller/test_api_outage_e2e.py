"""A Cloud TPU API that fails every call while runs end and are stopped: real runs (the CLI, the emulator, real TF 2.9).

Issue 38's defects 1 and 3, reproduced as a user met them:

- a run that ends while the API fails leaves its node READY, and billed, until a delete gets through; the
  ledger must bill it until then (it closed the node at the agent's end: 0.44 of what was billed), and
  ``tpuops cost`` must show the time billed after the run's end while it lasts;
- ``tpuops stop --no-wait`` while the API fails must return once the stop is recorded (it blocked about
  4 minutes, then exited 1), and the agent must see the stop through the store, save and end, with no
  API; once the API answers, the node is deleted and billed within 1 % of the emulator's billing.

The fault is the emulator's ``error_rate 1.0`` (``tpuops emulator fault``): every Cloud TPU call fails,
the VM's self-delete too; Cloud Storage still answers.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from helpers import TfWorld, digits_project, poll, small_digits, tf_emulator_env

from tpuops import runs
from tpuops.config import load_settings
from tpuops.emulator.control import AdminClient, stop
from tpuops.store import open_store

pytestmark = [pytest.mark.emulator, pytest.mark.tf, pytest.mark.slow]

PROJECT = "tpuops-local"
ZONE = "us-central1-a"


class World(TfWorld):
    def spec(self, name: str, steps: int) -> Path:
        path = self.work / "experiments" / f"{name}.yaml"
        path.write_text(small_digits(digits_project_text(self.work), steps=steps).replace("name: small",
                                                                                            f"name: {name}"))
        return path

    def launch(self, run: str, steps: int) -> None:
        done = self.tpuops("train", str(self.spec(run, steps)), "--name", run, "--detach", "--json")
        assert done.returncode == 0, done.stderr

    def node(self, run: str) -> dict[str, Any] | None:
        return next((n for n in self.admin.nodes() if n["name"].endswith(f"/nodes/{run}")), None)

    def status(self, run: str) -> dict[str, Any]:
        status = runs.read_status(self.store, run)
        return status.model_dump(mode="json") if status else {}

    def script_log(self, run: str) -> str:
        path = self.info.state_dir / "nodes" / PROJECT / ZONE / run / "startup-script.log"
        return path.read_text() if path.exists() else ""

    def cost(self, run: str) -> dict[str, Any]:
        done = self.tpuops("cost", "--run", run, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def billed_s(self, run: str) -> float:
        """What the emulator billed the run's nodes (its billing truth), every interval closed."""
        intervals = [i for i in self.admin.billing() if i["node"].endswith(f"/nodes/{run}")]
        assert intervals and all(i["end"] is not None for i in intervals), intervals
        return sum(i["seconds"] for i in intervals)

    def ready_and_seen(self, run: str) -> None:
        """The run's node READY, and seen so by a listing (``tpuops status``): the ledger bills it from then."""
        poll(lambda: (n := self.node(run)) is not None and n["state"] == "READY", f"{run}'s node READY",
             timeout_s=120)
        done = self.tpuops("status")
        assert done.returncode == 0, done.stderr
        poll(lambda: self.status(run).get("step", 0) > 0, f"{run} training", timeout_s=180)


def digits_project_text(work: Path) -> str:
    return (work / "experiments" / "digits_cnn.yaml").read_text()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    work = tmp_path_factory.mktemp("outage")
    text = digits_project(work)
    (work / "experiments" / "digits_cnn.yaml").write_text(text)
    config = work / "tpuops.toml"
    config.write_text(f'zones = ["{ZONE}"]\n')
    info, env = tf_emulator_env(work, config, lease_ttl_s=2.0)
    settings = load_settings(environ=env)
    try:
        yield World(work, info, env, settings, open_store(settings.store_root), AdminClient(info.endpoint))
    finally:
        stop(info.state_dir)


@pytest.fixture
def failing_api(world: World) -> Iterator[AdminClient]:
    """The API failing every call until the test clears it (or ends)."""
    yield world.admin
    world.admin.clear_faults()


def test_a_run_that_ends_while_the_api_fails_is_billed_until_its_node_is_gone(
        world: World, failing_api: AdminClient) -> None:
    run = "ends-in-outage"
    world.launch(run, steps=200)
    world.ready_and_seen(run)
    failing_api.set_faults(error_rate=1.0)
    poll(lambda: world.status(run).get("exit_class") == "succeeded", f"{run} to succeed", timeout_s=300)
    poll(lambda: "self-delete attempt 3 failed" in world.script_log(run), "three self-deletes to fail",
         timeout_s=60)
    ended = world.status(run)["ended"]
    assert (node := world.node(run)) is not None and node["state"] == "READY"  # billed on: nothing could delete it
    before = time.time()
    overrun = world.cost(run)["goodput"][run]["idle_after_end_s"]
    assert overrun >= before - datetime.fromisoformat(ended).timestamp() - 1.0  # up to now, while it lasts
    table = world.tpuops("cost", "--run", run)
    assert table.returncode == 0 and "billed after its end" in table.stdout, table.stdout
    failing_api.clear_faults()
    poll(lambda: world.node(run) is None, "the self-delete to get through", timeout_s=120)
    done = world.tpuops("status")  # the listing that finds it gone
    assert done.returncode == 0, done.stderr
    ledger_s = next(t["ready_seconds"] for t in world.cost(run)["runs"] if t["key"] == run)
    billed_s = world.billed_s(run)
    assert abs(ledger_s - billed_s) <= 0.01 * billed_s, (ledger_s, billed_s)


def test_stop_no_wait_while_the_api_fails_returns_and_the_agent_saves_and_ends_on_its_own(
        world: World, failing_api: AdminClient) -> None:
    """``stop --no-wait`` returns while the API still fails (the fault is cleared only after it has), exit 0 and one
    line per run saying when the stop takes effect; the agent reads the stop from the store, saves and ends
    ``stopped``, a user's stop and not a preemption, while its node is still READY; once the API answers the node
    deletes itself, and the ledger bills it as the emulator did, within 1 %."""
    run = "stopped-in-outage"
    world.launch(run, steps=50000)
    world.ready_and_seen(run)
    failing_api.set_faults(error_rate=1.0)
    stopping = subprocess.Popen([sys.executable, "-m", "tpuops", "stop", run, "--no-wait", "--json"], cwd=world.work,
                                env=world.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    out, err = stopping.communicate(timeout=600)
    assert failing_api.set_faults()["error_rate"] == 1.0  # it returned while the API still failed
    assert stopping.returncode == 0 and "Traceback" not in err, err
    [stopped] = json.loads(out)["runs"]
    assert stopped["run_id"] == run and stopped["trouble"], stopped  # recorded; what is left is said
    status = poll(lambda: (s := world.status(run)).get("exit_class") and s, f"{run}'s agent to end", timeout_s=120)
    assert status["exit_class"] == "stopped", status
    assert status["last_checkpoint_step"] == status["step"] > 0  # saved where it stopped
    assert "stopped (tpuops stop) at step" in status["message"], status
    assert (node := world.node(run)) is not None and node["state"] == "READY"  # nothing could delete it yet
    failing_api.clear_faults()
    poll(lambda: world.node(run) is None, "the node to go once the API answers", timeout_s=120)
    done = world.tpuops("reconcile", "--json")
    assert done.returncode == 0, done.stderr
    assert runs.load_memory(world.store, run)[0].outcome == "stopped"
    report = world.cost(run)
    ledger_s = next(t["ready_seconds"] for t in report["runs"] if t["key"] == run)
    billed_s = world.billed_s(run)
    assert abs(ledger_s - billed_s) <= 0.01 * billed_s, (ledger_s, billed_s)
    assert report["goodput"][run]["lost_s"] == 0.0  # a stop someone asked for is no interruption
    logs = world.tpuops("logs", run)
    assert "PreemptedExit" not in logs.stdout and "stopped" in logs.stdout, logs.stdout[-2000:]
