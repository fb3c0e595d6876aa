"""Emulated nodes behave like TPU VMs: startup scripts, restarts, preemption, deletion, billing.

Startup scripts here are bash and curl only, like the ones a VM image runs, and learn
everything from the metadata server (``GCE_METADATA_HOST``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
from google.api_core import exceptions
from google.cloud import tpu_v2

from tpuops.core import errors
from tpuops.emulator import control

PROJECT = "proj-test"
ZONE = "us-central1-b"
PARENT = f"projects/{PROJECT}/locations/{ZONE}"

METADATA_FN = """
md() { curl -s --noproxy '*' -H 'Metadata-Flavor: Google' "http://$GCE_METADATA_HOST/computeMetadata/v1/$1"; }
"""

pytestmark = [pytest.mark.emulator,
              pytest.mark.skipif(not Path("/proc").is_dir(), reason="the emulator's sandboxes need Linux /proc")]


def _create(client, finish, node_id, script=None, **fields):
    metadata = dict(fields.pop("metadata", {}))
    if script is not None:
        metadata["startup-script"] = script
    node = tpu_v2.Node(accelerator_type="v2-8", runtime_version="tpu-vm-tf-2.9.3", metadata=metadata, **fields)
    return finish(client.create_node(parent=PARENT, node_id=node_id, node=node))


def _sandbox(info, node_id) -> Path:
    return info.state_dir / "nodes" / PROJECT / ZONE / node_id


def _describe(admin, node_id):
    return next(node for node in admin.nodes() if node["name"] == f"{PARENT}/nodes/{node_id}")


def _gone(pid: int) -> bool:
    """True when ``pid`` has exited (a zombie waiting to be reaped counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2] == "Z"


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _pids(directory: Path, *names: str) -> list[int]:
    return [int((directory / name).read_text()) for name in names]


@pytest.fixture
def image_emulator(tmp_path, monkeypatch):
    """An emulator with ``--image-python`` set, started from an environment that claims emulation."""
    monkeypatch.setenv("TPUOPS_EMULATED", "1")
    state_dir = tmp_path / "image-emulator"
    info = control.start_background(state_dir, boot_delay_s=0.2, grace_s=2.0, image_python=sys.executable)
    try:
        yield info
    finally:
        control.stop(state_dir)


def test_startup_script_runs_in_its_sandbox_with_metadata(image_emulator, finish, wait_until):
    from google.oauth2.credentials import Credentials

    client = tpu_v2.TpuClient(
        credentials=Credentials(image_emulator.token), transport="rest",
        client_options={"api_endpoint": image_emulator.endpoint}
    )
    script = (
        METADATA_FN
        + """
{
  echo "home=$HOME"
  echo "cwd=$(pwd)"
  echo "emulated=${TPUOPS_EMULATED:-unset}"
  echo "python=$(python3 -c 'import sys; print(sys.prefix)')"
  echo "worker=$(md instance/attributes/agent-worker-number)"
  echo "accel=$(md instance/attributes/accelerator-type)"
  echo "store=$(md instance/attributes/store-root)"
  echo "zone=$(md instance/zone)"
  echo "name=$(md instance/name)"
  echo "project=$(md project/project-id)"
  echo "preempted=$(md instance/preempted)"
  echo "noflavor=$(curl -s --noproxy '*' -o /dev/null -w '%{http_code}' "http://$GCE_METADATA_HOST/computeMetadata/v1/instance/name")"
} > facts.tmp
mv facts.tmp facts.txt
echo "to the log"
exit 3
"""
    )
    _create(client, finish, "booted", script, metadata={"store-root": "/data/store"})
    sandbox = _sandbox(image_emulator, "booted")
    facts_text = wait_until(lambda: _read(sandbox / "facts.txt"))
    facts = dict(line.split("=", 1) for line in facts_text.splitlines())

    assert facts["home"] == str(sandbox)
    assert facts["cwd"] == str(sandbox)
    assert facts["emulated"] == "unset"
    assert facts["python"] == sys.prefix
    assert facts["worker"] == "0"
    assert facts["accel"] == "v2-8"
    assert facts["store"] == "/data/store"
    assert facts["zone"].startswith("projects/") and facts["zone"].endswith(f"/zones/{ZONE}")
    assert facts["zone"].split("/")[1].isdigit()
    assert facts["name"] == "booted"
    assert facts["project"] == PROJECT
    assert facts["preempted"] == "FALSE"
    assert facts["noflavor"] == "403"

    admin = control.AdminClient(image_emulator.endpoint)
    runs = wait_until(
        lambda: [run for run in _describe(admin, "booted")["script_runs"] if run["exit_code"] is not None]
    )
    assert runs[0]["exit_code"] == 3
    log = (sandbox / "startup-script.log").read_text()
    assert "to the log" in log
    assert "startup-script exit status 3" in log


def test_script_runs_again_after_stop_and_start(tpu_client, emulator, emulator_admin, finish, wait_until):
    """Each boot runs the script again, with a /tmp of the node's own that starts empty, as a VM's does."""
    python_tmp = "$(python3 -c 'import tempfile; print(tempfile.gettempdir())')"
    script = f'echo "run $TMPDIR {python_tmp} $(ls -A "$TMPDIR" | wc -l)" >> runs.txt\ntouch "$TMPDIR/left"\n'
    node = _create(tpu_client, finish, "again", script)
    sandbox = _sandbox(emulator, "again")
    runs_file = sandbox / "runs.txt"
    wait_until(lambda: len(_read(runs_file).splitlines()) == 1)

    finish(tpu_client.stop_node(request={"name": node.name}))
    finish(tpu_client.start_node(request={"name": node.name}))
    wait_until(lambda: len(_read(runs_file).splitlines()) == 2)
    assert _read(runs_file).splitlines() == [f"run {sandbox / 'tmp'} {sandbox / 'tmp'} 0"] * 2
    runs = wait_until(
        lambda: (
            [
                run["exit_code"]
                for run in _describe(emulator_admin, "again")["script_runs"]
                if run["exit_code"] is not None
            ]
            == [0, 0]
        )
    )
    assert runs


def test_preemption_sigterm_metadata_grace_sigkill(tpu_client, emulator, emulator_admin, finish, wait_until):
    script = (
        METADATA_FN
        + """
echo $$ > script.pid
url="http://$GCE_METADATA_HOST/computeMetadata/v1/instance/preempted"
etag=$(curl -s --noproxy '*' -D - -o /dev/null -H 'Metadata-Flavor: Google' "$url" | tr -d '\\r' \
       | awk -F': ' 'tolower($1)=="etag" {print $2}')
# The watcher outlives SIGTERM, as a real agent's watcher would, and dies only by SIGKILL.
(trap '' TERM; curl -s --noproxy '*' -H 'Metadata-Flavor: Google' \
   "$url?wait_for_change=true&timeout_sec=30&last_etag=$etag" > preempted.txt; sleep 300) &
echo $! > watcher.pid
trap 'echo term >> events.txt' TERM
echo ready > ready.txt
while true; do sleep 0.05; done
"""
    )
    node = _create(tpu_client, finish, "spotty", script, scheduling_config=tpu_v2.SchedulingConfig(spot=True))
    sandbox = _sandbox(emulator, "spotty")
    wait_until(lambda: _read(sandbox / "ready.txt"))
    script_pid, watcher_pid = _pids(sandbox, "script.pid", "watcher.pid")

    preempting = emulator_admin.preempt(PROJECT, ZONE, "spotty", grace_s=1.0)
    assert preempting["state"] == "READY"  # still running during the grace period

    wait_until(lambda: _read(sandbox / "preempted.txt") == "TRUE")
    wait_until(lambda: "term" in _read(sandbox / "events.txt"))
    preempted = wait_until(
        lambda: (n := tpu_client.get_node(name=node.name)).state == tpu_v2.Node.State.PREEMPTED and n
    )
    assert preempted.health == tpu_v2.Node.Health.HEALTH_UNSPECIFIED
    assert _gone(script_pid) and _gone(watcher_pid)
    runs = wait_until(lambda: _describe(emulator_admin, "spotty")["script_runs"][0]["exit_code"] is not None)
    assert runs
    assert _describe(emulator_admin, "spotty")["script_runs"][0]["exit_code"] == 128 + signal.SIGKILL

    interval = next(i for i in emulator_admin.billing() if i["node"] == node.name)
    assert interval["end_reason"] == "preempted"
    assert interval["capacity"] == "spot"

    # A preempted node can only be deleted.
    with pytest.raises(errors.InvalidRequest):
        emulator_admin.preempt(PROJECT, ZONE, "spotty")
    finish(tpu_client.delete_node(name=node.name))


def test_only_spot_or_preemptible_nodes_can_be_preempted(tpu_client, emulator_admin, finish):
    _create(tpu_client, finish, "steady")
    with pytest.raises(errors.InvalidRequest):
        emulator_admin.preempt(PROJECT, ZONE, "steady")
    with pytest.raises(errors.NotFound):
        emulator_admin.preempt(PROJECT, ZONE, "absent")
    _create(tpu_client, finish, "cheap", scheduling_config=tpu_v2.SchedulingConfig(preemptible=True))
    emulator_admin.preempt(PROJECT, ZONE, "cheap", grace_s=0)


def test_random_preemption_hits_only_preemptible_nodes(tpu_client, emulator_admin, finish, wait_until):
    spot = _create(tpu_client, finish, "lottery", scheduling_config=tpu_v2.SchedulingConfig(spot=True))
    steady = _create(tpu_client, finish, "safe")
    emulator_admin.set_faults(preempt_rate_per_s=50.0, seed=3)
    wait_until(lambda: tpu_client.get_node(name=spot.name).state == tpu_v2.Node.State.PREEMPTED)
    assert tpu_client.get_node(name=steady.name).state == tpu_v2.Node.State.READY


def test_delete_ends_the_process_group(tpu_client, emulator, finish, wait_until):
    script = "sleep 300 &\necho $! > child.pid\necho $$ > script.pid\nwait\n"
    node = _create(tpu_client, finish, "doomed", script)
    sandbox = _sandbox(emulator, "doomed")
    wait_until(lambda: _read(sandbox / "script.pid"))
    pids = _pids(sandbox, "child.pid", "script.pid")
    assert not any(_gone(pid) for pid in pids)

    finish(tpu_client.delete_node(name=node.name))
    assert all(_gone(pid) for pid in pids)


def test_a_held_delete_stays_deleting_until_released(tpu_client, emulator, emulator_admin, finish, wait_until):
    script = "echo $$ > script.pid\nsleep 300\n"
    held = _create(tpu_client, finish, "held", script)
    free = _create(tpu_client, finish, "free", script)
    pid_file = _sandbox(emulator, "held") / "script.pid"
    wait_until(lambda: _read(pid_file))
    assert emulator_admin.set_faults(hold_deletes=["held"])["hold_deletes"] == ["held"]

    holding = tpu_client.delete_node(name=held.name)
    wait_until(lambda: all(_gone(pid) for pid in _pids(pid_file.parent, "script.pid")))
    finish(tpu_client.delete_node(name=free.name))  # the other node's delete is not held
    assert tpu_client.get_node(name=held.name).state == tpu_v2.Node.State.DELETING
    assert not holding.done()

    emulator_admin.set_faults(hold_deletes=[])
    finish(holding)
    with pytest.raises(exceptions.NotFound):
        tpu_client.get_node(name=held.name)


def test_billing_records_ready_seconds_and_survives_restart(tpu_client, emulator, emulator_admin, finish):
    node = _create(tpu_client, finish, "billed", scheduling_config=tpu_v2.SchedulingConfig(preemptible=True))
    open_interval = next(i for i in emulator_admin.billing() if i["node"] == node.name)
    assert open_interval["end"] is None
    assert open_interval["seconds"] >= 0

    finish(tpu_client.delete_node(name=node.name))
    [interval] = [i for i in emulator_admin.billing() if i["node"] == node.name]
    assert interval["node_uid"] == str(node.id)
    assert interval["zone"] == ZONE
    assert interval["accelerator_type"] == "v2-8"
    assert interval["capacity"] == "preemptible"
    assert interval["end_reason"] == "deleted"
    assert interval["seconds"] > 0
    assert interval["end_epoch"] - interval["start_epoch"] == pytest.approx(interval["seconds"])
    on_disk = json.loads((emulator.state_dir / "billing.json").read_text())
    assert [i["node_uid"] for i in on_disk] == [interval["node_uid"]]

    running = _create(tpu_client, finish, "still-up")
    control.stop(emulator.state_dir)
    restarted = control.start_background(emulator.state_dir, boot_delay_s=0.2, grace_s=2.0)
    records = {i["node"]: i for i in control.AdminClient(restarted.endpoint).billing()}
    assert records[node.name] == interval
    assert records[running.name]["end_reason"] == "emulator-shutdown"


def test_stop_leaves_no_process_behind(tpu_client, emulator, finish, wait_until):
    script = "(trap '' TERM; sleep 300) &\necho $! > child.pid\necho $$ > script.pid\nsleep 300\n"
    pids = [emulator.pid]
    for node_id in ("keep-a", "keep-b"):
        _create(tpu_client, finish, node_id, script)
        sandbox = _sandbox(emulator, node_id)
        wait_until(lambda sandbox=sandbox: _read(sandbox / "script.pid"))
        pids += _pids(sandbox, "child.pid", "script.pid")
    assert not any(_gone(pid) for pid in pids)

    assert control.stop(emulator.state_dir) is True
    assert all(_gone(pid) for pid in pids)
    assert control.status(emulator.state_dir) is None
    assert json.loads((emulator.state_dir / "process_groups.json").read_text()) == []


def test_stop_cleans_up_after_a_killed_emulator(tpu_client, emulator, finish, wait_until):
    script = "(trap '' TERM; sleep 300) &\necho $! > child.pid\nsleep 300\n"
    _create(tpu_client, finish, "orphan", script)
    sandbox = _sandbox(emulator, "orphan")
    wait_until(lambda: _read(sandbox / "child.pid"))
    [child] = _pids(sandbox, "child.pid")

    os.kill(emulator.pid, signal.SIGKILL)
    wait_until(lambda: control.status(emulator.state_dir) is None)
    assert not _gone(child)  # nothing ended it yet

    assert control.stop(emulator.state_dir) is True
    assert _gone(child)
