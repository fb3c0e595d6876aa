"""``tpuops up / status / down`` end to end: the CLI, the official client, the emulator."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import poll, start_tf_emulator

from tpuops.cli.main import run
from tpuops.emulator.control import AdminClient, EmulatorInfo, stop
from tpuops.providers.base import wait_for
from tpuops.providers.cloud_tpu.adapter import TpuApi

pytestmark = [pytest.mark.emulator, pytest.mark.tf]

ZONES = ("us-central1-a", "us-central1-b")
PROJECT = "tpuops-local"


@dataclass
class Cli:
    """Runs ``tpuops`` in-process against one emulator with an isolated home and config."""

    home: Path
    emulator: EmulatorInfo
    capsys: pytest.CaptureFixture[str]

    @property
    def admin(self) -> AdminClient:
        return AdminClient(self.emulator.endpoint)

    def __call__(self, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = run(list(args))
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *args: str) -> dict:
        code, out, err = self(*args, "--json")
        assert code == 0, err
        return json.loads(out)

    def api(self) -> TpuApi:
        return TpuApi(PROJECT, endpoint=self.emulator.endpoint, token=self.emulator.token, poll_interval_s=0.05)

    def nodes(self) -> list[tuple[str, str, str]]:
        api = self.api()
        return sorted((n.zone, n.name, n.state.value) for zone in ZONES for n in api.list_nodes(zone))

    def sandbox(self, zone: str, name: str) -> Path:
        return self.emulator.state_dir / "nodes" / PROJECT / zone / name


def _env_for(home: Path, endpoint: str, **extra: str) -> dict[str, str]:
    config = home / "tpuops.toml"
    config.write_text(f'zones = ["{ZONES[0]}", "{ZONES[1]}"]\nstore = "{home / "store"}"\n')
    return {"TPUOPS_HOME": str(home), "TPUOPS_CONFIG": str(config), "TPUOPS_TPU_ENDPOINT": endpoint,
            "TPUOPS_POLL_INTERVAL_S": "0.05", "TPUOPS_API_DEADLINE_S": "20", **extra}


@pytest.fixture(scope="module")
def shared_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorInfo]:
    info = start_tf_emulator(tmp_path_factory.mktemp("emu"), boot_delay_s=0.3)
    yield info
    stop(info.state_dir)


@pytest.fixture(scope="module")
def slow_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorInfo]:
    """Nodes stay CREATING for a minute: room to interrupt an ``up`` mid-wait."""
    info = start_tf_emulator(tmp_path_factory.mktemp("slow"), boot_delay_s=60.0)
    yield info
    stop(info.state_dir)


def _make_cli(emulator: EmulatorInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
              capsys: pytest.CaptureFixture[str], **extra: str) -> Cli:
    for key, value in _env_for(tmp_path, emulator.endpoint, **extra).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    cli = Cli(tmp_path, emulator, capsys)
    cli.admin.clear_faults()
    return cli


@pytest.fixture
def cli(shared_emulator: EmulatorInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> Iterator[Cli]:
    made = _make_cli(shared_emulator, tmp_path, monkeypatch, capsys)
    yield made
    made.admin.clear_faults()
    api = made.api()
    for zone, name, _ in made.nodes():
        operation = api.delete_node(zone, name)
        if operation is not None:
            wait_for(api, operation, timeout_s=30)


def _error_line(err: str) -> str:
    """The one line the CLI prints for a failure (progress lines may precede it)."""
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err
    assert err.splitlines()[-1] == errors[0]
    return errors[0]


def test_up_status_down_lifecycle_runs_the_startup_script(cli: Cli) -> None:
    made = cli.json("up", "life-1", "--accelerator", "v3-8", "--spot")
    assert (made["state"], made["zone"], made["adopted"]) == ("READY", ZONES[0], False)
    assert made["runtime"] == "tpu-vm-tf-2.9.3" and made["capacity"] == "spot"
    assert made["labels"]["managed-by"] == "tpuops"

    marker = cli.sandbox(ZONES[0], "life-1") / "tpuops" / "boot.json"
    poll(marker.exists, "the startup script's boot marker")
    boot = json.loads(marker.read_text())
    assert boot["node"] == "life-1"
    assert str(boot["tf_version"]).startswith("2.9")

    listed = cli.json("status")["nodes"]
    assert [(n["name"], n["state"], n["health"]) for n in listed] == [("life-1", "READY", "HEALTHY")]
    code, out, _ = cli("status")
    assert code == 0 and "life-1" in out and "READY" in out

    again = cli.json("up", "life-1", "--accelerator", "v3-8", "--spot")
    assert again["adopted"] is True
    assert cli.nodes() == [(ZONES[0], "life-1", "READY")]

    gone = cli.json("down", "life-1", "--yes")["results"]
    assert gone == [{"name": "life-1", "zone": ZONES[0], "outcome": "deleted"}]
    assert cli.nodes() == []
    twice = cli.json("down", "life-1")["results"]
    assert twice == [{"name": "life-1", "zone": None, "outcome": "not found"}]


def test_up_of_an_existing_name_with_another_spec_is_a_usage_error(cli: Cli) -> None:
    """The user asked for a node the name cannot give: one line, exit 2 (issue 30, item 16), and nothing changed."""
    cli.json("up", "other-1", "--accelerator", "v3-8", "--spot")
    code, _, err = cli("up", "other-1", "--accelerator", "v2-8", "--on-demand")
    assert code == 2
    line = _error_line(err)
    assert "other-1" in line and "v3-8 spot" in line and "choose another name" in line
    assert cli.nodes() == [(ZONES[0], "other-1", "READY")]


def test_status_costs_one_list_per_zone(cli: Cli) -> None:
    for name in ("s-1", "s-2", "s-3"):
        assert cli("up", name, "--no-wait")[0] == 0
    before = cli.admin.stats()
    assert len(cli.json("status")["nodes"]) == 3
    after = cli.admin.stats()
    assert after.get("ListNodes", 0) - before.get("ListNodes", 0) == len(ZONES)
    assert after.get("GetNode", 0) == before.get("GetNode", 0)


def test_stockout_in_first_zone_creates_in_second(cli: Cli) -> None:
    cli.admin.set_faults(stockout_zones=[ZONES[0]])
    made = cli.json("up", "stock-1")
    assert made["zone"] == ZONES[1]
    assert made["stockouts"] == [ZONES[0]]
    assert cli.nodes() == [(ZONES[1], "stock-1", "READY")]


def test_stockout_everywhere_is_one_clear_error_and_no_node(cli: Cli) -> None:
    cli.admin.set_faults(stockout_zones=list(ZONES))
    code, _, err = cli("up", "stock-2")
    assert code == 1
    assert "no capacity for v3-8 (spot) in any configured zone" in _error_line(err)
    assert cli.nodes() == []


def test_503_storm_is_retried_then_succeeds(cli: Cli) -> None:
    cli.admin.reset_stats()
    cli.admin.set_faults(error_burst=6, error_code=503)
    made = cli.json("up", "storm-1")
    assert made["state"] == "READY"
    # two GetNode (one per zone), CreateNode, GetOperation, GetNode succeed; six more were refused
    assert sum(cli.admin.stats().values()) >= 5 + 6


def test_retries_exhausted_is_one_clear_error(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPUOPS_API_DEADLINE_S", "2")
    cli.admin.set_faults(error_rate=1.0, error_code=503)
    code, _, err = cli("up", "storm-2")
    cli.admin.clear_faults()
    assert code == 1
    assert "Cloud TPU API failed" in _error_line(err)
    assert cli.nodes() == []


def test_dry_run_prints_request_and_script_and_calls_nothing(cli: Cli) -> None:
    before = cli.admin.stats()
    code, out, _ = cli("up", "dry-1", "--accelerator", "v4-8", "--preemptible", "--dry-run")
    assert code == 0
    assert '"acceleratorType": "v4-8"' in out and '"runtimeVersion": "tpu-vm-tf-2.9.3-v4"' in out
    assert '"preemptible": true' in out
    assert "#!/bin/bash" in out and "set -euo pipefail" in out
    plan = cli.json("up", "dry-1", "--dry-run")
    assert plan["body"]["schedulingConfig"] == {"spot": True}
    assert plan["body"]["metadata"]["startup-script"].startswith("#!/bin/bash")
    after = cli.admin.stats()
    assert {k: v for k, v in after.items() if k != "injected_errors"} == \
           {k: v for k, v in before.items() if k != "injected_errors"}


def test_hostile_values_never_execute_on_the_node(cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pwned = tmp_path / "pwned"
    hostile_store = f"{tmp_path}/store/$(touch {pwned})/'; touch {pwned} #`touch {pwned}`"
    monkeypatch.setenv("TPUOPS_STORE", hostile_store)
    monkeypatch.setenv("TPUOPS_LABELS", "team=ml")
    assert cli("up", "hostile-1")[0] == 0
    marker = cli.sandbox(ZONES[0], "hostile-1") / "tpuops" / "boot.json"
    poll(marker.exists, "the boot marker")
    assert not pwned.exists()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["up", "Bad_Name"], "node name 'Bad_Name' is not allowed"),
        (["up", "ok-name", "--accelerator", "v9-8"], "accelerator 'v9-8' is not a Cloud TPU type"),
        (["up", "ok-name", "--accelerator", "v5p-8"], "TF 2.9"),
        (["up", "ok-name", "--accelerator", "v3-8", "--runtime", "tpu-vm-tf-2.9.3-pod"], "tpu-vm-tf-2.9.3"),
        (["up", "ok-name", "--zone", "nowhere"], "zone 'nowhere' is not a zone name"),
        (["up", "ok-name", "--spot", "--on-demand"], "choose one of --spot, --preemptible, --on-demand"),
    ],
)
def test_bad_input_is_one_line_exit_2(cli: Cli, args: list[str], fragment: str) -> None:
    before = cli.admin.stats().get("CreateNode", 0)
    code, _, err = cli(*args)
    assert code == 2, err
    assert fragment in (_error_line(err) if fragment.startswith(("node", "acc", "TF", "tpu", "zone")) else err)
    assert cli.admin.stats().get("CreateNode", 0) == before


def test_bad_config_value_is_one_line_exit_2(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPUOPS_CAPACITY", "cheap")
    code, _, err = cli("status")
    assert code == 2
    assert err.strip() == ("error: environment: capacity = 'cheap' is not allowed: "
                           "expected 'spot', 'preemptible' or 'on-demand'")


def test_bad_label_in_config_is_rejected_before_any_call(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPUOPS_LABELS", "Team=ML")
    code, _, err = cli("up", "label-1")
    assert code == 2 and "label" in err and "Team" in err


def test_up_timeout_leaves_no_orphan(slow_emulator: EmulatorInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    cli = _make_cli(slow_emulator, tmp_path, monkeypatch, capsys, TPUOPS_OPERATION_TIMEOUT_S="0.5")
    code, _, err = cli("up", "late-1")
    assert code == 1 and "did not finish within" in _error_line(err)
    assert cli.nodes() == []


def test_up_killed_while_waiting_is_adopted_by_the_next_up(
        slow_emulator: EmulatorInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    cli = _make_cli(slow_emulator, tmp_path, monkeypatch, capsys)
    proc = subprocess.Popen([sys.executable, "-m", "tpuops.cli.main", "up", "kill-1"], env=dict(os.environ),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        poll(lambda: (ZONES[0], "kill-1", "CREATING") in cli.nodes(), "the node to be CREATING")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    made = cli.json("up", "kill-1", "--no-wait")
    assert made["adopted"] is True
    assert cli.nodes() == [(ZONES[0], "kill-1", "CREATING")]
    assert cli("down", "kill-1")[0] == 0
    assert cli.nodes() == []


WORKER_NUMBER = ("curl -s -H 'Metadata-Flavor: Google' "
                 "http://$GCE_METADATA_HOST/computeMetadata/v1/instance/attributes/agent-worker-number; echo; pwd")


def test_exec_runs_on_each_worker_of_a_slice_with_its_own_directory_and_metadata(cli: Cli) -> None:
    assert cli.json("up", "pod-1", "--accelerator", "v2-32", "--spot")["hosts"] == 4
    code, out, err = cli("exec", "pod-1", "--worker", "all", "--", "sh", "-c", WORKER_NUMBER)
    assert code == 0, err
    lines = out.splitlines()
    assert [line for line in lines if not line.startswith("[w")] == []
    for worker in range(4):
        mine = [line.split(" ", 1)[1] for line in lines if line.startswith(f"[w{worker}] ")]
        suffix = "" if worker == 0 else f".w{worker}"
        assert mine == [str(worker), str(cli.sandbox(ZONES[0], "pod-1")) + suffix], lines
    code, out, _ = cli("exec", "pod-1", "--worker", "2", "--", "sh", "-c", "exit 3")
    assert (code, out) == (3, "")
    code, out, err = cli("exec", "pod-1", "--worker", "1", "--json", "--", "echo", "hi")
    assert code == 0, err
    assert json.loads(out)["workers"] == [{"worker": 1, "code": 0, "stdout": "hi\n", "stderr": ""}]
    code, _, err = cli("exec", "pod-1", "--worker", "7", "--", "true")
    assert code == 2 and _error_line(err).endswith("node pod-1 is a v2-32 with 4 hosts; give 0-3 or all")
    cli("down", "pod-1")


def test_status_names_a_slices_worker_that_never_booted(cli: Cli) -> None:
    """The API's symptom (TIMEOUT, ``workerId`` 3) reaches the neutral node type, so the controller can act on it."""
    cli.admin.set_faults(never_boot_workers=["late-1/3"])
    cli.json("up", "late-1", "--accelerator", "v2-32", "--spot")

    def shown() -> dict | None:
        node = next(n for n in cli.json("status")["nodes"] if n["name"] == "late-1")
        return node if node["unhealthy_workers"] else None

    node = poll(shown, "the worker that never booted, in status", timeout_s=180)
    assert (node["hosts"], node["unhealthy_workers"], node["health"], node["state"]) == (4, [3], "TIMEOUT", "READY")
    code, out, _ = cli("status")
    assert code == 0 and "4 (w3 down)" in out
