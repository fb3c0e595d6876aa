"""Benchmark the reconcile controller on the local emulator and print one table.

    .venv/bin/python bench/bench_controller.py [--runs 200] [--quick]

Measures, side by side in one run (every figure is printed, nothing is asserted):

1. Steady reconcile passes over ``--runs`` active runs whose nodes are READY, spread over 1, 2
   and 4 zones: API calls per pass by RPC (the emulator's counts) and wall time (goal: one
   ListNodes per zone whatever the number of runs, nothing else, under 1 s), against a naive
   observer that calls GetNode once per run. The runs are written straight into the store
   (``runs/<run>/run.json`` and a live ``status.json``) and the controller creates their nodes
   in a first pass, and the passes are timed once every node runs its job. The nodes' "image
   python" is a stand-in (``stand_in_image`` in tests/helpers.py) that has TensorFlow 2.9.3 by its
   package metadata only: the startup script's checks run for real and the job sleeps where it
   would train, so hundreds of nodes cost no TensorFlow. Also: store operations per pass, the pass
   with a budget on every run (a ledger query each) and with checkpoints, logs and TensorBoard
   files under every run.
2. Recovery latency against the watch interval (0.5 s and 2 s): preemption -> PREEMPTED -> the
   replacement's CreateNode as the emulator saw it (from its billing: READY start minus the
   boot delay), on stand-in nodes under a ``tpuops watch``-style loop, a few samples each, and
   once with the startup script's max-run watchdog on; then on real TF 2.9 digits runs driven
   like ``tpuops train`` (no preemption; SIGTERM at 0.5 s; SIGKILL at 0.5 s and 2 s),
   preemption -> training resumed, the emulated boot excluded, stage by stage.
3. Steps lost per preemption: SIGTERM (the agent checkpoints on the notice) against SIGKILL
   (back to the last periodic checkpoint). The preemption comes right after a status write,
   so the step it shows is the step the job had reached (within one 20-step call).
4. Idle billed time per run: seconds a node was READY (the emulator's billing) while no
   training step ran (boot, TensorFlow import, data loading, checkpoints, teardown), from the
   phases ``status.json`` went through (polled every 20 ms), as a fraction of billed time; the
   ledger's READY time (what ``tpuops cost`` prices) against that billing; and what the startup
   script's TensorFlow version check costs on every boot.

The digits runs write their status every 0.25 s (``heartbeat_seconds``; the default is 10 s) so
that steps are seen finely: the only change to what ``tpuops train`` does. ``--quick`` takes 50
runs, 1 and 4 zones, one sample per interval and one digits run (SIGKILL), and leaves out the
watchdog and TensorFlow-import rows.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import result_file
import yaml

from tpuops import runs
from tpuops.billing.cost import catalog_for, node_cost
from tpuops.billing.ledger import Ledger
from tpuops.config import Settings
from tpuops.controller.drive import drive
from tpuops.controller.reconcile import Controller, PassReport
from tpuops.core.clock import UTC
from tpuops.core.kinds import Capacity
from tpuops.data.samples import digits
from tpuops.emulator import AdminClient, EmulatorInfo, start_background, stop
from tpuops.fleet import Fleet
from tpuops.launch.bundle import job_argv
from tpuops.launch.jobs import declare, plan_train
from tpuops.launch.provision import plan_up
from tpuops.providers.cloud_tpu.adapter import TpuApi
from tpuops.runs import NodeSpec, RunKind, RunRecord
from tpuops.store import LocalStore, ObjectInfo, Store
from tpuops.sweeps.advance import SweepStep

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from helpers import stand_in_image  # noqa: E402 - test-only helper, found through the line above

TF_PYTHON = ROOT / ".venv-tf29" / "bin" / "python"
DIGITS_SPEC = ROOT / "experiments" / "digits_cnn.yaml"
PROJECT = "tpuops-local"
V2_ZONES = ("us-central1-b", "us-central1-c", "us-central1-f", "europe-west4-a")  # the emulator's v2-8 zones
TF_ZONE = "us-central1-a"
BOOT_S = 0.5  # the emulated boot (CREATING -> READY), excluded from recovery latencies
TF_GRACE_S = 5.0
HEARTBEAT_S = 0.25
STATUS_POLL_S = 0.02
CHECKPOINT_EVERY = 400
STORE_OPS = ("reads", "writes", "lists")
LIVE_STATUS = {"command": "train", "attempt": 1, "phase": "training", "step": 100, "total_steps": 100_000,
               "exit_class": None}

Row = tuple[str, str, str, str]
T = TypeVar("T")


# -- plumbing ---------------------------------------------------------------------------------------


class CountingStore(LocalStore):
    """A LocalStore that counts its operations and their seconds, to report a pass's store traffic."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.counts: Counter[str] = Counter()
        self.seconds: Counter[str] = Counter()

    @contextlib.contextmanager
    def _op(self, kind: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.counts[kind] += 1
            self.seconds[kind] += time.perf_counter() - started

    def clear(self) -> None:
        self.counts.clear()
        self.seconds.clear()

    def read_versioned(self, key: str) -> tuple[bytes, int]:
        with self._op("reads"):
            return super().read_versioned(key)

    def write_bytes(self, key: str, data: bytes) -> int:
        with self._op("writes"):
            return super().write_bytes(key, data)

    def write_if_generation_match(self, key: str, data: bytes, generation: int) -> int:
        with self._op("writes"):
            return super().write_if_generation_match(key, data, generation)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        with self._op("lists"):
            found = super().list(prefix)
        self.counts["listed"] += len(found)
        return found


@dataclass
class World:
    """One emulator and the control plane's collaborators pointed at it."""

    info: EmulatorInfo
    settings: Settings
    store: CountingStore
    api: TpuApi
    ledger: Ledger
    admin: AdminClient

    def controller(self) -> Controller:
        fleet = Fleet(self.api, self.settings, self.ledger)
        return Controller(self.settings, self.store, fleet, billing=fleet.billing, sweeps=SweepStep())


@contextlib.contextmanager
def world(home: Path, zones: Sequence[str], emulator: dict[str, Any], **settings: Any) -> Iterator[World]:
    """Start an emulator under ``home`` and wire a store, API client and ledger to it; stop it after."""
    info = start_background(home / "emulator", **emulator)
    try:
        config = Settings(zones=list(zones), home=home, tpu_endpoint=info.endpoint, **settings)
        root = Path(config.store_root)
        root.mkdir(parents=True, exist_ok=True)
        yield World(info, config, CountingStore(root), TpuApi(PROJECT, endpoint=info.endpoint, token=info.token,
                                                                   poll_interval_s=0.05),
                    Ledger(config.ledger_path), AdminClient(info.endpoint))
    finally:
        stop(info.state_dir)


def wait_for(check: Callable[[], T], what: str, timeout_s: float = 180.0) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.05)


def seed_record(settings: Settings, store: Store, run_id: str, zone: str,
                budget_usd: float | None = None) -> RunRecord:
    """The record ``jobs.declare`` writes for a run in ``zone`` (its node request frozen in it)."""
    up = plan_up(settings, run_id, accelerator="v2-8", capacity=Capacity.SPOT, run_id=run_id,
                 job=job_argv(store.uri, "0" * 64, run_id, "train"))
    return RunRecord(run_id=run_id, kind=RunKind.TRAIN, node=NodeSpec.of(up.request, [zone]), experiment="bench",
                     bundle_sha256="0" * 64, budget_usd=budget_usd)


def seed_run(settings: Settings, store: Store, run_id: str, zone: str, budget_usd: float | None = None) -> None:
    """A run as ``jobs.declare`` leaves it (rewritten when it exists), plus the status of an agent in training."""
    record = seed_record(settings, store, run_id, zone, budget_usd)
    store.write_bytes(runs.record_key(run_id), record.model_dump_json().encode())
    runs.mark_active(store, run_id)
    store.write_bytes(runs.status_key(run_id), json.dumps({**LIVE_STATUS, "run_id": run_id}).encode())


def node_of(admin: AdminClient, run_id: str) -> dict[str, Any] | None:
    return next((n for n in admin.nodes() if n["name"].endswith(f"/nodes/{run_id}")), None)


def job_starts(node: dict[str, Any]) -> int:
    """How many times the startup script on the emulator's ``node`` (its sandbox) has started the job."""
    log = Path(node["sandbox"]) / "tpuops" / "startup.log"
    return log.read_text().count("starting the job") if log.exists() else 0


def billing_of(admin: AdminClient, run_id: str) -> list[dict[str, Any]]:
    """The run's node's READY intervals, oldest first."""
    return sorted((i for i in admin.billing() if i["node"].endswith(f"/nodes/{run_id}")),
                  key=lambda i: i["start_epoch"])


@dataclass
class Sample:
    seconds: float
    calls: dict[str, int]
    store: dict[str, int]
    store_seconds: dict[str, float]
    actions: int = 0

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())


def measure(w: World, fn: Callable[[], object]) -> Sample:
    """Run ``fn`` once; its wall time, the API calls the emulator counted and the store operations."""
    w.admin.reset_stats()
    w.store.clear()
    started = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - started
    actions = len(result.acted) if isinstance(result, PassReport) else 0
    return Sample(seconds, w.admin.stats(), dict(w.store.counts), dict(w.store.seconds), actions)


def calls_text(calls: dict[str, int]) -> str:
    return ", ".join(f"{n} {rpc}" for rpc, n in sorted(calls.items())) or "no calls"


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


# -- 1. passes against runs and zones ------------------------------------------------------------


def bulk_up_runs(root: Path, run_ids: Sequence[str]) -> int:
    """Give every run what a real one accumulates: checkpoints, log chunks, TensorBoard events. Returns files/run."""
    shard = os.urandom(64 << 10)
    files = {"spec.json": b"{}", "ckpt/checkpoint": b'model_checkpoint_path: "ckpt-300"\n',
             "tb/events.out.tfevents.1.node": os.urandom(16 << 10)}
    for step in (100, 200, 300):
        files[f"ckpt/ckpt-{step}.index"] = os.urandom(1 << 10)
        files[f"ckpt/ckpt-{step}.data-00000-of-00001"] = shard
    files.update({f"logs/{i:06d}.log": os.urandom(2 << 10) for i in range(8)})
    for run_id in run_ids:
        for name, data in files.items():
            path = root / "runs" / run_id / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    return len(files)


def get_each(api: TpuApi, placed: Sequence[tuple[str, str]]) -> None:
    """The naive observer: one GetNode per run."""
    for zone, name in placed:
        api.find_node(zone, name)


def list_each(api: TpuApi, zones: Sequence[str]) -> None:
    """What the controller's observation costs: one ListNodes per zone."""
    for zone in zones:
        api.list_nodes(zone)


def bench_passes(work: Path, runs: int, zone_counts: Sequence[int], passes: int) -> list[Row]:
    rows: list[Row] = []
    image = stand_in_image(work / "image")
    for count in zone_counts:
        zones = V2_ZONES[:count]
        home = work / f"passes-{count}"
        emulator = {"boot_delay_s": 0.05, "grace_s": 1.0, "image_python": str(image)}
        with world(home, zones, emulator, max_run_hours=0) as w:
            run_ids = [f"run-{i:04d}" for i in range(runs)]
            placed = [(zones[i % count], run_id) for i, run_id in enumerate(run_ids)]
            for zone, run_id in placed:
                seed_run(w.settings, w.store, run_id, zone)
            controller = w.controller()
            create = measure(w, controller.run_pass)
            wait_for(lambda: sum(n["state"] == "READY" and job_starts(n) > 0 for n in w.admin.nodes()) == runs,
                     f"{runs} nodes READY, running their job")
            controller.run_pass()  # notices READY once (events, progress marks)
            steady = [measure(w, controller.run_pass) for _ in range(passes)]
            naive = [measure(w, partial(get_each, w.api, placed)) for _ in range(passes)]
            listing = [measure(w, partial(list_each, w.api, zones)) for _ in range(passes)]

            rows.append((f"create pass: {runs} new runs, {count} zone(s)", f"{create.seconds:.2f} s",
                         calls_text(create.calls), f"{create.seconds / runs * 1000:.1f} ms per created node"))
            wall = [s.seconds for s in steady]
            calls = steady[-1].calls
            met = all(s.calls == {"ListNodes": count} and s.actions == 0 for s in steady) and max(wall) < 1.0
            rows.append((f"steady pass: {runs} runs, {count} zone(s)",
                         f"{median(wall):.3f} s (max {max(wall):.3f}); {calls_text(calls)}",
                         f"observing: GetNode per run {median([s.seconds for s in naive]):.3f} s "
                         f"({naive[-1].total_calls} calls) vs ListNodes per zone "
                         f"{median([s.seconds for s in listing]):.3f} s",
                         f"{'met' if met else 'MISSED'} (ListNodes = zones, no action, < 1 s); "
                         f"{sum(s.actions for s in steady)} actions in {passes} passes"))
            if count != zone_counts[-1]:
                continue
            ops, spent = steady[-1].store, steady[-1].store_seconds
            rows.append((f"store ops per steady pass ({runs} runs)",
                         ", ".join(f"{ops.get(k, 0)} {k} {spent.get(k, 0.0):.3f} s" for k in STORE_OPS),
                         f"{ops.get('listed', 0)} objects listed; ListNodes alone "
                         f"{median([s.seconds for s in listing]):.3f} s",
                         f"{ops.get('writes', 0) / runs:.2f} writes and {ops.get('reads', 0) / runs:.2f} reads/run "
                         "although nothing changed"))
            rows += budget_and_bulk(w, controller, placed, passes, median(wall))
    return rows


def budget_and_bulk(w: World, controller: Controller, placed: Sequence[tuple[str, str]], passes: int,
                    bare_s: float) -> list[Row]:
    """The same steady pass with a budget on every run, then with real-looking run folders."""
    runs = len(placed)
    for zone, run_id in placed:
        seed_run(w.settings, w.store, run_id, zone, budget_usd=1000.0)
    controller.release()
    controller = w.controller()  # run.json is read once per controller: a new one sees the budgets
    controller.run_pass()
    budget = [measure(w, controller.run_pass).seconds for _ in range(passes)]
    for zone, run_id in placed:
        seed_run(w.settings, w.store, run_id, zone)
    controller.release()
    controller = w.controller()
    controller.run_pass()
    files = bulk_up_runs(Path(w.store.uri), [run_id for _, run_id in placed])
    first = measure(w, controller.run_pass)
    bulky = [measure(w, controller.run_pass) for _ in range(passes)]
    return [
        (f"steady pass, a budget on each of {runs} runs", f"{median(budget):.3f} s",
         f"no budget: {bare_s:.3f} s",
         f"+{(median(budget) - bare_s) / runs * 1000:.1f} ms/run (ledger history query per run per pass)"),
        (f"steady pass, {runs} runs with ckpt/logs/tb ({files + 3} objects each)",
         f"{median([s.seconds for s in bulky]):.3f} s (first pass {first.seconds:.3f} s)",
         f"bare runs: {bare_s:.3f} s",
         f"lists {bulky[-1].store.get('listed', 0)} objects per pass for {runs} active runs"),
    ]


# -- 2a. preemption -> replacement CreateNode, against the watch interval ----------------------------


@contextlib.contextmanager
def watch_loop(controller: Controller, interval_s: float) -> Iterator[None]:
    """``tpuops watch --interval``: a pass, then sleep out the rest of the interval; in a thread."""
    done = threading.Event()
    failures: list[BaseException] = []

    def loop() -> None:
        try:
            while not done.is_set():
                started = time.monotonic()
                controller.run_pass()
                done.wait(max(0.0, interval_s - (time.monotonic() - started)))
        except BaseException as err:
            failures.append(err)

    thread = threading.Thread(target=loop, name="watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=60)
    if failures:
        raise failures[0]


def running_uid(admin: AdminClient, run_id: str, boots: int) -> str | None:
    """The uid of the run's READY node once its startup script has started the job for the ``boots``-th time."""
    node = node_of(admin, run_id)
    if not node or node["state"] != "READY" or node["preempting"]:
        return None
    return node["uid"] if job_starts(node) >= boots else None


def replacement(admin: AdminClient, run_id: str, uid: str, after: float) -> dict[str, Any] | None:
    """The billing interval of the node that replaced ``uid`` after ``after``, once it is READY."""
    return next((i for i in billing_of(admin, run_id) if i["node_uid"] != uid and i["start_epoch"] > after), None)


def preemptions(w: World, controller: Controller, run_id: str, interval_s: float, samples: int,
                rng: random.Random) -> list[tuple[float, float]]:
    """Preempt the run's node ``samples`` times under a watch loop: (notice -> PREEMPTED, PREEMPTED -> CreateNode)."""
    zone = w.settings.zones[0]
    seed_run(w.settings, w.store, run_id, zone)
    found = []
    with watch_loop(controller, interval_s):
        for boot in range(1, samples + 1):
            uid = wait_for(partial(running_uid, w.admin, run_id, boot), f"{run_id} running its job")
            time.sleep(rng.uniform(0.0, interval_s))  # land anywhere in the pass cycle
            notice = time.time()
            w.admin.preempt(PROJECT, zone, run_id)
            new = wait_for(partial(replacement, w.admin, run_id, uid, notice), f"{run_id} recreated")
            old = next(i for i in billing_of(w.admin, run_id) if i["node_uid"] == uid)
            found.append((old["end_epoch"] - notice, new["start_epoch"] - BOOT_S - old["end_epoch"]))
    return found


def bench_recreate(work: Path, intervals: Sequence[float], samples: int, watchdog: bool) -> list[Row]:
    rows: list[Row] = []
    rng = random.Random(7)
    grace = 5.0
    dead: list[float] = []
    emulator = {"boot_delay_s": BOOT_S, "grace_s": grace, "image_python": str(stand_in_image(work / "image"))}
    with world(work / "recreate", [V2_ZONES[0]], emulator, max_run_hours=0) as w:
        for interval in intervals:
            found = preemptions(w, w.controller(), f"lat-{int(interval * 1000)}ms", interval, samples, rng)
            to_dead, to_create = [a for a, _ in found], [b for _, b in found]
            dead += to_dead
            total = [a + b for a, b in found]
            rows.append((f"preempt -> replacement CreateNode, watch every {interval:g} s",
                         f"{median(total):.2f} s median, max {max(total):.2f} (n={samples})",
                         f"PREEMPTED after {median(to_dead):.2f} s; CreateNode {median(to_create):.2f} s later",
                         f"{median(to_create) / interval:.1f} intervals from PREEMPTED (the pass that notices it "
                         "deletes and creates)"))
        if not watchdog:
            return rows
        guarded_settings = w.settings.model_copy(update={"max_run_hours": 72.0})
        fleet = Fleet(w.api, guarded_settings, w.ledger)
        guarded = Controller(guarded_settings, w.store, fleet, billing=fleet.billing, sweeps=SweepStep())
        (to_dead, _), = preemptions(w, guarded, "lat-watchdog", intervals[0], 1, rng)
        rows.append(("preempt -> PREEMPTED, startup script with its max-run watchdog", f"{to_dead:.2f} s",
                     f"without the watchdog (max_run_hours = 0): {median(dead):.2f} s",
                     f"the emulator's grace is {grace:g} s: "
                     + ("something in the node's process group ignored SIGTERM" if to_dead >= grace else
                        "the node's process group ended on SIGTERM")))
    return rows


# -- 2b, 3, 4. real digits runs --------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    run_id: str
    interval_s: float
    kill: str | None  # None | "SIGTERM" | "SIGKILL"


@dataclass
class Observed:
    case: Case
    timeline: list[tuple[float, dict[str, Any]]] = field(default_factory=list)  # (time, status.json)
    notice: float | None = None
    seen_step: int | None = None
    billing: list[dict[str, Any]] = field(default_factory=list)
    ledger_ready_s: float = 0.0
    outcome: str = ""


def digits_spec(work: Path, steps: int, checkpoint_every: int = CHECKPOINT_EVERY) -> Path:
    """experiments/ copied with a digits spec of ``steps`` steps (the bundle is built from that folder)."""
    folder = work / "experiments"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "models.py").write_bytes((ROOT / "experiments" / "models.py").read_bytes())
    spec = yaml.safe_load(DIGITS_SPEC.read_text())
    spec["steps"] = steps
    spec["checkpoint"]["every_steps"] = checkpoint_every
    path = folder / "digits_bench.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def preempt(w: World, case: Case) -> float:
    """Preempt the run's node now; SIGKILL first kills the job so that nothing checkpoints. Returns the time."""
    if case.kill == "SIGKILL":
        node = node_of(w.admin, case.run_id)
        assert node is not None and node["pgid"], f"{case.run_id}: no live process group to kill"
        notice = time.time()
        os.killpg(node["pgid"], signal.SIGKILL)
        w.admin.preempt(PROJECT, TF_ZONE, case.run_id, grace_s=0.0)
        return notice
    notice = time.time()
    w.admin.preempt(PROJECT, TF_ZONE, case.run_id, grace_s=TF_GRACE_S)
    return notice


def run_case(w: World, work: Path, spec: Path, case: Case, preempt_at: int) -> Observed:
    """Train one digits run driven like ``tpuops train`` (drive), preempting it once past ``preempt_at``."""
    plan = plan_train(w.settings, spec, w.store, run_id=case.run_id, base_dir=work)
    plan = dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, heartbeat_seconds=HEARTBEAT_S))
    declare(plan, w.store, w.settings, lambda _text: None)
    seen = Observed(case)
    failures: list[BaseException] = []

    def drive_run() -> None:
        try:
            seen.outcome = drive(w.controller(), case.run_id, poll_s=case.interval_s, on_status=lambda _s: None).outcome
        except BaseException as err:
            failures.append(err)

    thread = threading.Thread(target=drive_run, name=f"drive-{case.run_id}", daemon=True)
    thread.start()
    status_path = Path(w.store.uri) / "runs" / case.run_id / "status.json"
    version: tuple[int, int] | None = None
    deadline = time.monotonic() + 300
    while thread.is_alive():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: run {case.run_id} did not finish within 300 s")
        with contextlib.suppress(FileNotFoundError, ValueError):
            st = status_path.stat()
            if (st.st_ino, st.st_mtime_ns) != version:
                status = json.loads(status_path.read_text())
                version = (st.st_ino, st.st_mtime_ns)
                seen.timeline.append((time.time(), status))
                if case.kill and seen.notice is None and status.get("attempt") == 1 and \
                        status.get("step", 0) >= preempt_at and not status.get("exit_class"):
                    seen.seen_step = status["step"]
                    seen.notice = preempt(w, case)
        time.sleep(STATUS_POLL_S)
    thread.join()
    if failures:
        raise failures[0]
    seen.billing = billing_of(w.admin, case.run_id)
    now = datetime.now(UTC)
    catalog = catalog_for(w.settings)
    seen.ledger_ready_s = sum(node_cost(h, catalog, now).ready_seconds
                              for h in w.ledger.histories(PROJECT, run_id=case.run_id))
    return seen


@dataclass
class Attempt:
    """One incarnation of the run's node: its READY interval and the training steps run in it."""

    ready: float
    gone: float
    agent: float | None = None  # the agent's first status (after the startup script and its TF import)
    first_step: float | None = None  # the training loop started
    last_step: float | None = None  # the last moment it was stepping
    stepping: float = 0.0

    def step(self, start: float, end: float) -> None:
        start, end = max(start, self.ready), min(end, self.gone)
        if end <= start:
            return
        self.stepping += end - start
        self.first_step = start if self.first_step is None else min(self.first_step, start)
        self.last_step = end if self.last_step is None else max(self.last_step, end)

    @property
    def startup(self) -> float:
        return (self.gone if self.first_step is None else self.first_step) - self.ready

    @property
    def tail(self) -> float:
        return 0.0 if self.last_step is None else self.gone - self.last_step

    @property
    def pauses(self) -> float:
        return 0.0 if self.first_step is None or self.last_step is None else \
            self.last_step - self.first_step - self.stepping


@dataclass
class Figures:
    """What one observed run says about idle billed time, recovery and lost steps."""

    attempts: list[Attempt]
    resumed_from: int = 0
    agent_exit_s: float | None = None  # notice -> the agent reported its exit (SIGTERM)
    notice_s: float = 0.0  # notice -> PREEMPTED
    to_create_s: float = 0.0  # PREEMPTED -> CreateNode
    ready_to_training_s: float = 0.0
    to_first_step_s: float = 0.0
    resumed_s: float = 0.0  # notice -> first step reported after the resume, boot excluded
    steps_per_s: float = 0.0

    @property
    def billed_s(self) -> float:
        return sum(a.gone - a.ready for a in self.attempts)

    @property
    def idle_s(self) -> float:
        return self.billed_s - sum(a.stepping for a in self.attempts)

    def idle_text(self) -> str:
        startup = sum(a.startup for a in self.attempts)
        to_agent = sum((a.agent or a.ready) - a.ready for a in self.attempts)
        pauses = sum(a.pauses for a in self.attempts)
        preempted = sum(a.tail for a in self.attempts[:-1])
        return (f"startup {startup:.1f} s in {len(self.attempts)} boot(s) (READY -> agent status {to_agent:.1f} s, "
                f"loading {startup - to_agent:.1f} s), checkpoints/eval {pauses:.1f} s, preemption notice "
                f"{preempted:.1f} s, after the last step {self.attempts[-1].tail:.1f} s")


def analyse(seen: Observed) -> Figures:
    """Cut the status timeline into training and idle time per node incarnation, and time the recovery."""
    attempts = [Attempt(iv["start_epoch"], iv["end_epoch"]) for iv in seen.billing]
    ends = [t for t, _ in seen.timeline[1:]] + [attempts[-1].gone]
    for (t, status), end in zip(seen.timeline, ends, strict=True):
        number = int(status.get("attempt") or 1)
        if number <= len(attempts) and attempts[number - 1].agent is None:
            attempts[number - 1].agent = t
        if status.get("phase") == "training" and number <= len(attempts):
            killed = number == 1 and seen.case.kill == "SIGKILL" and seen.notice is not None
            attempts[number - 1].step(t, min(end, seen.notice) if killed else end)
    figures = Figures(attempts)
    if seen.notice is None or len(attempts) < 2 or attempts[1].first_step is None:
        return figures
    resumed = [(t, s) for t, s in seen.timeline if s.get("attempt") == 2]
    figures.resumed_from = next((int(s["resumed_from_step"]) for _, s in resumed
                                 if s.get("resumed_from_step") is not None), 0)
    first_step = next(t for t, s in resumed if int(s.get("step") or 0) > figures.resumed_from)
    exited = next((t for t, s in seen.timeline if s.get("attempt") == 1 and s.get("exit_class")), None)
    figures.agent_exit_s = None if exited is None else exited - seen.notice
    figures.notice_s = attempts[0].gone - seen.notice
    figures.to_create_s = attempts[1].ready - BOOT_S - attempts[0].gone
    figures.ready_to_training_s = attempts[1].first_step - attempts[1].ready
    figures.to_first_step_s = first_step - attempts[1].first_step
    figures.resumed_s = first_step - seen.notice - BOOT_S
    before = next(s for _, s in reversed(seen.timeline) if s.get("attempt") == 1 and s.get("examples_per_sec"))
    figures.steps_per_s = before["examples_per_sec"] / before["global_batch"]
    return figures


def tf_import_rows() -> list[Row]:
    """What the startup script pays on every boot to learn the TensorFlow version, against a metadata lookup."""
    def wall(code: str) -> float:
        started = time.perf_counter()
        subprocess.run([str(TF_PYTHON), "-c", code], check=True, capture_output=True)
        return time.perf_counter() - started

    imported = wall("import tensorflow as tf; print(tf.__version__)")
    lookup = wall("import importlib.metadata as m\n"
                  "for name in ('tensorflow', 'tensorflow-cpu', 'tensorflow-tpu'):\n"
                  "    try:\n        print(m.version(name)); break\n"
                  "    except m.PackageNotFoundError:\n        pass\n")
    return [("TF version check in the startup script (every boot)", f"{imported:.2f} s (import tensorflow)",
             f"{lookup:.2f} s (importlib.metadata)",
             f"{imported / lookup:.0f}x; the agent then imports TensorFlow again")]


def bench_digits(work: Path, cases: Sequence[Case], steps: int, preempt_at: int, import_check: bool) -> list[list[Row]]:
    digits(work / "data" / "digits", overwrite=True)
    spec = digits_spec(work, steps)
    emulator = {"boot_delay_s": BOOT_S, "grace_s": TF_GRACE_S, "image_python": str(TF_PYTHON)}
    with world(work / "digits", [TF_ZONE], emulator) as w:
        observed = [run_case(w, work, spec, case, preempt_at) for case in cases]
    recovery: list[Row] = []
    lost: list[Row] = []
    idle: list[Row] = []
    by_kill: dict[str, list[int]] = {}
    for seen in observed:
        case, f = seen.case, analyse(seen)
        label = f"{case.kill or 'no preemption'}, drive every {case.interval_s:g} s"
        idle.append((f"idle billed: digits {steps} steps, {label}",
                     f"{f.idle_s:.1f} s of {f.billed_s:.1f} s billed ({f.idle_s / f.billed_s:.0%})", f.idle_text(),
                     f"{seen.outcome}; ledger READY {seen.ledger_ready_s:.1f} s = "
                     f"{seen.ledger_ready_s / f.billed_s:.2f}x billing"))
        if seen.notice is None or seen.seen_step is None:
            continue
        exited = "" if f.agent_exit_s is None else f"agent exited +{f.agent_exit_s:.1f} s, "
        recovery.append((f"preempt -> training resumed, {label}", f"{f.resumed_s:.1f} s (boot {BOOT_S:g} s excluded)",
                         f"{exited}PREEMPTED +{f.notice_s:.2f} s, CreateNode +{f.to_create_s:.2f} s, READY -> "
                         f"training loop {f.ready_to_training_s:.1f} s, first step +{f.to_first_step_s:.1f} s",
                         f"CreateNode {f.to_create_s / case.interval_s:.1f} intervals after PREEMPTED"))
        steps_lost = max(0, seen.seen_step - f.resumed_from)
        by_kill.setdefault(case.kill or "", []).append(steps_lost)
        lost.append((f"steps lost: {label}", f"{steps_lost} steps ({steps_lost / f.steps_per_s:.1f} s of training)",
                     f"step {seen.seen_step} when preempted, resumed from {f.resumed_from}",
                     "checkpoint on the notice" if case.kill == "SIGTERM" else
                     f"last periodic checkpoint (every {CHECKPOINT_EVERY} steps)"))
    if "SIGTERM" in by_kill and "SIGKILL" in by_kill:
        term, kill = statistics.mean(by_kill["SIGTERM"]), statistics.mean(by_kill["SIGKILL"])
        lost.append(("steps lost per preemption, mean", f"SIGTERM {term:.0f}", f"SIGKILL {kill:.0f}",
                     f"expected SIGKILL loss ~ {CHECKPOINT_EVERY // 2} (half a checkpoint interval)"))
    return [recovery, lost, idle + (tf_import_rows() if import_check else [])]


# -- main -----------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=None, help="active runs per pass (default 200, quick 50)")
    parser.add_argument("--quick", action="store_true", help="fewer runs, zones, samples and digits runs (< 1 min)")
    result_file.add_argument(parser)
    args = parser.parse_args()
    measuring = result_file.Run("bench_controller")
    quick = args.quick
    runs = args.runs or (50 if quick else 200)
    zone_counts = (1, 4) if quick else (1, 2, 4)
    passes = 3
    samples = 1 if quick else 4
    steps, preempt_at = (800, 600) if quick else (1200, 600)
    cases = [Case("digits-kill-500ms", 0.5, "SIGKILL")] if quick else [
        Case("digits-clean", 0.5, None), Case("digits-term-500ms", 0.5, "SIGTERM"),
        Case("digits-kill-500ms", 0.5, "SIGKILL"), Case("digits-kill-2000ms", 2.0, "SIGKILL"),
    ]

    started = time.monotonic()
    sections: list[list[Row]] = []
    with tempfile.TemporaryDirectory(prefix="bench-controller-") as tmp:
        work = Path(tmp)
        parts: list[tuple[str, Callable[[], list[list[Row]]]]] = [
            ("passes", lambda: [bench_passes(work, runs, zone_counts, passes)]),
            ("recreate", lambda: [bench_recreate(work, (0.5, 2.0), samples, watchdog=not quick)]),
            ("digits", lambda: bench_digits(work, cases, steps, preempt_at, import_check=not quick)),
        ]
        for name, part in parts:
            began = time.monotonic()
            sections += part()
            print(f"bench: {name} took {time.monotonic() - began:.0f} s", file=sys.stderr)

    if args.result:
        measuring.write({"runs": runs, "passes": passes, "quick": quick}, [result_file.Table(
            f"{runs} runs, {passes} passes each; emulated boot {BOOT_S:g} s; digits runs heartbeat {HEARTBEAT_S:g} s.",
            ["measure", "tpuops", "baseline / breakdown", "goal / note"],
            [list(row) for section in sections for row in section])])
    from rich.console import Console
    from rich.table import Table

    table = Table(title="tpuops reconcile controller on the local emulator",
                  caption=f"{runs} runs, {passes} passes each; emulated boot {BOOT_S:g} s; digits runs heartbeat "
                          f"{HEARTBEAT_S:g} s; total {time.monotonic() - started:.0f} s")
    for column in ("measure", "tpuops", "baseline / breakdown", "goal / note"):
        table.add_column(column)
    for section in sections:
        for row in section:
            table.add_row(*row)
        table.add_section()
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
