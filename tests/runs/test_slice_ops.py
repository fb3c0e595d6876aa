"""A pod slice is recovered, shown and reached as one thing: the CLI, the emulator's 4 workers, real TF 2.9.

A v2-32 (4 hosts, each a worker with its own address, directory, metadata server and TF runtime) runs the digits
job (on worker 0). A worker's runtime killed mid-run leaves the slice READY and unhealthy: ``tpuops watch``,
with nobody acting, recreates it after ``unhealthy_grace_s`` as a restart naming the worker, and the run
finishes. A slice preempted mid-run comes back the same way, counted as a preemption. Nodes left and billed
seconds are read from the emulator, never from wall time.

Every worker ships its own log to the store (worker 0's agent, the others ``templates/ship_log.py``): after a
slice preemption and after a stop, ``logs RUN --worker N`` gives each worker's whole log, every boot of it (the
emulator's recreated worker appends to the same file, so the store must hold exactly that file's lines), and
``--worker all`` all four.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TfWorld, cli_env, poll, run_dir, run_status, tf_world

from tests.controller.test_controller_e2e import _small_spec
from tpuops.emulator.control import AdminClient, EmulatorInfo

pytestmark = [pytest.mark.emulator, pytest.mark.tf, pytest.mark.slow]

ZONE = "us-central1-a"  # of the two configured zones, the one that offers v2-32
STEPS = 1200
GRACE_S = 3.0


world = tf_world("slice", lambda source: {"pod.yaml": _small_spec(
    source, name="pod", steps=STEPS, steps_per_call=10, every_steps=50, every_seconds=0).replace(
        "accelerator: v3-8", "accelerator: v2-32")}, grace_s=5.0)


def _env(work: Path, info: EmulatorInfo) -> dict[str, str]:
    return {**cli_env(work, info), "TPUOPS_UNHEALTHY_GRACE_S": str(GRACE_S)}


def _tpuops(work: Path, info: EmulatorInfo, *args: str, timeout: float = 300) -> tuple[int, str, str]:
    done = subprocess.run([sys.executable, "-m", "tpuops", *args], cwd=work, env=_env(work, info),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, check=False)
    return done.returncode, done.stdout, done.stderr


def _watch(work: Path, info: EmulatorInfo) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tpuops", "watch", "--interval", "1"], cwd=work,
                            env=_env(work, info), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _memory(work: Path, run: str) -> dict:
    path = run_dir(work, run) / "memory.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _listed(info: EmulatorInfo, run: str) -> list[dict]:
    return [n for n in AdminClient(info.endpoint).nodes() if n.get("name", "").endswith(f"/{run}")]


def _billed(info: EmulatorInfo, run: str) -> list[dict]:
    return [i for i in AdminClient(info.endpoint).billing() if i["node"].endswith(f"/nodes/{run}")]


def _training(work: Path, run: str, past: int) -> bool:
    status = run_status(work, run)
    return status.get("phase") == "training" and status.get("step", 0) >= past


def _sandbox_log(info: EmulatorInfo, run: str, worker: int) -> list[str]:
    """The startup log a worker of the run's slice kept on its own disk, every boot of it."""
    home = info.state_dir / "nodes" / "tpuops-local" / ZONE / (run if worker == 0 else f"{run}.w{worker}")
    return (home / "tpuops" / "startup.log").read_text().splitlines()


def _assert_every_worker_shipped(work: Path, info: EmulatorInfo, run: str, boots: int) -> list[str]:
    """Each worker's log, read back with ``logs --worker N``, is the whole of what it logged; worker 0's (the
    agent's) lines; ``--worker all`` holds all four."""
    for worker in (1, 2, 3):
        code, out, err = _tpuops(work, info, "logs", run, "--worker", str(worker))
        assert code == 0, err
        assert out.splitlines() == _sandbox_log(info, run, worker), f"worker {worker}'s log, shipped whole"
        assert sum(f"worker {worker} booted with TensorFlow" in line for line in out.splitlines()) == boots
    code, out, err = _tpuops(work, info, "logs", run, "--worker", "all")
    assert code == 0, err
    assert {line.split(" ", 1)[0] for line in out.splitlines()} == {"[w0]", "[w1]", "[w2]", "[w3]"}
    code, out, err = _tpuops(work, info, "logs", run, "--worker", "0")
    assert code == 0, err
    return out.splitlines()


def _run_through(work: Path, info: EmulatorInfo, run: str, act: str) -> dict:
    """Start the run detached, let ``watch`` drive it, do ``act`` to its slice mid-training; its memory at the end."""
    code, _, err = _tpuops(work, info, "train", str(work / "experiments" / "pod.yaml"), "--name", run, "--detach")
    assert code == 0, err
    watch = _watch(work, info)
    try:
        poll(lambda: _training(work, run, 100), "the slice's run training past step 100", timeout_s=300)
        [node] = _listed(info, run)
        assert len(node["workers"]) == 4
        code, out, err = _tpuops(work, info, "status", "--json")
        assert code == 0, err
        [shown] = [n for n in json.loads(out)["nodes"] if n["name"] == run]
        assert (shown["hosts"], shown["unhealthy_workers"]) == (4, [])
        admin = AdminClient(info.endpoint)
        if act == "kill-runtime":
            admin.set_faults(kill_runtimes=[f"{run}/2"])
        else:
            admin.preempt("tpuops-local", ZONE, run, grace_s=2.0)
        poll(lambda: _memory(work, run).get("phase") == "finished", "the run to finish", timeout_s=600)
    finally:
        watch.terminate()
        _, err = watch.communicate(timeout=60)
    memory = _memory(work, run)
    assert memory["outcome"] == "succeeded", (memory["events"], err[-2000:])
    assert run_status(work, run)["step"] == STEPS
    poll(lambda: _listed(info, run) == [], "no node of the run left", timeout_s=60)
    billed = _billed(info, run)
    assert len(billed) == 2 and all(i["end"] is not None for i in billed), billed
    return memory


def test_a_worker_whose_runtime_dies_gets_the_slice_recreated_and_the_run_finishes(
        world: TfWorld) -> None:
    """The job computes on every worker, so a dead runtime ends its attempt one of two ways, both a bounded
    restart on a new slice, never a preemption: TensorFlow's client fails its next step (the agent exits
    crashed), or it waits on the dead worker and the controller sees the worker unhealthy past the grace."""
    work, info = world.work, world.info
    memory = _run_through(work, info, "pod-sick", "kill-runtime")
    kinds = [e["kind"] for e in memory["events"]]
    assert "crash" in kinds or "unhealthy" in kinds, kinds
    if "unhealthy" in kinds:
        assert "worker-down" in kinds
        [restart] = [e["message"] for e in memory["events"] if e["kind"] == "unhealthy"]
        assert "worker 2 of the slice unhealthy" in restart
    assert (memory["crashes"], memory["preemptions"], memory["attempts"]) == (1, 0, 2)


def test_a_preempted_slice_is_recovered_by_watch_with_nobody_acting(world: TfWorld) -> None:
    work, info = world.work, world.info
    memory = _run_through(work, info, "pod-preempted", "preempt")
    assert (memory["preemptions"], memory["crashes"], memory["attempts"]) == (1, 0, 2)
    assert run_status(work, "pod-preempted")["resumed_from_step"] >= 100
    agent = _assert_every_worker_shipped(work, info, "pod-preempted", boots=2)
    assert [a for a in (1, 2) if any(f", attempt {a}, pid" in line for line in agent)] == [1, 2]


def test_a_stopped_slice_keeps_every_attempts_log_of_every_worker(world: TfWorld) -> None:
    """Preempted, recovered, then stopped while its second attempt trains: nothing of either attempt is lost."""
    work, info = world.work, world.info
    run = "pod-stopped"
    code, _, err = _tpuops(work, info, "train", str(work / "experiments" / "pod.yaml"), "--name", run, "--detach")
    assert code == 0, err
    watch = _watch(work, info)
    try:
        poll(lambda: _training(work, run, 100), "the slice's run training past step 100", timeout_s=300)
        AdminClient(info.endpoint).preempt("tpuops-local", ZONE, run, grace_s=2.0)
        poll(lambda: run_status(work, run).get("attempt") == 2 and _training(work, run, 150),
             "attempt 2 training past step 150", timeout_s=600)
        code, _, err = _tpuops(work, info, "stop", run)
        assert code == 0, err
        poll(lambda: _memory(work, run).get("phase") == "finished", "the stopped run to finish", timeout_s=300)
        poll(lambda: _listed(info, run) == [], "no node of the run left", timeout_s=60)
    finally:
        watch.terminate()
        _, err = watch.communicate(timeout=60)
    assert _memory(work, run)["outcome"] == "stopped", err[-2000:]
    agent = _assert_every_worker_shipped(work, info, run, boots=2)
    assert [a for a in (1, 2) if any(f", attempt {a}, pid" in line for line in agent)] == [1, 2]
