"""A sweep pass SIGKILLed at 10 seeded moments, then two passes at once: trial and run counts stay exact.

Real store, real Optuna (the journal in the store), real sweep passes in their own processes; no
TPU nodes: the test plays the controller and the agent of each trial's run (it finishes the run
with an evaluation history, as the agent's status would show it), so only the sweep pass is
under test and each pass is short enough for the kills to land anywhere in it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO

from tpuops import runs
from tpuops.config import load_settings
from tpuops.data.samples import digits
from tpuops.store import LocalStore
from tpuops.sweeps import ops as sweep_ops
from tpuops.sweeps import studies
from tpuops.sweeps.start import plan_sweep, start_sweep
from tpuops.sweeps.template import trial_run_id

pytestmark = pytest.mark.emulator

KILLS = 10
TRIALS = 8
WORKER = """
import sys
from tpuops.config import load_settings
from tpuops.store.lease import Leases
from tpuops.billing.ledger import Ledger
from tpuops.session import store
from tpuops.sweeps.advance import SweepPass

settings = load_settings()
root = store(settings)
leases = Leases(root, sys.argv[1], ttl_s=settings.lease_ttl_s)
sweeps = SweepPass(settings, root, Ledger(settings.ledger_path), leases, held=set(), progress=print)
while True:
    print("pass", flush=True)
    sweeps.run()
"""
SPEC = """
name: {name}
experiment: ../experiments/digits_cnn.yaml
space:
  learning_rate: {{type: float, low: 0.001, high: 0.1, log: true}}
  filters: {{type: int, low: 4, high: 32, step: 4}}
sampler: {{type: {sampler}, seed: 5, startup_trials: 3}}
trials: {trials}
parallel: 2
"""


def _objective(params: dict[str, float]) -> float:
    return round(1.0 - abs(params["learning_rate"] - 0.01) - params["filters"] / 1000, 6)


def _finish_declared_runs(store: LocalStore, sweep: str) -> int:
    """Play controller and agent: every declared, unfinished trial run succeeds with an evaluation history."""
    done = 0
    for obj in store.list("runs/"):
        parts = obj.key.split("/")
        if not (parts[1].startswith(f"{sweep}-t") and parts[2] == "run.json"):
            continue
        run_id = parts[1]
        memory, generation = runs.load_memory(store, run_id)
        if memory.finished:
            continue
        value = _objective(json.loads(store.read_bytes(f"runs/{run_id}/spec.json"))["hparams"])
        status = {"step": 60, "exit_class": "succeeded", "metrics": {"eval": {"accuracy": value}},
                  "evals": [{"step": s, "metrics": {"accuracy": value * s / 60}} for s in (20, 40, 60)]}
        store.write_bytes(f"runs/{run_id}/status.json", json.dumps(status).encode())
        memory.phase, memory.outcome = runs.RunPhase.FINISHED, runs.Outcome.SUCCEEDED
        runs.save_memory(store, run_id, memory, generation)
        done += 1
    return done


@pytest.fixture
def world(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    digits(tmp_path / "data" / "digits")
    (tmp_path / "experiments").mkdir()
    (tmp_path / "sweeps").mkdir()
    for name in ("models.py", "digits_cnn.yaml"):
        (tmp_path / "experiments" / name).write_text((REPO / "experiments" / name).read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUOPS_")}
    env.update(TPUOPS_HOME=str(tmp_path / "home"), TPUOPS_LEASE_TTL_S="0.5")
    return tmp_path, env


def _start(work: Path, env: dict[str, str], name: str, sampler: str = "random") -> LocalStore:
    settings = load_settings(environ=env)
    path = work / "sweeps" / f"{name}.yaml"
    path.write_text(SPEC.format(name=name, sampler=sampler, trials=TRIALS))
    store = LocalStore(Path(settings.store_root))
    start_sweep(plan_sweep(settings, path, store, base_dir=work), store, lambda _text: None)
    return store


def _worker(work: Path, env: dict[str, str], holder: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", WORKER, holder], cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


def test_killed_passes_and_twin_passes_keep_trial_and_run_counts_exact(world: tuple[Path, dict[str, str]]) -> None:
    work, env = world
    sweep = "killed"
    store = _start(work, env, sweep)
    rng = random.Random(20260501)
    for kill in range(KILLS):
        worker = _worker(work, env, f"doomed-{kill}")
        assert worker.stdout is not None
        assert worker.stdout.readline() == "pass\n"  # blocks until its first pass begins
        time.sleep(rng.uniform(0.0, 0.8))  # a seeded moment of its passes, not synchronisation
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        _finish_declared_runs(store, sweep)
    twins = [_worker(work, env, holder) for holder in ("left", "right")]
    try:
        deadline = time.monotonic() + 120
        while sweep_ops.load_state(store, sweep)[0].phase != "finished":
            assert time.monotonic() < deadline, "the twin passes did not finish the sweep"
            _finish_declared_runs(store, sweep)
            time.sleep(0.05)  # the pace of this fake data plane
    finally:
        for twin in twins:
            twin.kill()
            twin.wait(10)
    state = sweep_ops.load_state(store, sweep)[0]
    assert state.outcome == "completed"
    spec = sweep_ops.read_sweep(store, sweep).spec
    trials = studies.load_study(spec, studies.open_storage(spec, store)).get_trials()
    run_ids = sorted({o.key.split("/")[1] for o in store.list("runs/") if o.key.endswith("/run.json")})
    assert [t.number for t in trials] == list(range(TRIALS))
    assert len({t.params["learning_rate"] for t in trials}) == TRIALS  # each trial drew its own
    assert run_ids == [trial_run_id(sweep, n) for n in range(TRIALS)]
    assert sorted(runs.all_run_ids(store)) == run_ids  # every trial run is indexed
    for trial in trials:
        run_id = trial_run_id(sweep, trial.number)
        spec_json = json.loads(store.read_bytes(f"runs/{run_id}/spec.json"))
        assert trial.state.name == "COMPLETE" and trial.user_attrs["run_id"] == run_id
        assert {k: spec_json["hparams"][k] for k in trial.params} == trial.params
        assert trial.value == _objective(spec_json["hparams"])
        assert trial.intermediate_values == {20: pytest.approx(trial.value / 3), 40: pytest.approx(trial.value * 2 / 3),
                                             60: pytest.approx(trial.value)}
        assert runs.read_record(store, run_id).sweep == sweep
    # The same seed replays the same params, whatever the kills did to the passes.
    replay = _start(work, env, "replay")
    worker = _worker(work, env, "replay")
    try:
        deadline = time.monotonic() + 120
        while sweep_ops.load_state(replay, "replay")[0].phase != "finished":
            assert time.monotonic() < deadline, "the replay did not finish"
            _finish_declared_runs(replay, "replay")
            time.sleep(0.05)
    finally:
        worker.kill()
        worker.wait(10)
    replayed = studies.load_study(spec.model_copy(update={"name": "replay"}),
                                  studies.open_storage(spec.model_copy(update={"name": "replay"}), replay)).get_trials()
    assert [t.params for t in replayed] == [t.params for t in trials]


def _cli(work: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tpuops", *args], cwd=work, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_start_dry_run_writes_nothing_and_bad_input_is_one_line(world: tuple[Path, dict[str, str]]) -> None:
    work, env = world
    path = work / "sweeps" / "dry.yaml"
    path.write_text(SPEC.format(name="dry", sampler="tpe", trials=4) + "budget_usd: 5\n")
    done = _cli(work, env, "sweep", "start", str(path), "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert (plan["dry_run"], plan["trials"], plan["parallel"], plan["first_runs"]) == (True, 4, 2, ["dry-t0000",
                                                                                                   "dry-t0001"])
    assert plan["projected_usd_per_trial"] > 0 and plan["params"] == ["filters", "learning_rate"]
    store = work / "home" / "store"
    assert not (store / "sweeps").exists() and not (store / "runs").exists() and not (store / "bundles").exists()
    for text, fragment in (
        (SPEC.format(name="bad", sampler="tpe", trials=4).replace("parallel:", "paralell:"),
         "unknown key 'paralell' (did you mean 'parallel'?)"),
        (SPEC.format(name="bad", sampler="tpe", trials=4).replace("filters:", "filtres:"),
         "'filtres' is not an hparam of digits_cnn.yaml"),
        (SPEC.format(name="bad", sampler="tpe", trials=4) + "objective: {metric: f1}\n",
         "objective.metric = 'f1' is not an eval metric"),
    ):
        path.write_text(text)
        done = _cli(work, env, "sweep", "start", str(path))
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and fragment in lines[0], done.stderr
        assert "Traceback" not in done.stderr and not (store / "sweeps").exists()
    missing = _cli(work, env, "sweep", "status", "nope")
    assert missing.returncode == 2 and "no sweep 'nope'" in missing.stderr
