"""Sweeps end to end on the emulator with real TF 2.9 trials, advanced only by reconcile passes (as cron would).

The experiment is digits_cnn made small (60 steps, an evaluation and a checkpoint every 20 steps;
300 for the pruning test, so that a pruned trial has something left to do, and 100,000 for the budget test and
the endgame's promotion, whose sweeps are ended by the budget or stopped).
``tpuops sweep start`` declares the sweep and makes the first pass; then the test runs passes
(the library's ``Controller.run_pass`` in this process, and real ``tpuops reconcile``
processes) until the sweep ends, while it plays the cloud: preemptions with and without notice.
"""

from __future__ import annotations

import itertools
import json
import random
import shutil
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from helpers import TfWorld, digits_project, poll, small_digits, tf_world

from tpuops import runs
from tpuops.billing.cost import catalog_for, node_cost, ready_intervals, spent
from tpuops.billing.ledger import Ledger
from tpuops.contract.exits import ExitClass
from tpuops.controller.reconcile import Controller
from tpuops.core.clock import UTC
from tpuops.core.errors import InvalidRequest
from tpuops.providers.nodes import NodeState
from tpuops.sweeps import ops as sweep_ops
from tpuops.sweeps.status import SweepStatus, sweep_status

pytestmark = [pytest.mark.emulator, pytest.mark.tf, pytest.mark.slow]

PROJECT = "tpuops-local"
A, B = "us-central1-a", "us-central1-b"
STEPS = 60
MEDIUM = 300
ELASTIC = 120  # steps of an elastic trial: a few seconds on either size
LEASE_TTL_S = 2.0

SWEEP = """
name: {name}
experiment: ../experiments/small.yaml
space:
  learning_rate: {{type: float, low: 0.001, high: 0.02, log: true}}
  filters: {{type: categorical, choices: [8, 16]}}
objective: {{metric: accuracy, direction: maximize}}
sampler: {{type: tpe, seed: 11, startup_trials: 4}}
trials: 3
parallel: 2
eval_every_steps: 20
pruner: {{type: {pruner}, startup_trials: 2, warmup_steps: 20}}
"""


class World(TfWorld):
    def sweep_file(self, name: str, text: str) -> Path:
        path = self.work / "sweeps" / f"{name}.yaml"
        path.write_text(text)
        return path

    def start(self, path: Path) -> dict[str, Any]:
        done = self.tpuops("sweep", "start", str(path), "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def status(self, sweep: str) -> SweepStatus:
        return sweep_status(self.settings, self.store, Ledger(self.settings.ledger_path),
                            sweep_ops.read_sweep(self.store, sweep))

    def phase(self, sweep: str) -> str:
        return sweep_ops.load_state(self.store, sweep)[0].phase

    def nodes(self, sweep: str) -> list[dict[str, Any]]:
        return [n for n in self.admin.nodes() if f"/nodes/{sweep}-t" in n["name"]]

    def run_ids(self, sweep: str) -> list[str]:
        return sorted({o.key.split("/")[1] for o in self.store.list("runs/")
                       if o.key.startswith(f"runs/{sweep}-t") and o.key.endswith("/run.json")})

    def drive(self, sweep: str, controller: Controller, timeout_s: float = 240, every: int = 0) -> int:
        """Passes until the sweep ends and its nodes are gone; every ``every``-th pass a real ``tpuops reconcile``."""
        passes = 0
        deadline = time.monotonic() + timeout_s
        while not (self.phase(sweep) == "finished" and not self.nodes(sweep)):
            assert time.monotonic() < deadline, f"sweep {sweep} did not end within {timeout_s} s"
            passes += 1
            if every and passes % every == 0:
                controller.release()
                done = self.tpuops("reconcile", "--json")
                assert done.returncode == 0, done.stderr
            else:
                controller.run_pass()
            time.sleep(0.2)  # the pass interval (cron's would be minutes)
        controller.release()
        return passes


def _project(work: Path) -> str:
    """The digits project and an empty ``sweeps/`` for the tests' sweep files."""
    (work / "sweeps").mkdir()
    return digits_project(work)


world = tf_world("sweeps", lambda source: {
    "small.yaml": small_digits(source),
    "medium.yaml": small_digits(source, steps=MEDIUM).replace("name: small", "name: medium"),
    "long.yaml": small_digits(source, steps=100000, expected_hours=0.002).replace("name: small", "name: long"),
    "elastic.yaml": small_digits(source, steps=ELASTIC).replace("name: small", "name: elastic").replace(
        "per_replica: 32", "per_replica: 8").replace("accelerator: v3-8",
                                                    "accelerator: [v2-32, v2-8]\nelastic:\n  probe_every: 1s"),
}, layout=_project, config=f'zones = ["{A}", "{B}"]\nstockout_backoff_s = 1\n[prices.v3]\nspot = 900.0\n',  # v3-8: $1/s
    lease_ttl_s=LEASE_TTL_S, world=World)


def _reported(world: World, run_id: str) -> float:
    status = runs.read_status(world.store, run_id)
    assert status is not None
    return float(status.metrics["eval"]["accuracy"])


@pytest.fixture(scope="module")
def uninterrupted(world: World) -> SweepStatus:
    """The digits sweep driven to its end by passes alone (a real 'tpuops reconcile' every third one)."""
    started = world.start(world.sweep_file("quiet", SWEEP.format(name="quiet", pruner="median")))
    assert started["launched"] == ["quiet-t0000", "quiet-t0001"]
    assert started["advanced_by"] == "tpuops reconcile"
    world.drive("quiet", world.controller("quiet"), every=3)
    return world.status("quiet")


def test_the_digits_sweep_ends_driven_only_by_reconcile_passes(world: World, uninterrupted: SweepStatus) -> None:
    result = uninterrupted
    assert (result.phase, result.outcome) == ("finished", "completed")
    assert [t.number for t in result.trials] == [0, 1, 2]
    assert {t.state for t in result.trials} <= {"COMPLETE", "PRUNED"} and result.counts["COMPLETE"] >= 2
    assert world.run_ids("quiet") == [f"quiet-t000{n}" for n in range(3)]
    assert world.nodes("quiet") == []
    assert len({trial.params["learning_rate"] for trial in result.trials}) == 3  # each trial drew its own
    for trial in result.trials:
        assert set(trial.params) == {"learning_rate", "filters"}
        spec = json.loads(world.store.read_bytes(f"runs/{trial.run_id}/spec.json"))
        assert spec["hparams"]["learning_rate"] == trial.params["learning_rate"]
        assert spec["train"]["eval_every_steps"] == 20
        if trial.state == "COMPLETE":
            assert trial.value == _reported(world, trial.run_id)
            assert sorted(trial.intermediate) == [20, 40, 60]
    best = result.best
    assert best is not None and best.value == max(t.value for t in result.trials if t.state == "COMPLETE")
    assert best.value == _reported(world, best.run_id) and best.value > 0.5
    assert result.best_model == world.store.uri_of(f"runs/{best.run_id}/model")
    ledger = Ledger(world.settings.ledger_path)
    assert {n.sweep_id for n in ledger.nodes(PROJECT, zone=A)} >= {"quiet"}
    done = world.tpuops("cost", "--sweep", "quiet", "--json")
    assert done.returncode == 0, done.stderr
    cost = json.loads(done.stdout)
    assert [s["key"] for s in cost["sweeps"]] == ["quiet"] and cost["sweeps"][0]["usd"] > 0
    assert abs(cost["sweeps"][0]["usd"] - sum(t.cost_usd for t in result.trials)) < 0.05 * cost["sweeps"][0]["usd"]


def test_preempted_trials_finish_from_their_checkpoints_with_the_same_params(world: World,
                                                                           uninterrupted: SweepStatus) -> None:
    """SIGTERM with a notice (grace) and SIGKILL without one, each once: no trial failed, duplicated or added."""
    sweep = "stormy"
    world.start(world.sweep_file(sweep, SWEEP.format(name=sweep, pruner="none").replace("trials: 3", "trials: 2")))
    graces = [5.0, 0.0]
    preempted: list[str] = []
    stop_event = threading.Event()

    def preempt_two() -> None:
        """Poll fast, as the test plays the cloud: preempt two trials mid-training, after a checkpoint."""
        while graces and not stop_event.is_set():
            for run_id in world.run_ids(sweep):
                status = runs.read_status(world.store, run_id)
                mid = status is not None and (status.last_checkpoint_step or 0) >= 20 and status.step < STEPS - 10
                if run_id in preempted or not mid or status.exit_class:
                    continue
                node = next((n for n in world.nodes(sweep) if n["name"].endswith(run_id)), None)
                if node is None or node["state"] != "READY" or node["preempting"]:
                    continue
                try:
                    world.admin.preempt(PROJECT, node["name"].split("/")[3], run_id, grace_s=graces[0])
                except InvalidRequest:
                    continue
                preempted.append(run_id)
                graces.pop(0)
                break
            time.sleep(0.01)  # the polling interval of this fake cloud, not synchronisation

    thread = threading.Thread(target=preempt_two, daemon=True)
    thread.start()
    try:
        world.drive(sweep, world.controller(sweep))
    finally:
        stop_event.set()
        thread.join(10)
    result = world.status(sweep)
    assert not graces, f"the trials ended before both preemptions ({preempted})"
    assert (result.outcome, [t.state for t in result.trials]) == ("completed", ["COMPLETE"] * 2)
    assert world.run_ids(sweep) == [f"{sweep}-t000{n}" for n in range(2)]
    assert [t.params for t in result.trials] == [t.params for t in uninterrupted.trials[:2]]
    for run_id in preempted:
        memory = runs.load_memory(world.store, run_id)[0]
        assert memory.preemptions >= 1 and memory.outcome == "succeeded"
        status = runs.read_status(world.store, run_id)
        assert status is not None and status.resumed_from_step and status.attempt >= 2
    by_run = {t.run_id: t for t in result.trials}
    assert all(by_run[r].preemptions >= 1 and sorted(by_run[r].intermediate)[-1] == STEPS for r in preempted)
    assert world.nodes(sweep) == []


def test_a_clearly_bad_trial_is_pruned_and_loses_its_node(world: World) -> None:
    sweep = "prune"
    text = SWEEP.format(name=sweep, pruner="median").replace(
        "space:\n  learning_rate: {type: float, low: 0.001, high: 0.02, log: true}\n"
        "  filters: {type: categorical, choices: [8, 16]}\n",
        "grid:\n  learning_rate: [0.003, 30.0]\n").replace("type: tpe", "type: grid").replace(
        "small.yaml", "medium.yaml").replace("startup_trials: 2", "startup_trials: 1").replace(
        "trials: 3\nparallel: 2", "trials: 2\nparallel: 1")
    world.start(world.sweep_file(sweep, text))
    world.drive(sweep, world.controller(sweep))
    result = world.status(sweep)
    assert [t.params["learning_rate"] for t in result.trials] == [0.003, 30.0]
    assert [t.state for t in result.trials] == ["COMPLETE", "PRUNED"]
    bad = result.trials[1]
    assert max(bad.intermediate) < MEDIUM and bad.step < MEDIUM and "pruned at step" in (bad.ended or "")
    memory = runs.load_memory(world.store, bad.run_id)[0]
    assert memory.outcome == "pruned" and world.nodes(sweep) == []


def test_a_budget_that_fits_three_trials_runs_three_and_ends_budget_exhausted(world: World) -> None:
    """Trials that would train for hours at $1 a second: three fit the budget's projection, the cap stops them
    before they overrun it."""
    sweep = "broke"
    text = SWEEP.format(name=sweep, pruner="none").replace("../experiments/small.yaml", "../experiments/long.yaml") \
        .replace("parallel: 2", "parallel: 4").replace("trials: 3", "trials: 6")
    hourly = catalog_for(world.settings).price_per_hour("v3-8", "spot", A)
    projected = 0.002 * hourly  # expected_hours x the node's price
    world.start(world.sweep_file(sweep, text + f"budget_usd: {3.5 * projected}\n"))
    ledger = Ledger(world.settings.ledger_path)
    world.drive(sweep, world.controller(sweep))
    result = world.status(sweep)
    assert (result.phase, result.outcome) == ("finished", "budget-exhausted")
    assert world.run_ids(sweep) == [f"{sweep}-t000{n}" for n in range(3)]
    assert {t.state for t in result.trials} <= {"PRUNED", "FAIL"}  # stopped by the cap (PRUNED if it had values)
    for trial in result.trials:
        memory = runs.load_memory(world.store, trial.run_id)[0]
        assert memory.outcome == "budget-exhausted"
    budget = 3.5 * projected
    burn = 3 * hourly / 3600  # $/s of three READY nodes
    total = spent(ledger, catalog_for(world.settings), project=PROJECT, sweep_id=sweep)
    # The pass stops the trials at the last pass before they would spend the rest (a running trial reserves what
    # it bills until the next pass), so the spend ends under the budget, over it by at most a node deletion; and
    # well past half of it, or something other than the budget stopped them.
    assert budget / 2 <= total <= budget + burn * 2.0, total
    assert world.nodes(sweep) == []


def test_sweep_status_json_matches_its_table(world: World, uninterrupted: SweepStatus) -> None:
    done = world.tpuops("sweep", "status", "quiet", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    table = world.tpuops("sweep", "status", "quiet")
    assert table.returncode == 0, table.stderr
    for trial in data["trials"]:
        row = next(line for line in table.stdout.splitlines() if trial["run_id"] in line)
        assert trial["state"] in row and str(trial["step"]) in row
        if trial["value"] is not None:
            assert f"{trial['value']:.4f}" in row
    assert "trials ended" in table.stdout and "3/3" in table.stdout
    assert poll(lambda: data["counts"]["COMPLETE"] + data["counts"]["PRUNED"] == 3, "counts")


def test_the_report_has_valid_plots_and_an_html_page_that_chromium_opens(world: World, uninterrupted: SweepStatus,
                                                                        tmp_path: Path) -> None:
    from PIL import Image

    out = tmp_path / "report"
    done = world.tpuops("sweep", "report", "quiet", "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert sorted(Path(f).name for f in data["files"]) == sorted(
        ["history.png", "importances.png", "parallel.png", "intermediate.png", "cost.png", "report.html"])
    # fANOVA needs two completed trials whose objectives differ (small eval sets tie often).
    values = {t["value"] for t in data["trials"] if t["state"] == "COMPLETE"}
    assert set(data["importances"]) == ({"learning_rate", "filters"} if len(values) >= 2 else set())
    for name in ("history", "importances", "parallel", "intermediate", "cost"):
        path = out / f"{name}.png"
        with Image.open(path) as image:
            image.verify()
        with Image.open(path) as image:
            shades = image.convert("L").getcolors(256) or []
            assert image.size == (700, 400) and len(shades) > 20, name  # drawn on, not blank
        assert path.stat().st_size > 10_000, name
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 5 and "src='http" not in page and "<script" not in page
    best = uninterrupted.best
    assert best is not None and f"{best.value:.4f}" in page and best.run_id in page
    table = world.tpuops("sweep", "report", "quiet")
    for trial in data["trials"]:
        row = next(line for line in table.stdout.splitlines() if trial["run_id"] in line)
        assert trial["state"] in row and (trial["value"] is None or f"{trial['value']:.4f}" in row)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (make test installs the Debian package 'chromium'): "
                    "the HTML page was not opened in a browser")
    browser = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'chrome'}",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=3000", "--dump-dom",
         f"file://{out / 'report.html'}"],
        capture_output=True, text=True, timeout=120, check=False)
    assert browser.returncode == 0, browser.stderr[-2000:]
    assert "<table id=\"trials\">" in browser.stdout and browser.stdout.count("<tr>") == len(data["trials"]) + 1
    assert "ERROR:CONSOLE" not in browser.stderr and "Uncaught" not in browser.stderr


def _endgame_sweep(world: World, sweep: str, experiment: str, fraction: float) -> Path:
    """One trial at a time of ``experiment``, a $200 budget and an endgame for one leader at ``fraction`` of it."""
    text = SWEEP.format(name=sweep, pruner="none").replace("small.yaml", experiment).replace(
        "trials: 3\nparallel: 2", "trials: 1\nparallel: 1")
    return world.sweep_file(sweep, text + f"budget_usd: 200\nendgame: {{leaders: 1, at_budget_fraction: {fraction}}}\n")


def test_the_endgame_moves_the_leading_trial_to_on_demand_at_a_checkpoint(world: World) -> None:
    """Once 2 % of the budget is spent, the leading running trial is recreated on-demand from its checkpoint.

    Its job is long (``long.yaml``), so that the promotion cannot come after it ended, however the agent's pace and
    the passes' compare: once the on-demand node trains on from the checkpoint, the sweep is stopped. (With 300 steps
    the agent trained them in about 1.2 s and $4 took 4 s of READY: the promotion came after the agent's end in
    2 of 3 CI rehearsals, which ``test_the_endgame_leaves_a_trial_whose_agent_has_ended`` now pins.)"""
    sweep = "endgame"
    world.start(_endgame_sweep(world, sweep, "long.yaml", 0.02))
    controller, run_id = world.controller(sweep), f"{sweep}-t0000"

    def resumed() -> bool:
        controller.run_pass()
        status = runs.read_status(world.store, run_id)
        return status is not None and status.attempt >= 2 and status.resumed_from_step is not None \
            and status.step > status.resumed_from_step

    poll(resumed, "the promoted trial training on from its checkpoint", timeout_s=240, interval_s=0.2)
    assert world.tpuops("sweep", "stop", sweep).returncode == 0
    world.drive(sweep, controller)
    result = world.status(sweep)
    assert (result.outcome, [t.state for t in result.trials]) == ("stopped", ["PRUNED"])
    promoted = [t for t in result.trials if t.promoted]
    assert len(promoted) == 1, result.trials
    trial = promoted[0]
    record, memory = runs.read_record(world.store, trial.run_id), runs.load_memory(world.store, trial.run_id)[0]
    assert (record.node.capacity, memory.capacity) == ("spot", "on-demand")  # the record stays as declared
    assert "promoted" in [e["kind"] for e in memory.events]
    # in the order the incarnations began (the ledger may record one it first saw past READY after its successor)
    histories = sorted(Ledger(world.settings.ledger_path).histories(PROJECT, run_id=trial.run_id),
                       key=lambda h: min((t.at for t in h.transitions), default=datetime.max.replace(tzinfo=UTC)))
    assert [h.node.capacity for h in histories] == ["spot", "on-demand"]
    status = runs.read_status(world.store, trial.run_id)
    assert status is not None and status.resumed_from_step  # on from its checkpoint
    assert 0 < trial.on_demand_usd < trial.cost_usd
    assert memory.preemptions == 0  # a promotion is no preemption
    # The promotion deleted the spot node through the Fleet: the ledger ends its READY time where billing does
    # (within 2 % of its length), and the trial's READY time is within 2 % of what the emulator billed.
    catalog, now = catalog_for(world.settings), datetime.now(UTC)
    billed = [i for i in world.admin.billing() if i["node"].endswith(f"/nodes/{record.node_name}")]
    assert len(billed) == 2 and {h.node.uid for h in histories} == {i["node_uid"] for i in billed}, (histories, billed)
    spot = next(i for i in billed if i["node_uid"] == histories[0].node.uid)
    spot_end = datetime.fromisoformat(spot["end"].replace("Z", "+00:00"))
    ledger_end = ready_intervals(histories[0].transitions, now)[-1].end
    assert abs((ledger_end - spot_end).total_seconds()) <= 0.02 * spot["seconds"], (ledger_end, spot)
    ours = sum(node_cost(h, catalog, now).ready_seconds for h in histories)
    assert abs(ours - sum(i["seconds"] for i in billed)) <= 0.02 * sum(i["seconds"] for i in billed), (ours, billed)


def test_the_endgame_leaves_a_trial_whose_agent_has_ended(world: World) -> None:
    """The race of the CI rehearsals, made certain: the leading trial's agent ends between two passes, and the next
    pass's sweep step (which runs before the run pass reads the agent's exit) finds the endgame due. The trial is not
    promoted (its node had nothing left to do; promoted, it was marked so with no on-demand node, its leader's place
    spent): it completes on its one spot node."""
    sweep = "late"
    world.start(_endgame_sweep(world, sweep, "medium.yaml", 0.001))
    controller, run_id = world.controller(sweep), f"{sweep}-t0000"
    # the Fleet's own lookup, no pass: the ledger has the node READY (the spend the endgame waits for) ...
    poll(lambda: (node := controller.nodes.find(A, run_id)) is not None and node.state is NodeState.READY,
         "the trial's node READY in the ledger", timeout_s=120)

    def ended() -> bool:  # ... and the agent ends before any pass reads it
        status = runs.read_status(world.store, run_id)
        return status is not None and status.exit_class is ExitClass.SUCCEEDED

    poll(ended, "the trial's agent to end", timeout_s=120)
    world.drive(sweep, controller)
    result = world.status(sweep)
    assert (result.outcome, [t.state for t in result.trials]) == ("completed", ["COMPLETE"])
    assert not result.trials[0].promoted and result.trials[0].on_demand_usd == 0
    memory = runs.load_memory(world.store, run_id)[0]
    assert memory.capacity is None and "promoted" not in [e["kind"] for e in memory.events]
    assert [h.node.capacity for h in Ledger(world.settings.ledger_path).histories(PROJECT, run_id=run_id)] == ["spot"]


class Storm:
    """The cloud of the elastic sweep, drawn from a seeded RNG every half second until it is stopped: the stockout of
    v2-32's only zone switched on or off (p = 0.3), and a trial's node preempted mid-training, after a checkpoint,
    with or without a notice (p = 0.25, at most ``most`` times). It starts with v2-32 stocked out, and keeps it out
    until a trial has taken the smaller size (``size-down``): switched on and off from the start, the stockout could
    miss every trial's create on a loaded machine, and the elastic path would go untested (a CI rehearsal)."""

    def __init__(self, world: World, sweep: str, seed: int, most: int = 3) -> None:
        self.world, self.sweep, self.rng, self.most = world, sweep, random.Random(seed), most
        self.out = True
        self.preempted: list[tuple[str, str]] = []  # (run, zone)
        self.halt = threading.Event()
        world.admin.set_faults(stockout_zones=[A])
        self.thread = threading.Thread(target=self._blow, daemon=True)

    def _blow(self) -> None:
        while not self.halt.wait(0.5):
            if self.rng.random() < 0.3 and (not self.out or self._sized_down()):
                self.out = not self.out
                self.world.admin.set_faults(stockout_zones=[A] if self.out else [])
            if len(self.preempted) < self.most and self.rng.random() < 0.25:
                self._preempt(self.rng.choice([0.0, 5.0]))

    def _sized_down(self) -> bool:
        return any(e["kind"] == "size-down" for run_id in self.world.run_ids(self.sweep)
                   for e in runs.load_memory(self.world.store, run_id)[0].events)

    def _preempt(self, grace_s: float) -> None:
        for node in self.world.nodes(self.sweep):
            run_id, zone = node["name"].rsplit("/", 1)[1], node["name"].split("/")[3]
            status = runs.read_status(self.world.store, run_id)
            mid = status is not None and (status.last_checkpoint_step or 0) >= 20 and status.step < ELASTIC - 10
            if run_id.endswith("-up") or node["state"] != "READY" or node["preempting"] or not mid:
                continue
            try:
                self.world.admin.preempt(PROJECT, zone, run_id, grace_s=grace_s)
            except InvalidRequest:  # it changed state meanwhile: the next draw picks again
                return
            self.preempted.append((run_id, zone))
            return

    def __enter__(self) -> Storm:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.halt.set()
        self.thread.join(10)
        self.world.admin.set_faults(stockout_zones=[])


def test_elastic_trials_under_random_stockouts_and_preemptions_each_end_once(world: World) -> None:
    """Three trials of ``accelerator: [v2-32, v2-8]``, two at a time, while a seeded storm (``Storm``) stocks out
    v2-32 on and off and preempts trials: every trial ends (COMPLETE, its steps trained once over on its one global
    batch), no trial is duplicated (no second run, no two nodes of one trial billed at once), no node is left."""
    sweep = "elastic"
    text = SWEEP.format(name=sweep, pruner="none").replace("small.yaml", "elastic.yaml").replace(
        "{type: tpe, seed: 11, startup_trials: 4}", "{type: random, seed: 3}")
    with Storm(world, sweep, seed=40) as storm:
        world.start(world.sweep_file(sweep, text))
        world.drive(sweep, world.controller(sweep), timeout_s=900)
    result = world.status(sweep)
    assert (result.phase, result.outcome) == ("finished", "completed")
    assert [(t.number, t.state) for t in result.trials] == [(n, "COMPLETE") for n in range(3)], result.trials
    assert world.run_ids(sweep) == [f"{sweep}-t000{n}" for n in range(3)]
    assert world.nodes(sweep) == []
    assert storm.preempted, "the storm preempted no trial: nothing was tested"
    kinds = {t.run_id: [e["kind"] for e in runs.load_memory(world.store, t.run_id)[0].events] for t in result.trials}
    assert any("size-down" in found for found in kinds.values()), kinds
    for trial in result.trials:
        memory = runs.load_memory(world.store, trial.run_id)[0]
        status = runs.read_status(world.store, trial.run_id)
        assert memory.outcome == "succeeded" and status is not None and status.step == ELASTIC
        # each preemption the storm made is counted (one racing a move's delete may count as the move)
        assert memory.preemptions <= sum(run == trial.run_id for run, _ in storm.preempted), storm.preempted
        assert memory.preemptions >= 1 or trial.run_id not in dict(storm.preempted), storm.preempted
        assert status.examples_seen == ELASTIC * status.global_batch, status  # one global batch, each step once
        billed = sorted((i for i in world.admin.billing() if i["node"].endswith(f"/nodes/{trial.run_id}")),
                        key=lambda interval: interval["start_epoch"])
        assert all(a["end_epoch"] is not None and a["end_epoch"] <= b["start_epoch"]
                   for a, b in itertools.pairwise(billed)), billed  # one node of a trial at a time
