"""Stop means stop, end to end: the CLI, the emulator, the startup script, real TF 2.9 (issue 30, item 1).

The reproduction: ``train RUN`` following its run, then ``tpuops down --all --yes``. It used to print "deleted",
exit 0, and within seconds the controller made the node again ("vanished (preemption 1)"), billed to the end.
Now the down stops the run: the agent checkpoints on its node's notice, the node goes once, no pass makes it
again, nothing counts a preemption, and ``train --resume`` goes on from that checkpoint. Money is read from the
emulator's billing record (node counts, every interval closed), never from wall time.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import TfWorld, poll, run_dir, run_status, start_cli, tf_world

from tests.controller.test_controller_e2e import _small_spec
from tpuops.emulator.control import AdminClient, EmulatorInfo

pytestmark = [pytest.mark.emulator, pytest.mark.tf, pytest.mark.slow]

ZONE = "us-central1-a"
STEPS = 30000  # a minute or more of training: a stop (seconds) lands long before the end, whatever the load


# The digits project, with ``sparse.yaml``: it checkpoints only at the end and on a notice, so any other
# checkpoint was written on the way out.
world = tf_world("stop", lambda source: {"digits_cnn.yaml": source, "sparse.yaml": _small_spec(
    source, name="sparse", steps=STEPS, steps_per_call=10, every_steps=0, every_seconds=0, eval_every=40)})



def _start(work: Path, info: EmulatorInfo, *args: str) -> subprocess.Popen[str]:
    return start_cli(work, info, *args)


def _tpuops(work: Path, info: EmulatorInfo, *args: str, timeout: float = 300) -> tuple[int, str, str]:
    proc = _start(work, info, *args)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def _ckpt_steps(work: Path, run: str) -> list[int]:
    folder = run_dir(work, run) / "ckpt"
    return sorted(int(n[5:-6]) for n in os.listdir(folder) if n.startswith("ckpt-") and n.endswith(".index"))


def _memory(work: Path, run: str) -> dict:
    return json.loads((run_dir(work, run) / "memory.json").read_text())


def _billed(info: EmulatorInfo, run: str) -> list[dict]:
    """The run's node's READY intervals in the emulator's billing record: one per node it ever had."""
    return [i for i in AdminClient(info.endpoint).billing() if i["node"].endswith(f"/nodes/{run}")]


def _listed(info: EmulatorInfo, run: str) -> list[dict]:
    return [n for n in AdminClient(info.endpoint).nodes() if n.get("name", "").endswith(f"/{run}")]


def _never_made_again(work: Path, info: EmulatorInfo, run: str, nodes: int) -> None:
    """Passes after the stop make no node: the billing record still holds ``nodes`` intervals, all closed."""
    for _ in range(3):
        code, _, err = _tpuops(work, info, "reconcile", "--no-wake")
        assert code == 0, err
    assert _listed(info, run) == []
    billed = _billed(info, run)
    assert len(billed) == nodes and all(i["end"] is not None for i in billed), billed


def test_down_of_a_followed_run_stops_it_for_good_and_resume_goes_on_from_its_checkpoint(
        world: TfWorld) -> None:
    work, info = world.work, world.info
    run = "downed"
    train = _start(work, info, "train", str(work / "experiments" / "sparse.yaml"), "--name", run, "--json")
    poll(lambda: run_status(work, run).get("phase") == "training" and run_status(work, run)["step"] >= 40,
         "training past the first evaluation", timeout_s=240)
    code, out, err = _tpuops(work, info, "down", "--all", "--yes", "--json")
    assert code == 0, err
    assert json.loads(out)["results"] == [{"name": run, "zone": ZONE, "outcome": "run stopped"}]
    _, err = train.communicate(timeout=120)
    assert train.returncode == 3 and "stopped on request" in err and "error" not in err, err  # issue 38

    # The delete's SIGTERM made the agent checkpoint at its next call boundary (the only way this spec saves
    # before its end); its last status write may not land: the emulator SIGKILLs a deleted node 1 s after SIGTERM.
    status = run_status(work, run)
    assert status["exit_class"] in (None, "stopped"), status  # a stop's notice, not a preemption's
    [saved] = _ckpt_steps(work, run)
    assert 40 <= saved < STEPS
    memory = _memory(work, run)
    assert (memory["outcome"], memory["preemptions"], memory["crashes"], memory["attempts"]) == (
        "stopped", 0, 0, 1)
    assert not {e["kind"] for e in memory["events"]} & {"preempted", "vanished"}
    _never_made_again(work, info, run, nodes=1)
    code, out, err = _tpuops(work, info, "risk", "--json")
    assert code == 0, err
    assert sum(r["preemptions"] for r in json.loads(out)["risks"]) == 0

    code, out, err = _tpuops(work, info, "train", "--resume", run, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert (result["exit_class"], result["step"], result["preemptions"]) == ("succeeded", STEPS, 0)
    assert run_status(work, run)["resumed_from_step"] == saved  # from the checkpoint of its stop
    _never_made_again(work, info, run, nodes=2)


def test_down_without_yes_refuses_in_one_line_and_stop_stops_a_run_nobody_follows(
        world: TfWorld) -> None:
    work, info = world.work, world.info
    run = "detached"  # the long job: the short one could finish, under load, before the commands below reach it
    code, _, err = _tpuops(work, info, "train", str(work / "experiments" / "sparse.yaml"), "--name", run,
                           "--detach")
    assert code == 0, err
    poll(lambda: any(n["state"] == "READY" for n in _listed(info, run)), "the run's node READY", timeout_s=120)

    code, out, err = _tpuops(work, info, "down", run)
    assert code == 2 and out == ""
    [line] = [line for line in err.splitlines() if line.startswith("error: ")]
    assert err.splitlines()[-1] == line and f"tpuops stop {run}" in line and "nothing deleted" in line
    assert [n["state"] for n in _listed(info, run)] == ["READY"]

    code, out, err = _tpuops(work, info, "stop", run, "--dry-run", "--json")
    assert code == 0, err
    [would] = json.loads(out)["runs"]
    assert (would["run_id"], would["would_stop"], would["outcome"], would["node"]) == (run, True, None, run)
    code, out, err = _tpuops(work, info, "stop", run, "--json")
    assert code == 0, err
    assert json.loads(out)["runs"] == [{"run_id": run, "outcome": "stopped", "already": False, "node_gone": True,
                                        "requested": False, "trouble": None}]
    memory = _memory(work, run)
    assert (memory["outcome"], memory["preemptions"], memory["attempts"]) == ("stopped", 0, 1)
    _never_made_again(work, info, run, nodes=1)
    code, out, err = _tpuops(work, info, "stop", run)
    assert code == 0 and "ended already (stopped)" in err, err



def test_a_node_deleted_outside_tpuops_is_a_bounded_restart_never_a_preemption(
        world: TfWorld) -> None:
    """Deleted by another client (as an agent that failed on an unwritable store has its node delete itself):
    gone without being seen PREEMPTED. Each time is a restart from the checkpoint, counted as a crash; past
    ``max_restarts`` (3) the run ends crashed, so the billing record holds 4 nodes, not an endless line of them."""
    from tpuops.providers.base import wait_for
    from tpuops.providers.cloud_tpu.adapter import TpuApi

    work, info = world.work, world.info
    run = "deleted-outside"
    cloud = TpuApi("tpuops-local", endpoint=info.endpoint, token=info.token, poll_interval_s=0.05)
    code, _, err = _tpuops(work, info, "train", str(work / "experiments" / "sparse.yaml"), "--name", run,
                           "--detach")  # the long job: the short one could end, under load, between two deletes
    assert code == 0, err
    seen: set[str] = set()
    for _ in range(4):
        node = poll(lambda: next((n for n in _listed(info, run) if n["state"] == "READY" and n["uid"] not in seen),
                                 None), "a new node of the run READY", timeout_s=120)
        seen.add(node["uid"])
        operation = cloud.delete_node(ZONE, run)
        assert operation is not None
        wait_for(cloud, operation, timeout_s=60)
        for _ in range(2):  # a node missing for two passes is gone, not a lagging listing
            code, _, err = _tpuops(work, info, "reconcile", "--no-wake")
            assert code == 0, err
    memory = _memory(work, run)
    assert (memory["outcome"], memory["preemptions"], memory["crashes"], memory["attempts"]) == (
        "crashed", 0, 4, 4), memory["events"]
    assert [e["kind"] for e in memory["events"] if e["kind"] in ("vanished", "preempted")] == ["vanished"] * 3
    _never_made_again(work, info, run, nodes=4)
