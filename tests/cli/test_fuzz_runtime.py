"""The long fuzz profile's runtime arm: experiments that parse but are wrong, and faults at random moments of a run.

The flag fuzzer (``test_fuzz_cli.py``) stops where a run starts. This arm trains: each case is one
``tpuops train NAME --json`` (a separate process, as a user runs it) on an emulator whose nodes run
real TF 2.9, of an experiment drawn from ``WRONG`` (a correct one, or one that parses and is wrong:
a bad model, bad data, a bad seed, a diverging learning rate, a target the run cannot measure),
with a fault drawn from ``FAULTS`` at a drawn moment (API errors from then on, a garbled
``status.json`` or ``memory.json``, the job's process group or the ``train`` process killed). A
killed ``train`` is followed by ``tpuops reconcile`` passes, as cron would run them.

The verdict (``verdict``) per case is the issue's: a clear line or a recovery, nothing billing,
nothing lost, no false success:

- no traceback in any output, an exit code in {0, 1, 2}, and a refusal (2) creates no node;
- a failure ends with one ``error:`` line that says more than "in user code:";
- afterwards no node of the run is left and its billing is closed;
- wrong work never exits 0 nor ends "succeeded"; a deterministic mistake boots at most one node
  (unless the fault itself killed the job);
- a correct experiment without a fault succeeds, and with one succeeds or ends in a clear line;
  a success has every step done and its model saved.

Cases share one emulator and one store, as a user's runs do: a run that breaks a command for every
later one (one NaN run made ``runs --json`` raise on every call) fails the later cases too, each
naming the traceback by its last line. Each case takes a minute or more, so the arm runs only in
the long profile (``make fuzz``; ``TPUOPS_FUZZ_RUNTIME_CASES`` cases, 12 by default), never in
``make test``; it does not shrink (a shrink step is another TF run). ``verdict`` itself is checked
in the unit lane on made-up observations.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fuzzing import PROFILE
from helpers import TfWorld, digits_project, open_tf_world, small_digits
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tpuops.data.manifest import MANIFEST, parse_manifest
from tpuops.runs import layout
from tpuops.store.files import crc32c_of_bytes

ZONE = "us-central1-a"
CASES = int(os.environ.get("TPUOPS_FUZZ_RUNTIME_CASES", "12"))
CASE_TIMEOUT_S = 600.0
RECOVERY_S = 300.0
FAULT_LATEST_S = 40.0
WRONG = ("none", "loss", "metric", "corrupt-record", "truncated-record", "seed", "diverge",
         "target-unmeasured", "target-contradictory")
FAULTS = ("none", "api-errors", "garble-status", "garble-memory", "kill-job", "kill-train")
DETERMINISTIC = frozenset(WRONG) - {"none"}
"""Wrong work whose mistake is the same on every node: it may cost one boot, never a restart."""
GARBAGE = b'{"step": 12, "phase": "train'
BAD_MODELS = '''

def bad_loss(hparams):
    model = digits_cnn(hparams)
    model.compile(optimizer="adam", loss="no_such_loss")
    return model


def bad_metric(hparams):
    model = digits_cnn(hparams)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["no_such_metric"])
    return model
'''

@dataclass(frozen=True)
class Case:
    wrong: str
    fault: str
    at_s: float
    """Seconds after ``train`` starts when the fault strikes."""
    error_rate: float
    seed: int


@dataclass
class Observed:
    """What one case did, as a user and the emulator's billing can see it."""

    case: Case
    exit: int | None
    """None: ``train`` was killed by the case, or hung and was killed."""
    stdout: str = ""
    stderr: str = ""
    hung: bool = False
    creates: int = 0
    boots: int = 0
    nodes_left: list[str] = field(default_factory=list)
    billing_open: int = 0
    outcome: str | None = None
    """The run's outcome as ``tpuops runs --json`` shows it (None: not finished, or not shown)."""
    steps_done: bool = False
    model_saved: bool = False
    others: list[str] = field(default_factory=list)
    """The output of the commands run after ``train`` (reconcile passes, ``runs --json``)."""


def _clear_line(stderr: str) -> str | None:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if not last.startswith("error:"):
        return f"no 'error:' line at the end: {last[:200]!r}"
    if re.search(r"in user code:\s*(;|$)", last):
        return f"the cause stops at 'in user code:': {last[:200]!r}"
    return None


def verdict(seen: Observed) -> list[str]:
    """Every promise this case broke (empty: none). Pure: the unit lane checks it on made-up observations."""
    case, problems = seen.case, []
    for text in (seen.stdout, seen.stderr, *seen.others):
        if "Traceback (most recent call last)" in text:
            last = [line for line in text.splitlines() if line.strip()][-1]
            problems.append(f"printed a traceback ending {last[:200]!r}")
            break
    if seen.hung:
        problems.append(f"train still running after {CASE_TIMEOUT_S:.0f} s")
    if seen.exit not in (None, 0, 1, 2):
        problems.append(f"exit code {seen.exit}")
    if seen.exit == 2 and seen.creates:
        problems.append(f"refused (exit 2) after creating {seen.creates} node(s)")
    if seen.exit not in (None, 0) and (unclear := _clear_line(seen.stderr)):
        problems.append(unclear)
    if seen.nodes_left or seen.billing_open:
        problems.append(f"left billing: nodes {seen.nodes_left}, {seen.billing_open} open billing interval(s)")
    if case.wrong != "none" and (seen.exit == 0 or seen.outcome == "succeeded"):
        problems.append(f"false success: {case.wrong} ended exit {seen.exit}, outcome {seen.outcome}")
    if case.wrong in DETERMINISTIC and case.fault not in ("kill-job", "kill-train") and seen.boots > 1:
        problems.append(f"a deterministic mistake booted {seen.boots} nodes")
    if case.wrong == "none" and case.fault == "none" and seen.exit != 0:
        problems.append(f"a correct run without a fault ended exit {seen.exit}")
    if case.wrong == "none" and seen.exit is None and seen.outcome not in ("succeeded", "failed", "user_error"):
        problems.append(f"not recovered after the kill: outcome {seen.outcome}")
    if seen.exit == 0 and not (seen.steps_done and seen.model_saved):
        problems.append("lost work: succeeded without every step done and the model saved")
    return problems


# -- the world: one emulator running TF 2.9, the experiments written once ------------------------------


def _damaged_copy(source: Path, target: Path, how: str) -> None:
    """``source`` dataset copied with one bad record; its manifest made from the damaged bytes (whole-shard
    size and crc32c agree), as a writer that crashed, or a disk that flipped a bit, would leave it."""
    shutil.copytree(source, target)
    manifest = parse_manifest((target / MANIFEST).read_bytes(), MANIFEST)
    victim = manifest.shards[-1]
    data = (target / victim.name).read_bytes()
    data = data[:-3] if how == "truncated-record" else data[:15] + bytes([data[15] ^ 0x01]) + data[16:]
    (target / victim.name).write_bytes(data)
    shards = [s.model_copy(update={"bytes": len(data), "crc32c": crc32c_of_bytes(data)}) if s is victim else s
              for s in manifest.shards]
    (target / MANIFEST).write_bytes(manifest.model_copy(update={"shards": shards,
                                                                "bytes": sum(s.bytes for s in shards)}).to_bytes())


def _experiments(work: Path) -> dict[str, Path]:
    text = small_digits(digits_project(work))
    (work / "experiments" / "models.py").write_text((work / "experiments" / "models.py").read_text() + BAD_MODELS)
    for how in ("corrupt-record", "truncated-record"):
        _damaged_copy(work / "data" / "digits" / "train", work / "data" / how / "train", how)
    target = "target:\n  metric: accuracy\n  at_least: 0.95\n"
    assert target in text
    variants = {
        "none": text,
        "loss": text.replace("model: models:digits_cnn", "model: models:bad_loss"),
        "metric": text.replace("model: models:digits_cnn", "model: models:bad_metric"),
        "corrupt-record": text.replace("train: data/digits/train", "train: data/corrupt-record/train"),
        "truncated-record": text.replace("train: data/digits/train", "train: data/truncated-record/train"),
        "seed": text + "seed: -5\n",
        "diverge": text.replace("learning_rate: 0.003", "learning_rate: 1.0e+12"),
        "target-unmeasured": text.replace(target, "target:\n  metric: mae\n  at_most: 0.5\n"),
        "target-contradictory": text.replace(target, "target:\n  metric: accuracy\n  at_least: 0.9\n  at_most: 0.1\n"),
    }
    paths = {}
    for wrong, variant in variants.items():
        assert wrong == "none" or variant != text, wrong
        paths[wrong] = work / "experiments" / f"fuzz_{wrong.replace('-', '_')}.yaml"
        paths[wrong].write_text(variant)
    return paths


@dataclass
class RuntimeWorld:
    tf: TfWorld
    specs: dict[str, Path]


@pytest.fixture(scope="module")
def runtime_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeWorld]:
    with open_world(tmp_path_factory.mktemp("fuzz-runtime")) as world:
        yield world


@contextlib.contextmanager
def open_world(work: Path) -> Iterator[RuntimeWorld]:
    """The experiments written into ``work`` and an emulator running TF 2.9 (also for replaying chosen cases)."""
    specs = _experiments(work)
    with open_tf_world(work, f'zones = ["{ZONE}"]\n', lease_ttl_s=10.0, grace_s=5.0,
                       env={"TPUOPS_POLL_INTERVAL_S": "0.5"}) as world:
        yield RuntimeWorld(world, specs)


# -- one case ------------------------------------------------------------------------------------------------


def _strike(world: TfWorld, case: Case, run: str, train: subprocess.Popen[str]) -> None:
    """The case's fault, now."""
    if case.fault == "api-errors":
        world.admin.set_faults(error_rate=case.error_rate, seed=case.seed)
    elif case.fault in ("garble-status", "garble-memory"):
        key = layout.status_key(run) if case.fault == "garble-status" else layout.memory_key(run)
        if world.store.exists(key):
            world.store.write_bytes(key, GARBAGE)
    elif case.fault == "kill-job":
        node = next((n for n in world.admin.nodes() if n["name"].endswith(f"/nodes/{run}") and n.get("pgid")), None)
        if node is not None:
            os.killpg(node["pgid"], signal.SIGKILL)
    elif case.fault == "kill-train":
        train.kill()


def _node_names(world: TfWorld, run: str) -> list[str]:
    return [n["name"] for n in world.admin.nodes() if n["name"].endswith(f"/nodes/{run}")]


def _billing(world: TfWorld, run: str) -> list[dict]:
    return [i for i in world.admin.billing() if i["node"].endswith(f"/nodes/{run}")]


def _outcome(world: TfWorld, run: str, others: list[str]) -> str | None:
    done = world.tpuops("runs", "--json", timeout=120)
    others.append(done.stdout + done.stderr)
    try:
        listed = json.loads(done.stdout)["runs"]
    except (ValueError, KeyError, TypeError):
        return None
    return next((str(r.get("outcome")) for r in listed if r.get("run_id") == run and r.get("outcome")), None)


def run_case(rw: RuntimeWorld, case: Case) -> Observed:
    world, run = rw.tf, f"fz-{uuid.uuid4().hex[:8]}"
    world.admin.reset_stats()
    train = subprocess.Popen([sys.executable, "-m", "tpuops", "train", str(rw.specs[case.wrong]), "--name", run,
                              "--json"], cwd=world.work, env=world.env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    struck, started, hung = case.fault == "none", time.monotonic(), False
    try:
        while train.poll() is None:
            if not struck and time.monotonic() - started >= case.at_s:
                _strike(world, case, run, train)
                struck = True
            if time.monotonic() - started > CASE_TIMEOUT_S:
                hung = True
                train.kill()
            time.sleep(0.1)
        stdout, stderr = train.communicate()
    finally:
        world.admin.clear_faults()
    killed = case.fault == "kill-train" and struck and train.returncode == -signal.SIGKILL
    seen = Observed(case, None if killed or hung else train.returncode, stdout, stderr, hung)
    if killed or hung:  # what cron would do next: passes until the run is over and its node gone
        deadline = time.monotonic() + RECOVERY_S
        while time.monotonic() < deadline:
            passed = world.tpuops("reconcile", timeout=120)
            seen.others.append(passed.stdout + passed.stderr)
            if _outcome(world, run, seen.others) and not _node_names(world, run):
                break
    seen.creates = world.admin.stats().get("CreateNode", 0)
    intervals = _billing(world, run)
    seen.boots = len({i["node_uid"] for i in intervals})
    seen.billing_open = sum(1 for i in intervals if i["end_epoch"] is None)
    seen.nodes_left = _node_names(world, run)
    seen.outcome = _outcome(world, run, seen.others)
    run_dir = Path(world.settings.store_root) / "runs" / run
    try:
        status = json.loads((run_dir / "status.json").read_text())
        seen.steps_done = status.get("step") == status.get("total_steps") and bool(status.get("step"))
    except (OSError, ValueError):
        seen.steps_done = False
    seen.model_saved = (run_dir / "model" / "saved_model.pb").exists()
    if seen.nodes_left:  # the next case starts clean; the verdict has counted them
        world.tpuops("down", run, "--yes", timeout=180)
    return seen


cases = st.builds(Case, wrong=st.sampled_from(WRONG), fault=st.sampled_from(FAULTS),
                  at_s=st.floats(0.0, FAULT_LATEST_S), error_rate=st.sampled_from([0.1, 0.3, 0.5]),
                  seed=st.integers(0, 2**16))


@pytest.mark.emulator
@pytest.mark.tf
@pytest.mark.slow
@pytest.mark.skipif(PROFILE != "long", reason="the runtime arm runs in the long profile only (make fuzz)")
@settings(max_examples=CASES, deadline=None, database=None, phases=(Phase.explicit, Phase.generate),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=cases)
def test_wrong_work_and_faults_keep_the_promise(runtime_world: RuntimeWorld, case: Case) -> None:
    seen = run_case(runtime_world, case)
    problems = verdict(seen)
    assert not problems, (f"{case}: {'; '.join(problems)}\nexit {seen.exit}, outcome {seen.outcome}, "
                          f"{seen.creates} create(s), {seen.boots} boot(s)\nstderr: {seen.stderr[-1500:]}")


# -- the verdict, on made-up observations (unit) --------------------------------------------------------------

GOOD = Case("none", "none", 0.0, 0.1, 0)


@pytest.mark.unit
def test_a_clean_success_and_a_clear_user_error_pass() -> None:
    assert verdict(Observed(GOOD, 0, steps_done=True, model_saved=True, boots=1, creates=1,
                            outcome="succeeded")) == []
    wrong = Case("loss", "none", 0.0, 0.1, 0)
    assert verdict(Observed(wrong, 1, stderr="error: run x ended user_error: ValueError: Unknown loss function",
                            boots=1, creates=1, outcome="user_error")) == []
    refused = Case("seed", "none", 0.0, 0.1, 0)
    assert verdict(Observed(refused, 2, stderr="error: seed -5: expected 0 to 2**32 - 1")) == []


@pytest.mark.unit
@pytest.mark.parametrize(("seen", "broken"), [
    (Observed(Case("diverge", "none", 0, 0.1, 0), 0, outcome="succeeded", steps_done=True, model_saved=True),
     "false success"),
    (Observed(Case("loss", "none", 0, 0.1, 0), 1, stderr="error: run x ended crashed: ValueError: in user code:",
              boots=1), "in user code:"),
    (Observed(Case("loss", "none", 0, 0.1, 0), 1, boots=1,
              stderr="error: run x ended crashed: ValueError: in user code:; gave up after 3 restarts"),
     "in user code:"),
    (Observed(Case("loss", "none", 0, 0.1, 0), 1, stderr="error: x", boots=4), "booted 4 nodes"),
    (Observed(Case("seed", "none", 0, 0.1, 0), 2, stderr="error: x", creates=1), "after creating 1 node"),
    (Observed(GOOD, 1, stderr="Traceback (most recent call last):\n  ...\nKeyError: 'x'"), "traceback"),
    (Observed(Case("none", "api-errors", 0, 0.5, 0), 1, stderr="error: gave up", nodes_left=["n"]), "left billing"),
    (Observed(Case("none", "kill-train", 0, 0.1, 0), None, outcome=None), "not recovered"),
    (Observed(GOOD, 0, steps_done=True, model_saved=False), "lost work"),
    (Observed(GOOD, None, hung=True, outcome="succeeded"), "still running"),
])
def test_the_verdict_names_each_broken_promise(seen: Observed, broken: str) -> None:
    problems = verdict(seen)
    assert any(broken in problem for problem in problems), problems
