"""The reconcile controller end to end: real runs (the CLI, the emulator, real TF 2.9) and what goes wrong.

Runs are launched with ``tpuops train --detach`` (or declared with the library when the test
must own the first pass) and driven by ``Controller`` passes in this process, while the test
plays the cloud: stockouts, preemptions at chosen moments, a controller that dies mid-pass,
two controllers at once, budgets, and a laptop that goes away.

The experiment is digits_cnn made small (200 steps, a checkpoint every 20); the run launched
with no controller after its first pass is the uninterrupted reference that the preempted
runs must match bit for bit. The CLI's one-shot passes keep their lease until it expires, so
the lease TTL is short here (``LEASE_TTL_S``) for the test's own controller to take over.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from helpers import TF_PYTHON, TfWorld, poll, tf_world

from tpuops import runs
from tpuops.billing.cost import catalog_for, spent
from tpuops.billing.ledger import Ledger
from tpuops.controller.drive import Finished, drive
from tpuops.controller.reconcile import Controller, PassReport
from tpuops.core.errors import InvalidRequest
from tpuops.launch import jobs

pytestmark = [pytest.mark.emulator, pytest.mark.tf, pytest.mark.slow]

PROJECT = "tpuops-local"
A, B = "us-central1-a", "us-central1-b"
STEPS = 200
LEASE_TTL_S = 2.0
CHAOS_PREEMPTIONS = 8
# Preemption notice to SIGKILL. The agent checkpoints within a call (~0.2 s) of the notice; the node
# only turns PREEMPTED at the end of the grace (the startup script's max-run watchdog outlives the job).
NOTICE_S = 3.0
T = TypeVar("T")

COMPARE = """
import sys
import numpy as np
import tensorflow as tf

BOOKKEEPING = ("save_counter/.ATTRIBUTES/VARIABLE_VALUE", "_CHECKPOINTABLE_OBJECT_GRAPH")

def tensors(prefix):
    reader = tf.train.load_checkpoint(prefix)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map() if name not in BOOKKEEPING}

reference = tensors(sys.argv[1])
bad = 0
for prefix in sys.argv[2:]:
    other = tensors(prefix)
    different = sorted(set(reference) ^ set(other))
    different = different or [n for n in reference if not np.array_equal(reference[n], other[n])]
    print(prefix, len(other), "tensors;", len(different), "different:", different[:5])
    bad += bool(different)
sys.exit(1 if bad else 0)
"""


def _small_spec(text: str, *, name: str, steps: int, steps_per_call: int, every_steps: int, every_seconds: int,
                eval_every: int = 0) -> str:
    replaced = text
    for old, new in (("name: digits-cnn", f"name: {name}"), ("steps: 600", f"steps: {steps}"),
                     ("steps_per_call: 20", f"steps_per_call: {steps_per_call}"),
                     ("every_steps: 100", f"every_steps: {every_steps}"),
                     ("every_seconds: 60", f"every_seconds: {every_seconds}"), ("per_replica: 64", "per_replica: 32"),
                     ("\neval:\n", f"\neval:\n  every_steps: {eval_every}\n")):
        assert old in replaced, old
        replaced = replaced.replace(old, new)
    return replaced + "expected_hours: 0.01\n"


class World(TfWorld):
    """A working directory with data and experiments, an emulator running real TF 2.9, and helpers."""

    @property
    def small(self) -> Path:
        return self.work / "experiments" / "small.yaml"

    @property
    def sparse(self) -> Path:
        """Longer, and checkpoints only at the end and on a notice: any other one was written on the way out.

        Its status shows the step at each evaluation (every 40 steps), as nothing else writes it often.
        """
        return self.work / "experiments" / "sparse.yaml"

    def launch(self, run: str, spec: Path | None = None, *flags: str) -> None:
        """``tpuops train --detach``: declare the run and create its node in one pass."""
        done = self.tpuops("train", str(spec or self.small), "--name", run, "--detach", "--json", *flags)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"run_id": run, "detached": True}

    def declare(self, run: str, **overrides: Any) -> None:
        """Declare the run as ``train`` does, without its first pass (the test makes that one)."""
        settings = self.settings.model_copy(update=overrides)
        plan = jobs.plan_train(settings, self.small, self.store, run_id=run, base_dir=self.work)
        jobs.declare(plan, self.store, settings, lambda _text: None)

    def run_dir(self, run: str) -> Path:
        return self.work / "home" / "store" / "runs" / run

    def status(self, run: str) -> dict[str, Any]:
        status = runs.read_status(self.store, run)
        return status.model_dump(mode="json") if status else {}

    def memory(self, run: str) -> runs.Memory:
        return runs.load_memory(self.store, run)[0]

    def node(self, run: str) -> dict[str, Any] | None:
        """The emulator's view of the run's node (state, uid, pgid, preempting), None when there is none."""
        return next((n for n in self.admin.nodes() if n["name"].endswith(f"/nodes/{run}")), None)

    def creates(self) -> int:
        return self.admin.stats().get("CreateNode", 0)

    def preempt(self, run: str, grace_s: float) -> bool:
        """Preempt the run's node if it is READY; False when it was not (the moment passed)."""
        node = self.node(run)
        if node is None or node["state"] != "READY" or node["preempting"]:
            return False
        try:
            self.admin.preempt(PROJECT, node["name"].split("/")[3], run, grace_s=grace_s)
        except InvalidRequest:
            return False
        return True

    def dead(self, run: str, uid: str) -> bool:
        """Whether the node incarnation ``uid`` has stopped running (preempted, deleting or gone)."""
        node = self.node(run)
        return node is None or node["uid"] != uid or node["state"] in ("PREEMPTED", "DELETING")

    def ckpt_steps(self, run: str) -> list[int]:
        folder = self.run_dir(run) / "ckpt"
        names = os.listdir(folder) if folder.is_dir() else []
        return sorted(int(n[5:-6]) for n in names if n.startswith("ckpt-") and n.endswith(".index"))

    def same_weights(self, reference: str, *runs: str) -> subprocess.CompletedProcess[str]:
        prefixes = [str(self.run_dir(run) / "ckpt" / f"ckpt-{STEPS}") for run in (reference, *runs)]
        return subprocess.run([str(TF_PYTHON), "-c", COMPARE, *prefixes], capture_output=True, text=True,
                              check=False, timeout=120)


world = tf_world("controller", lambda source: {
    "small.yaml": _small_spec(source, name="small", steps=STEPS, steps_per_call=20, every_steps=20, every_seconds=60),
    "sparse.yaml": _small_spec(source, name="sparse", steps=600, steps_per_call=10, every_steps=0, every_seconds=0,
                               eval_every=40),
}, config=f'zones = ["{A}", "{B}"]\n', lease_ttl_s=LEASE_TTL_S, world=World)


def poll_driving(driving: Driving, check: Callable[[], T], what: str, interval_s: float = 0.05) -> T:
    """``poll`` while ``driving`` runs the controller: fail at once, with its error, if it stopped on one."""

    def checked() -> T:
        if driving.error is not None:
            raise AssertionError(f"the controller failed while waiting for {what}") from driving.error
        return check()

    return poll(checked, what, timeout_s=150, interval_s=interval_s)


@dataclass
class Driving:
    """``drive`` (what ``tpuops train`` runs) in a thread: the run's controller while the test plays the cloud."""

    controller: Controller
    run: str
    result: Finished | None = None
    error: BaseException | None = None
    statuses: list[runs.AgentStatus] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._drive, name=f"drive-{self.run}", daemon=True)
        self.thread.start()

    def _drive(self) -> None:
        try:
            self.result = drive(self.controller, self.run, poll_s=0.1, on_status=self.statuses.append)
        except BaseException as err:
            self.error = err

    def wait(self, timeout_s: float = 150) -> Finished:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), f"{self.run} did not finish within {timeout_s} s"
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


class CheckpointWatch:
    """Records the newest complete checkpoint step each time it is looked at: it may only grow.

    Complete means the agent said so (status ``last_checkpoint_step``: once a save is whole in the
    store, or the step it resumed from). A ``.index`` that is still being written when a SIGKILL lands is
    listed too; the next attempt finds it invalid and deletes it, which is no step back.
    """

    def __init__(self, world: World, run: str) -> None:
        self.world, self.run = world, run
        self.newest: list[int] = []
        self.confirmed = 0

    def look(self) -> int:
        self.confirmed = max(self.confirmed, self.world.status(self.run).get("last_checkpoint_step") or 0)
        steps = [step for step in self.world.ckpt_steps(self.run) if step <= self.confirmed]
        if steps and (not self.newest or self.newest[-1] != steps[-1]):
            self.newest.append(steps[-1])
        return self.newest[-1] if self.newest else 0

    def assert_never_went_back(self) -> None:
        assert self.newest == sorted(self.newest), f"checkpoints went backwards: {self.newest}"
        assert self.newest[-1] == STEPS


def kinds(memory: runs.Memory, *wanted: str) -> list[str]:
    return [e["kind"] for e in memory.events if not wanted or e["kind"] in wanted]


def not_billed(world: World, run: str) -> bool:
    """Whether the cost ledger has every node of the run out of READY (none accrues any more)."""
    histories = Ledger(world.settings.ledger_path).histories(PROJECT, run_id=run)
    return bool(histories) and all(h.transitions and h.transitions[-1].state != "READY" for h in histories)


def ended_cleanly(world: World, run: str, finished: Finished) -> None:
    """Succeeded at the full step count, no node left, none still billed in the cost ledger."""
    assert (finished.outcome, finished.status.step) == ("succeeded", STEPS), finished
    assert world.status(run)["exit_class"] == "succeeded"
    assert world.node(run) is None
    assert not_billed(world, run)


@pytest.fixture(scope="module")
def reference(world: World) -> str:
    """The uninterrupted run, launched with --detach and left alone: no controller after its first pass."""
    world.launch("ref")
    poll(lambda: world.status("ref").get("exit_class") and world.node("ref") is None,
         "ref to end and its node to go", timeout_s=150)
    return "ref"


def test_a_detached_run_with_no_controller_still_ends_and_deletes_its_node(world: World, reference: str) -> None:
    """The laptop is gone after ``train --detach``: the VM's dead-man's switch deletes the node."""
    status = world.status(reference)
    assert (status["exit_class"], status["step"], status["last_checkpoint_step"]) == ("succeeded", STEPS, STEPS)
    assert world.node(reference) is None
    memory = world.memory(reference)
    assert (memory.phase, kinds(memory)) == ("active", ["create"])  # nobody watched it after the first pass
    script_log = world.info.state_dir / "nodes" / PROJECT / A / reference / "startup-script.log"
    assert f"deleting node {reference} in {A}" in script_log.read_text()
    done = world.tpuops("reconcile", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["finished"].get(reference) == "succeeded"
    assert [a for a in report["acted"] if a[0] == reference] == []
    assert world.memory(reference).outcome == "succeeded"
    assert Ledger(world.settings.ledger_path).nodes(PROJECT, run_id=reference, open_only=True) == []


def test_a_stockout_at_recreate_time_moves_the_run_to_the_next_zone(world: World, reference: str) -> None:
    run = "stockout"
    creates = world.creates()
    world.launch(run)
    driving = Driving(world.controller("stockout"), run)
    node = poll_driving(driving, lambda: (n := world.node(run)) and n["state"] == "READY" and n,
                        "the first node READY")
    assert f"/locations/{A}/" in node["name"]
    try:
        world.admin.set_faults(stockout_zones=[A])
        assert world.preempt(run, grace_s=NOTICE_S)
        poll_driving(driving, lambda: (n := world.node(run)) and f"/locations/{B}/" in n["name"],
                     "a node in the next zone")
    finally:
        world.admin.clear_faults()
    finished = driving.wait()
    ended_cleanly(world, run, finished)
    memory = world.memory(run)
    assert kinds(memory, "create", "preempted", "vanished", "stockout", "finished") == \
        ["create", "preempted", "create", "stockout", "create", "finished"]
    assert [e["message"].split(" in ")[1].split(":")[0] for e in memory.events if e["kind"] == "create"] == [A, A, B]
    assert (memory.zone, memory.attempts, memory.preemptions, list(memory.blocked_zones)) == (B, 3, 1, [A])
    assert world.creates() - creates == 3


def test_a_controller_killed_after_its_create_leaves_no_duplicate_node(world: World, reference: str) -> None:
    """The pass created the node and died before writing the run's memory; a fresh controller takes over."""
    run = "killed"
    world.declare(run)
    creates = world.creates()
    report: PassReport = world.controller("dies").run_pass(only=run)
    assert report.acted == [(run, "create", A)]
    world.store.delete(runs.memory_key(run))  # as if the pass had died just before its last line
    finished = drive(world.controller("fresh"), run, poll_s=0.1, on_status=lambda _status: None)
    ended_cleanly(world, run, finished)
    assert world.creates() - creates == 1
    memory = world.memory(run)
    assert kinds(memory, "create", "adopted", "preempted", "vanished", "finished") == ["adopted", "finished"]
    assert memory.attempts == 1
    assert len({i["node_uid"] for i in world.admin.billing() if i["node"].endswith(f"/nodes/{run}")}) == 1


def test_two_controllers_at_once_only_one_acts(world: World, reference: str) -> None:
    run = "duo"
    world.declare(run)
    creates = world.creates()
    controllers = [world.controller(holder, lease_ttl_s=120.0) for holder in ("left", "right")]
    reports: dict[str, list[PassReport]] = {"left": [], "right": []}
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def loop(controller: Controller) -> None:
        try:
            barrier.wait(timeout=30)
            deadline = time.monotonic() + 150
            while time.monotonic() < deadline:
                reports[controller.leases.holder].append(controller.run_pass(only=run))
                if world.memory(run).phase == "finished" and world.node(run) is None:
                    return
                time.sleep(0.1)  # the pass interval of these two watch loops
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=loop, args=(c,)) for c in controllers]
    for thread in threads:
        thread.start()
    poll(lambda: world.status(run).get("phase") == "training" and world.preempt(run, grace_s=NOTICE_S),
         "training, to preempt it", timeout_s=150)
    for thread in threads:
        thread.join(180)
    assert not errors and not any(t.is_alive() for t in threads), errors
    acted = {holder: [a for r in passes for a in r.acted] for holder, passes in reports.items()}
    actor = "left" if acted["left"] else "right"
    other = "right" if actor == "left" else "left"
    assert acted[other] == [] and [a for a in acted[actor] if a[1] == "create"] == [(run, "create", A)] * 2
    assert all(run in r.skipped_leased for r in reports[other] if r.runs)
    assert world.creates() - creates == 2
    memory = world.memory(run)
    assert kinds(memory, "create", "preempted", "vanished", "finished") == ["create", "preempted", "create", "finished"]
    assert world.status(run)["exit_class"] == "succeeded" and world.node(run) is None


def _preempt_at(world: World, run: str, driving: Driving, ckpts: CheckpointWatch, moment: str, grace_s: float,
                after_attempt: int, at_checkpoint: int = 0) -> dict[str, Any]:
    """Wait for ``moment`` of the agent after ``after_attempt``, preempt the node then; its final status.

    The checkpoint moment is a scheduled save in flight while the steps go on, or, when the polls
    missed it (the small model's saves take milliseconds), the first look after a save was stored.
    """
    stored_at_first_look: list[int] = []

    def due() -> bool:
        ckpts.look()
        status = world.status(run)
        fresh = status.get("attempt", 0) > after_attempt and not status.get("exit_class")
        phase, step = status.get("phase"), status.get("step", 0)
        stored = status.get("last_checkpoint_step") or 0
        if moment == "boot":
            wanted = not fresh or phase in ("starting", "loading")
        elif moment == "training":
            wanted = fresh and phase == "training" and stored >= at_checkpoint
        elif moment == "checkpoint":
            if fresh and phase == "training" and not stored_at_first_look:
                stored_at_first_look.append(stored)
            wanted = bool(stored_at_first_look) and fresh and (
                status.get("checkpoint_in_flight") is not None or stored > stored_at_first_look[0])
        else:  # teardown: the last step is done, the agent evaluates and saves the model
            wanted = fresh and step == STEPS and phase in ("evaluating", "saving")
        return wanted and world.preempt(run, grace_s)

    poll_driving(driving, due, f"the {moment} moment", interval_s=0.01)
    uid = world.node(run)["uid"]
    poll_driving(driving, lambda: ckpts.look() is not None and world.dead(run, uid), "the preempted node to stop")
    return world.status(run)


def test_preemption_during_boot_training_checkpoint_and_teardown(world: World, reference: str) -> None:
    run = "moments"
    world.launch(run)
    driving = Driving(world.controller("moments"), run)
    ckpts = CheckpointWatch(world, run)
    attempt, counted = 0, 0
    for moment, grace in (("boot", NOTICE_S), ("training", NOTICE_S), ("checkpoint", 0.0), ("teardown", 0.0)):
        final = _preempt_at(world, run, driving, ckpts, moment, grace, attempt, at_checkpoint=20)
        attempt = final.get("attempt", 0)
        counted += final.get("exit_class") != "succeeded"  # killed while saving, or after it had finished
    finished = driving.wait()
    ckpts.look()
    ended_cleanly(world, run, finished)
    ckpts.assert_never_went_back()
    assert finished.memory.preemptions == counted >= 3
    compared = world.same_weights(reference, run)
    assert compared.returncode == 0, compared.stdout + compared.stderr


def test_chaos_many_preemptions_at_random_moments_end_with_identical_weights(world: World, reference: str) -> None:
    run = "chaos"
    rng = random.Random(20240501)
    world.launch(run)
    driving = Driving(world.controller("chaos"), run)
    ckpts = CheckpointWatch(world, run)
    attempt, done = 0, []
    while len(done) < CHAOS_PREEMPTIONS:
        resumed = ckpts.look()
        moment = rng.choice(["boot", "training", "checkpoint"])
        target = resumed + 20 * (rng.randint(1, 2) if moment == "training" else 1)
        if target > STEPS - 20:
            moment = "boot"  # the moment must come before the run's last checkpoint
        grace = rng.choice([0.0, NOTICE_S]) if moment == "training" else (0.0 if moment == "checkpoint" else NOTICE_S)
        final = _preempt_at(world, run, driving, ckpts, moment, grace, attempt, at_checkpoint=target)
        attempt = final.get("attempt", attempt)
        done.append((moment, grace))
    finished = driving.wait(timeout_s=120)
    ckpts.look()
    ended_cleanly(world, run, finished)
    ckpts.assert_never_went_back()
    assert finished.memory.preemptions == CHAOS_PREEMPTIONS, done
    print(f"chaos: {len(done)} preemptions {done}; checkpoints seen {ckpts.newest}")
    compared = world.same_weights(reference, run)
    assert compared.returncode == 0, compared.stdout + compared.stderr


def test_a_budget_too_small_for_the_run_is_refused_at_launch(world: World) -> None:
    creates = world.creates()
    done = world.tpuops("train", str(world.small), "--name", "broke", "--budget", "0.001")
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: run budget: projected cost $0.02 exceeds"), last
    assert "raise the budget or lower expected_hours" in last
    assert world.creates() == creates and world.node("broke") is None
    assert not world.run_dir("broke").exists()


def test_a_run_out_of_budget_is_stopped_checkpoints_on_the_way_out_and_loses_its_node(world: World) -> None:
    """The budget runs out while it trains (lowered in its record); checkpoints are only at the end or on notice."""
    run = "spender"
    world.launch(run, world.sparse, "--budget", "5")
    driving = Driving(world.controller("spender"), run)
    poll_driving(driving, lambda: world.status(run).get("phase") == "training" and world.status(run)["step"] >= 40,
                 "training past the first evaluation")
    record = runs.read_record(world.store, run)
    lowered = record.model_copy(update={"budget_usd": 1e-6})
    world.store.write_bytes(runs.record_key(run), lowered.model_dump_json().encode())
    finished = driving.wait()
    assert finished.outcome == "budget-exhausted" and finished.reason.startswith("spent $")
    assert world.node(run) is None
    # The deletion's SIGTERM made the agent checkpoint at its next call boundary. Its last status write
    # ("preempted") may not land: the emulator SIGKILLs a deleted node's processes 1 s after SIGTERM.
    status = world.status(run)
    assert status["exit_class"] in (None, "preempted"), status
    saved = status["last_checkpoint_step"]
    assert saved is not None and 40 <= saved < 600 and world.ckpt_steps(run) == [saved], status
    assert not_billed(world, run)
    ledger = Ledger(world.settings.ledger_path)
    catalog = catalog_for(world.settings)
    cost = spent(ledger, catalog, project=PROJECT, run_id=run)
    assert cost >= 1e-6
    assert spent(ledger, catalog, project=PROJECT, run_id=run) == cost  # the node is gone: no more spending


def test_a_create_refused_as_invalid_ends_the_run_failed_without_retrying(world: World) -> None:
    """v3 is not offered in us-central1-c: one clear reason, no retry, no preemption counted."""
    run = "nowhere"
    world.declare(run, zones=["us-central1-c"])
    creates = world.creates()
    controller = world.controller("nowhere")
    for _ in range(4):
        controller.run_pass(only=run)
    memory = world.memory(run)
    assert (memory.phase, memory.outcome, memory.preemptions) == ("finished", "failed", 0)
    assert "us-central1-c" in (memory.reason or "") and "v3-8" in (memory.reason or "")
    assert world.creates() - creates == 1 and world.node(run) is None


def test_sigkilled_watch_then_a_new_one_finishes_the_run_without_a_duplicate(world: World, reference: str) -> None:
    """A real ``tpuops watch`` process SIGKILLed right after it issued the create, wherever it was."""
    run = "watched"
    world.declare(run)
    creates = world.creates()
    watch = subprocess.Popen([sys.executable, "-m", "tpuops", "watch", "--interval", "0.1"], cwd=world.work,
                             env=world.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        poll(lambda: world.creates() > creates, "the watch to create the node", timeout_s=60, interval_s=0.005)
    finally:
        os.kill(watch.pid, signal.SIGKILL)
        watch.wait(10)
    finished = drive(world.controller("after-watch"), run, poll_s=0.1, on_status=lambda _status: None)
    ended_cleanly(world, run, finished)
    assert world.creates() - creates == 1
    assert finished.memory.attempts == 1
