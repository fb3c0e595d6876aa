"""One case per bad-input defect of issue 21, each of which failed before its fix: the CLI in-process, in a sandbox.

Every case also passes ``fuzzing.verdict`` (no traceback, exit 0/1/2, one or two stderr lines for
a usage error, nothing left behind when refused, strict JSON). The sandbox's config points at a
port nothing listens on, so a command that reaches for the API meets an unreachable server.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from fuzzing import CORPUS, REPO, Outcome, Sandbox, run_case, verdict

from tpuops.core.kinds import Capacity
from tpuops.runs import RunRecord
from tpuops.session import open_uri

pytestmark = pytest.mark.unit

SPEC = str(REPO / "experiments" / "digits_cnn.yaml")


def corpus(name: str) -> str:
    return str(CORPUS / name)


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    return Sandbox.make(tmp_path / "case")


def tpuops(sandbox: Sandbox, *argv: str, stdin: str = "") -> Outcome:
    outcome = run_case(sandbox, list(argv), stdin=stdin)
    problem = verdict(outcome)
    assert problem is None, f"tpuops {' '.join(argv)}: {problem}\n{outcome.stderr}"
    return outcome


REFUSED = [  # argv, what the one line must say
    (["init", "--path", "/nonexistent/dir/x.toml"], "no folder /nonexistent/dir"),
    (["init", "--store", "ftp://example.com/x", "--path", "new.toml"], "ftp:// is not a store"),
    (["init", "--zone", "mars-central1-z", "--path", "new.toml"], "offers no Cloud TPUs"),
    (["init", "--zone", "us-central1-x", "--path", "new.toml"], "did you mean 'us-central1-"),
    (["init", "--accelerator", "v9-8", "--path", "new.toml"], "'v9-8' is not a Cloud TPU type"),
    (["init", "--provider", "gcp", "--path", "new.toml"], "pass --project"),
    (["init", "--label", "managed-by=me", "--path", "new.toml"], "set by tpuops"),
    (["init", "--service-account", "nobody", "--path", "new.toml"], "an account email such as"),
    (["--config", "/", "status"], "is a directory"),
    (["train", corpus("latin1.yaml"), "--dry-run"], "not UTF-8"),
    (["train", corpus("binary.yaml"), "--dry-run"], "binary file"),
    (["train", corpus("huge_steps.yaml"), "--dry-run"], "5000 digits"),
    (["train", corpus("deep_nesting.yaml"), "--dry-run"], "nested deeper than 32 levels"),
    (["train", corpus("anchor_bomb.yaml"), "--dry-run"], "anchor bomb"),
    (["train", corpus("recursive_alias.yaml"), "--dry-run"], "refers to a node that contains it"),
    (["train", corpus("bool_steps.yaml"), "--dry-run"], "steps = True is not allowed"),
    (["train", corpus("duplicate_keys.yaml"), "--dry-run"], "'steps' appears twice"),
    (["train", corpus("inf_hours.yaml"), "--dry-run"], "not a finite number"),
    (["train", corpus("traversal_name.yaml"), "--dry-run"], "1-41 lowercase letters"),
    (["train", SPEC, "--budget", "1e400", "--dry-run"], "--budget"),
    (["sweep", "start", corpus("sweep_inf_budget.yaml"), "--dry-run"], "not a finite number"),
    (["sweep", "start", corpus("sweep_trails_typo.yaml"), "--dry-run"], "did you mean 'trials'"),
    (["sweep", "status", "../../etc"], "sweep name '../../etc' is not allowed"),
    (["events", "../../etc/passwd"], "run id '../../etc/passwd' is not allowed"),
    (["up", "n1", "--queued", "--valid-for", "1e400"], "--valid-for"),
    (["watch", "--interval", "1e300"], "--interval"),
    (["emulator", "fault", "--latency", "1e400"], "latency_s = inf is not a finite number"),
    (["emulator", "fault", "--kill-runtime", "my-slice"], "kill_runtimes must be a list of NODE/WORKER entries"),
    (["emulator", "fault", "--never-boot", "my-slice/one"], "never_boot_workers must be a list of NODE/WORKER"),
    (["emulator", "start", "--boot-delay", "-1"], "--boot-delay"),
    (["emulator", "start", "--grace", "nan"], "--grace"),
    (["data", "convert", corpus("empty.yaml"), "-f", "npz", "-o", "out"], "not a readable .npz"),
    (["data", "verify", "\x00"], "NUL byte"),
    (["train", "--resume", ""], "run id '' is not allowed"),
    (["init", "--path", "x" * 300], "File name too long"),
    (["train", corpus("nul_escape.yaml"), "--dry-run"], "NUL character"),
    (["train", corpus("deadline_past.yaml"), "--dry-run"], "deadline 2020-01-01T00:00+00:00 has passed"),
    (["train", corpus("deadline_too_near.yaml"), "--dry-run"], "shorter than the run at on-demand speed"),
    (["train", corpus("deadline_both.yaml"), "--dry-run"], "give deadline or finish_within, not both"),
    (["train", corpus("deadline_bad_duration.yaml"), "--dry-run"], "a duration like 36h"),
    (["simulate", SPEC, "--policy", "cheapest"], "unknown policy 'cheapest'"),
    # issue 31's edge holes: each once accepted, or failed as the world's fault
    (["train", SPEC, "--follow", "--detach", "--dry-run"], "--follow streams the log until the run ends"),
    (["train", SPEC, "--follow", "--detach"], "--detach returns at once: give one of them"),
    (["train", SPEC, "--dry-run", "--follow"], "--dry-run starts nothing, so there is nothing to follow"),
    (["train", "--resume", "r1", "--dry-run", "--detach"], "nothing to detach: drop --detach or --dry-run"),
    (["data", "sample", "digits", ""], "OUT is empty: name the folder to write"),
    (["data", "convert", corpus("empty.yaml"), "-f", "npz", "-o", ""], "--out is empty"),
    (["data", "upload", "corpus", corpus("empty.yaml")], "empty.yaml' is a file: a store or dataset location"),
    (["data", "upload", "corpus", corpus("empty.yaml") + "/data/x"], "which is a file"),
    (["data", "verify", corpus("empty.yaml")], "is a file"),
]


@pytest.mark.parametrize(("argv", "says"), REFUSED, ids=[" ".join(a)[:60] for a, _ in REFUSED])
def test_bad_input_is_refused_in_one_line_with_exit_2(sandbox: Sandbox, argv: list[str], says: str) -> None:
    outcome = tpuops(sandbox, *argv)
    assert outcome.code == 2, outcome.stderr
    assert says in outcome.stderr
    assert not re.search(r"\^\[|\$alt=json|Traceback", outcome.stderr)


@pytest.mark.parametrize("config", ["config_latin1.toml", "config_binary.toml", "config_inf.toml", "config_nan.toml",
                                    "config_huge.toml", "config_deep.toml", "config_ftp_store.toml",
                                    "config_price_inf.toml", "config_bad_zone.toml", "config_unknown.toml"])
def test_a_bad_config_file_is_refused_by_every_command_that_reads_it(sandbox: Sandbox, config: str) -> None:
    for argv in (["doctor", "--json"], ["status"]):
        outcome = tpuops(sandbox, "--config", corpus(config), *argv)
        assert outcome.code == 2 and config in outcome.stderr, outcome.stderr


def test_a_typo_in_a_config_key_gets_a_did_you_mean(sandbox: Sandbox) -> None:
    outcome = tpuops(sandbox, "--config", corpus("config_unknown.toml"), "status")
    assert "did you mean 'provider'?" in outcome.stderr


def test_a_yaml_error_names_line_and_column(sandbox: Sandbox) -> None:
    outcome = tpuops(sandbox, "train", corpus("bad_syntax.yaml"), "--dry-run")
    assert re.search(r"bad_syntax\.yaml:\d+:\d+: not valid YAML", outcome.stderr), outcome.stderr


def test_init_labels_are_written_and_a_refused_init_writes_nothing(sandbox: Sandbox) -> None:
    target = sandbox.root / "work" / "new.toml"
    assert tpuops(sandbox, "init", "--label", "team=alpha", "--path", str(target)).code == 0
    assert 'team = "alpha"' in target.read_text()
    refused = sandbox.root / "work" / "gcp.toml"
    assert tpuops(sandbox, "init", "--provider", "gcp", "--path", str(refused)).code == 2
    assert not refused.exists()
    retried = tpuops(sandbox, "init", "--provider", "gcp", "--project", "p-1", "--store", "gs://b/x",
                     "--path", str(refused))
    assert retried.code == 0 and refused.exists()


DIGITS_FEATURES = {"image": {"kind": "float", "dtype": "float32", "shape": [8, 8, 1]},
                   "label": {"kind": "int64", "dtype": "int64", "shape": []}}


def _dataset(sandbox: Sandbox, name: str, records: int, features: dict | None = None) -> str:
    """A dataset manifest in the sandbox's working folder (enough to plan, not to train); its reference."""
    folder = sandbox.root / "work" / "data" / name
    folder.mkdir(parents=True)
    shards = [{"name": "s.tfrecord", "records": records, "bytes": 1, "crc32c": "AAAAAA=="}] if records else []
    (folder / "manifest.json").write_text(json.dumps({
        "format": "tpuops.dataset/1", "created": "2024-05-01T12:00:00Z", "records": records, "bytes": 1,
        "shards": shards, "source": {"format": "npz", "path": "x.npz", "description": "some"},
        "features": DIGITS_FEATURES if features is None else features}))
    return f"data/{name}"


def test_infer_refuses_an_empty_checkpoint_directory_before_any_node(sandbox: Sandbox) -> None:
    empty = sandbox.root / "empty"
    empty.mkdir()
    outcome = tpuops(sandbox, "infer", SPEC, "--checkpoint", str(empty), "--input", _dataset(sandbox, "x", 10))
    assert outcome.code == 2 and "holds neither a SavedModel" in outcome.stderr
    assert "cannot reach" not in outcome.stderr  # refused before the API was called


@pytest.mark.parametrize(("fault", "value", "said"), [
    ("latency_s", float("nan"), "latency_s = nan is not a finite number"),
    ("latency_s", float("inf"), "latency_s = inf is not a finite number"),
    ("gcs_latency_ms", -5.0, "gcs_latency_ms = -5.0 is outside [0, 60000]"),
    ("preempt_rate_per_s", -0.1, "preempt_rate_per_s = -0.1 is outside [0, 100]"),
    ("error_rate", float("nan"), "error_rate = nan is not a finite number"),
    ("error_burst", 2.5, "error_burst = 2.5 is not a whole number"),
    ("seed", True, "seed = True is not a whole number"),
    ("error_code", 404, "error_code must be one of [429, 500, 503], not 404"),
    pytest.param("error_burst", 10**5000, "error_burst = an integer of 16610 bits is outside [0, 1e+06]",
                 id="error_burst-huge"),
    ("stockout_zones", "us-central1-a", "stockout_zones must be a list of strings"),
])
def test_a_python_caller_gets_the_admin_apis_one_line_for_a_bad_fault(fault: str, value: object, said: str) -> None:
    """AdminClient refuses, in the emulator's words, before it reaches for the (here unreachable) server."""
    from tpuops.core.errors import InvalidRequest
    from tpuops.emulator.control import AdminClient

    with pytest.raises(InvalidRequest) as refused:
        AdminClient("http://127.0.0.1:1", timeout_s=0.5).set_faults(**{fault: value})
    assert str(refused.value) == said + "."


def test_an_unreachable_endpoint_is_one_line_naming_it(sandbox: Sandbox) -> None:
    outcome = tpuops(sandbox, "status")
    assert outcome.code == 1
    [line] = outcome.stderr.strip().splitlines()
    assert re.search(r"cannot reach the Cloud TPU API at 127\.0\.0\.1:\d+ \(connection refused", line)


def test_down_all_asks_on_stderr_and_a_no_is_not_an_error(sandbox: Sandbox) -> None:
    outcome = tpuops(sandbox, "down", "--all", "--json", stdin="n\n")
    assert outcome.code == 0 and outcome.stdout == ""
    assert "delete every tpuops node" in outcome.stderr and "nothing deleted" in outcome.stderr


def test_emulator_status_exits_alike_with_and_without_json(sandbox: Sandbox) -> None:
    plain = tpuops(sandbox, "emulator", "status")
    as_json = tpuops(sandbox, "emulator", "status", "--json")
    assert plain.code == as_json.code == 1
    assert json.loads(as_json.stdout)["running"] is False


def test_an_empty_npz_is_bad_input_not_an_abort(sandbox: Sandbox) -> None:
    empty = sandbox.root / "empty.npz"
    empty.write_bytes(b"")
    outcome = tpuops(sandbox, "data", "convert", str(empty), "-f", "npz", "-o", str(sandbox.root / "out"))
    assert outcome.code == 2 and "not a readable .npz archive" in outcome.stderr


def test_version(sandbox: Sandbox) -> None:
    outcome = tpuops(sandbox, "--version")
    assert outcome.code == 0 and re.fullmatch(r"tpuops \d+\.\d+\.\d+\S*\n", outcome.stdout)


def _user_bus() -> bool:
    try:
        return subprocess.run(["systemctl", "--user", "show-environment"], check=False, capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.skipif(_user_bus(), reason="a systemd user bus answers here: the install would succeed for real")
def test_schedule_install_systemd_without_a_user_bus_writes_no_unit(sandbox: Sandbox) -> None:
    sandbox.env["XDG_CONFIG_HOME"] = str(sandbox.root / "xdg")
    for argv in (["schedule", "install", "--systemd", "--dry-run"], ["schedule", "install", "--systemd"]):
        outcome = tpuops(sandbox, *argv)
        assert outcome.code == 1 and "systemctl --user" in outcome.stderr
    assert not (sandbox.root / "xdg").exists()
    assert not list((sandbox.root / "home").rglob("pass.sh"))


# A stand-in for systemctl, first on PATH: the real one cannot enable anything here (no user bus, and a
# user systemd instance does not start in this container), so the one outcome the rollback is for,
# a bus that answers and an enable that fails, is played by this script. It answers like systemctl
# does, notes each call and what unit files exist at that moment, and refuses `enable`.
FAILING_SYSTEMCTL = """#!/bin/sh
echo "$* | $(ls "$XDG_CONFIG_HOME/systemd/user" 2>/dev/null | tr '\\n' ' ')" >> "$SYSTEMCTL_LOG"
case "$*" in
  *enable*) echo "Failed to enable unit: Unit tpuops-reconcile.timer is masked." >&2; exit 1 ;;
esac
exit 0
"""


def test_schedule_install_systemd_rolls_back_when_enable_fails(sandbox: Sandbox) -> None:
    """The units and the script are written, enabling fails: all of it is removed, status says not installed."""
    stand_in, log = sandbox.root / "bin", sandbox.root / "systemctl.log"
    stand_in.mkdir()
    (stand_in / "systemctl").write_text(FAILING_SYSTEMCTL)
    (stand_in / "systemctl").chmod(0o755)
    sandbox.env.update(XDG_CONFIG_HOME=str(sandbox.root / "xdg"), SYSTEMCTL_LOG=str(log),
                       PATH=f"{stand_in}{os.pathsep}{os.environ['PATH']}")
    before = sandbox.listing()
    outcome = tpuops(sandbox, "schedule", "install", "--systemd")
    [line] = outcome.stderr.strip().splitlines()
    assert outcome.code == 1 and "systemctl --user enable --now tpuops-reconcile.timer" in line and "masked" in line
    calls = log.read_text().splitlines()
    assert [call.split(" | ")[0] for call in calls] == [
        "--user show-environment", "--user daemon-reload", "--user enable --now tpuops-reconcile.timer"]
    assert calls[-1].split(" | ")[1].split() == ["tpuops-reconcile.service", "tpuops-reconcile.timer"]  # written
    assert not list((sandbox.root / "xdg").rglob("tpuops-reconcile.*"))  # then removed
    assert not list((sandbox.root / "home").rglob("pass.sh"))
    assert sandbox.listing() - before == {"systemctl.log"}  # nor the folders the install made for them
    status = json.loads(tpuops(sandbox, "schedule", "status", "--json").stdout)
    assert (status["systemd_timer"], status["script"]) == (False, None)


def _sweep_world(sandbox: Sandbox, budget: str) -> Path:
    """A sweep spec over digits_cnn with the digits manifests in the sandbox (enough to plan, not to train)."""
    work = sandbox.root / "work"
    for part in ("train", "test"):
        _dataset(sandbox, f"digits/{part}", 1437)
    spec = work / "s.yaml"
    spec.write_text((REPO / "sweeps" / "digits_lr.yaml").read_text()
                    .replace("../experiments/digits_cnn.yaml", SPEC).replace("budget_usd: 10", f"budget_usd: {budget}"))
    return spec


def test_a_sweep_whose_budget_cannot_pay_one_trial_is_refused_before_anything_is_written(sandbox: Sandbox) -> None:
    spec = _sweep_world(sandbox, "0.0001")
    for argv in (["sweep", "start", str(spec), "--dry-run"], ["sweep", "start", str(spec)]):
        outcome = tpuops(sandbox, *argv)
        assert outcome.code == 2 and "cannot pay for one trial" in outcome.stderr, outcome.stderr
    assert not (sandbox.root / "store").exists()


def test_dry_run_refuses_a_sweep_name_the_store_has_already(sandbox: Sandbox) -> None:
    spec = _sweep_world(sandbox, "10")
    (sandbox.root / "store" / "sweeps" / "digits-lr").mkdir(parents=True)
    (sandbox.root / "store" / "sweeps" / "digits-lr" / "sweep.json").write_text("{}")
    outcome = tpuops(sandbox, "sweep", "start", str(spec), "--dry-run")
    assert outcome.code == 2 and "exists already" in outcome.stderr, outcome.stderr


# -- issue 30: what the control plane knows is refused before any node (train, infer, sweep start, dry or not) --


def _experiment(sandbox: Sandbox, name: str, **changes: object) -> str:
    """digits_cnn.yaml with ``changes`` (a value None drops the key; ``dataset`` keys merge), beside its model code,
    reading the sandbox's digits manifests."""
    import yaml

    folder = sandbox.root / "work" / "experiments"
    for module in ("models.py", "regression.py"):
        if not (folder / module).exists():
            shutil.copy(REPO / "experiments" / module, folder / module)
    for part in ("train", "test"):
        if not (sandbox.root / "work" / "data" / "digits" / part).exists():
            _dataset(sandbox, f"digits/{part}", 1437)
    spec = yaml.safe_load((REPO / "experiments" / "digits_cnn.yaml").read_text())
    for key, value in changes.items():
        if key == "dataset":
            assert isinstance(value, dict)
            spec["dataset"] = {k: v for k, v in {**spec["dataset"], **value}.items() if v is not None}
        elif value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    return f"experiments/{name}.yaml"  # the cases run in the sandbox's working folder


PLANNED_WRONG = [  # (changes to digits_cnn.yaml, what the one line must say)
    ({"seed": -5}, "seed = -5 is not allowed"),
    ({"seed": 2**63 - 1}, "seed = 9223372036854775807 is not allowed: Input should be less than or equal to "
                          "4294967295"),
    ({"steps": 2**63 - 1}, "steps = 9223372036854775807 is not allowed: Input should be less than or equal to "
                           "1000000000000"),
    ({"target": {"metric": "mae", "at_most": 1}},
     "target.metric = 'mae' is not an eval metric this run measures: the built-in loop measures eval.metrics = "
     "[accuracy, loss]"),
    ({"eval": {"metrics": ["top5_accuracy"]}}, "target.metric = 'accuracy' is not an eval metric this run measures"),
    ({"target": {"metric": "accuracy", "at_least": 0.9, "at_most": 0.1}}, "at_least 0.9 is above at_most 0.1"),
    ({"target": {"metric": "accuracy"}}, "a target needs at_least or at_most"),
    ({"dataset": {"eval": None}}, "target.metric = 'accuracy' cannot be measured: a run evaluates only on "
                                  "dataset.eval"),
    ({"dataset": {"eval": "data/wide"}}, "feature 'image' is float32 of shape [16, 16, 1], but float32 of shape "
                                         "[8, 8, 1] in dataset.train data/digits/train"),
    ({"dataset": {"eval": "data/unlabelled"}}, "dataset.eval data/unlabelled has no feature 'label'"),
    ({"dataset": {"train": "data/empty"}}, "dataset 'data/empty': its manifest.json says 0 records"),
    ({"batch": {"per_replica": 100000}}, "batch.per_replica = 100000 (800000 over 8 replicas) is more than the 1437 "
                                         "records of dataset.train data/digits/train"),
    ({"batch": {"global": 2048}}, "batch.global = 2048 is more than the 1437 records"),
]


@pytest.mark.parametrize(("changes", "says"), PLANNED_WRONG, ids=[says[:50] for _, says in PLANNED_WRONG])
def test_what_the_control_plane_knows_is_refused_before_anything_is_declared(sandbox: Sandbox, changes: dict,
                                                                            says: str) -> None:
    """Each of these was accepted and failed on a node (or never said): now one line, exit 2, for the dry run and
    the real one alike, with nothing uploaded or declared in the store, and the Cloud TPU API never reached (it
    refuses every connection here: reaching it would be exit 1, "cannot reach")."""
    _dataset(sandbox, "wide", 360, {**DIGITS_FEATURES, "image": {**DIGITS_FEATURES["image"], "shape": [16, 16, 1]}})
    _dataset(sandbox, "unlabelled", 360, {"image": DIGITS_FEATURES["image"]})
    _dataset(sandbox, "empty", 0)
    spec = _experiment(sandbox, "wrong", **changes)
    for argv in (["train", spec, "--dry-run"], ["train", spec]):
        outcome = tpuops(sandbox, *argv)
        [line] = outcome.stderr.strip().splitlines()[-1:]
        assert outcome.code == 2 and says in line and line.startswith("error: "), outcome.stderr
        assert "cannot reach" not in outcome.stderr
    assert not (sandbox.root / "store").exists()


def _run_record(run_id: str, accelerator: str = "v3-8", zone: str = "us-central1-a") -> RunRecord:
    """A training run as ``declare`` writes it (its node request planned, never created)."""
    from tpuops.config import Settings
    from tpuops.launch.provision import plan_up
    from tpuops.runs import NodeSpec, RunKind, RunRecord

    up = plan_up(Settings(zones=[zone]), run_id, accelerator=accelerator, capacity=Capacity.SPOT, zone=None,
                 run_id=run_id)
    return RunRecord(run_id=run_id, kind=RunKind.TRAIN, node=NodeSpec.of(up.request, up.zones))


def test_infer_refuses_an_empty_input_and_a_run_without_a_checkpoint_before_anything_is_declared(
        sandbox: Sandbox) -> None:
    """An input whose manifest says 0 records, and ``--checkpoint RUN`` for a run that never saved: each was found
    out on a node after its boot. Now one line, exit 2, and the store holds only the run that was there."""
    from tpuops import runs
    from tpuops.runs import AgentStatus, Phase
    from tpuops.store import LocalStore

    store = LocalStore(sandbox.root / "store")
    runs.declare(store, _run_record("early"), {"run_id": "early"})
    runs.write_status(store, "early", AgentStatus(run_id="early", phase=Phase.TRAINING, step=40, total_steps=600))
    before = sorted(info.key for info in store.list(""))
    spec = _experiment(sandbox, "infer")
    cases = ((["--checkpoint", "early", "--input", "data/digits/test"],
              "--checkpoint early: the run has no SavedModel and no checkpoint yet (training, step 40)"),
             (["--checkpoint", "early", "--input", _dataset(sandbox, "none", 0)],
              "dataset 'data/none': its manifest.json says 0 records"))
    for args, says in cases:
        for dry in (["--dry-run"], []):
            outcome = tpuops(sandbox, "infer", spec, *args, *dry)
            [line] = outcome.stderr.strip().splitlines()[-1:]
            assert outcome.code == 2 and says in line, outcome.stderr
    assert sorted(info.key for info in store.list("")) == before


def test_infer_from_a_run_plans_once_it_has_a_checkpoint(sandbox: Sandbox) -> None:
    """The same check passes once the run's agent saved step 100 (its index file is what makes it restorable)."""
    from tpuops import runs
    from tpuops.config import Settings
    from tpuops.core.errors import UsageError
    from tpuops.launch import jobs
    from tpuops.store import LocalStore

    settings = Settings(zones=["us-central1-a"], home=sandbox.root / "home", store=str(sandbox.root / "store"))
    store = LocalStore(sandbox.root / "store")
    runs.declare(store, _run_record("saved"), {"run_id": "saved"})
    spec = sandbox.root / "work" / _experiment(sandbox, "infer")

    def plan() -> jobs.JobPlan:
        return jobs.plan_infer(settings, spec, store, checkpoint="saved", inputs="data/digits/test",
                               base_dir=sandbox.root / "work", open_uri=lambda uri: open_uri(settings, uri))

    store.write_bytes("runs/saved/ckpt/ckpt-100.data-00000-of-00001", b"")
    with pytest.raises(UsageError, match="no SavedModel and no checkpoint yet"):
        plan()
    store.write_bytes("runs/saved/ckpt/ckpt-100.index", b"")
    assert plan().spec.require_infer().model == store.uri_of("runs/saved/ckpt")


@pytest.mark.parametrize(("change", "says"), [
    (("experiments/digits_cnn.yaml", "experiments"), "experiment = 'experiments' is a folder"),
    (("seed: 7", "seed: -1"), "sampler.seed = -1 is not allowed"),
    (("metric: accuracy", "metric: mae"), "objective.metric = 'mae' is not an eval metric this run measures"),
])
def test_a_sweep_that_cannot_run_is_refused_in_one_line(sandbox: Sandbox, change: tuple[str, str], says: str) -> None:
    spec = _sweep_world(sandbox, "10")
    (sandbox.root / "work" / "experiments" / "models.py").write_text((REPO / "experiments" / "models.py").read_text())
    spec.write_text(spec.read_text().replace(SPEC, "experiments/digits_cnn.yaml").replace(*change))
    for argv in (["sweep", "start", str(spec), "--dry-run"], ["sweep", "start", str(spec)]):
        outcome = tpuops(sandbox, *argv)
        [line] = outcome.stderr.strip().splitlines()[-1:]
        assert outcome.code == 2 and says in line, outcome.stderr
    assert not (sandbox.root / "store").exists()


@pytest.mark.parametrize(("argv", "says"), [
    (["up", "s1", "--accelerator", "v3-32", "--runtime", "tpu-vm-tf-2.9.1", "--zone", "europe-west4-a"],
     "runtime version 'tpu-vm-tf-2.9.1' does not fit accelerator 'v3-32' (v3, a multi-host slice): "
     "use 'tpu-vm-tf-2.9.1-pod'"),
    (["up", "s1", "--accelerator", "v3-32", "--zone", "us-central1-a"],
     "slice 'v3-32' is not offered in us-central1-a: europe-west4-a offers it"),
    (["up", "s1", "--accelerator", "v3-32"],
     "slice 'v3-32' is not offered in us-central1-a, us-central1-b: europe-west4-a offers it"),
], ids=["single-host runtime on a slice", "slice the zone lacks", "slice no configured zone offers"])
def test_a_slice_that_cannot_be_made_is_refused_before_the_api(sandbox: Sandbox, argv: list[str], says: str) -> None:
    """Each once went to the Cloud TPU API (here unreachable) or planned a create in a zone that refuses it."""
    for dry in (["--dry-run"], []):
        outcome = tpuops(sandbox, *argv, *dry)
        assert outcome.code == 2 and says in outcome.stderr, outcome.stderr
        assert "cannot reach" not in outcome.stderr
    assert not (sandbox.root / "store").exists()


def test_a_worker_a_slice_does_not_have_is_refused_in_one_line(sandbox: Sandbox) -> None:
    from tpuops import runs
    from tpuops.store import LocalStore

    store = LocalStore(sandbox.root / "store")
    runs.declare(store, _run_record("pod", accelerator="v3-32", zone="europe-west4-a"), {"run_id": "pod"})
    before = sorted(info.key for info in store.list(""))
    for argv in (["logs", "pod", "--worker", "7"], ["logs", "pod", "--worker", "-1"]):
        outcome = tpuops(sandbox, *argv)
        [line] = outcome.stderr.strip().splitlines()
        assert outcome.code == 2 and line.endswith("run pod is a v3-32 with 4 hosts; give 0-3 or all"), line
    assert tpuops(sandbox, "logs", "pod", "--worker", "all").code == 0
    assert sorted(info.key for info in store.list("")) == before
