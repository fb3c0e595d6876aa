"""The seam is neutral: a provider of another vocabulary (``provider_jobset``: TPUs on GKE as JobSet manifests),
added by one module and one registry line, plans, creates, recovers and ends a run like the Cloud TPU one.

Nothing of tpuops is changed for it: its registry line (``test_provider_contract.JOBSET``) is put in with
``monkeypatch.setitem`` (the registry's ``PROVIDERS`` dict is the registration hook; no other is needed), the
settings name it (``node_provider = "jobset"``), and the real
configuration, session, fleet, store, ledger, leases and controller do the rest. What the cluster does (pods
running, a worker's pod failing, a spot eviction) is said in its own words; the controller sees only the neutral
``NodeState``, ``hosts`` and ``unhealthy_workers``. The slice scenarios the emulator runs with real TF
(``test_slice_*.py``: a slice created, a worker that dies, a slice-wide preemption, the recovery, the cost of
its chips) run here on a v4-16, a JobSet of 2 pods, priced by the provider's own offers.
``tests/providers/test_provider_contract.py`` holds the same provider to the contract every provider keeps.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import pytest
from provider_jobset import ACCELERATOR, GKE, PRICES, SPOT, TOPOLOGY, JobSetProvider

from tests.providers.test_provider_contract import JOBSET
from tpuops import api, runs, session
from tpuops.billing.cost import catalog_for, node_cost
from tpuops.cli.main import run as cli_run
from tpuops.config import Settings
from tpuops.controller.reconcile import Controller
from tpuops.core.clock import UTC
from tpuops.core.errors import UsageError
from tpuops.core.kinds import Capacity
from tpuops.core.naming import MetadataKey
from tpuops.launch.provision import plan_up
from tpuops.providers.cloud_tpu.offers import CLOUD_TPU
from tpuops.providers.nodes import NodeState
from tpuops.providers.registry import PROVIDERS
from tpuops.runs import NodeSpec, Outcome, RunKind, RunRecord

pytestmark = pytest.mark.unit

ZONE = "us-central1-b"
RUN = "js-run"
LIVE = {"command": "train", "attempt": 1, "phase": "training", "step": 10, "total_steps": 1000}
DONE = {**LIVE, "phase": "done", "exit_class": "succeeded", "step": 1000}
MAX_PASSES = 10


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The new provider's one registry line (``JOBSET``), put in for the test."""
    monkeypatch.setitem(PROVIDERS, "jobset", JOBSET)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    config = tmp_path / "tpuops.toml"
    config.write_text(f'node_provider = "jobset"\nzones = ["{ZONE}"]\nstore = "{tmp_path / "store"}"\n'
                      'accelerator = "v4-8"\nlease_ttl_s = 3600.0\nmax_run_hours = 0\n')
    return api.load_settings(config, {"TPUOPS_HOME": str(tmp_path / "home")})


def test_a_dry_run_shows_the_jobset_manifest_through_the_cli(settings: Settings, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TPUOPS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TPUOPS_CONFIG", str(tmp_path / "tpuops.toml"))
    assert cli_run(["up", "js-dry", "--accelerator", "v4-16", "--spot", "--dry-run", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    body = shown["body"]
    assert (body["kind"], body["metadata"]["name"], body["metadata"]["namespace"]) == ("JobSet", "js-dry", ZONE)
    pods = body["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert pods["parallelism"] == 2  # v4-16 spans two hosts: one pod on each
    selector = pods["template"]["spec"]["nodeSelector"]
    assert selector[ACCELERATOR] == "tpu-v4-podslice" and selector[TOPOLOGY] == "2x2x2" and selector[SPOT] == "true"
    container = pods["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["bash", "-c"] and container["command"][2].startswith("#!")
    assert "acceleratorType" not in json.dumps(body)  # nothing of Cloud TPU's REST body


def _declare(settings: Settings, store: Any, accelerator: str = "v4-8") -> None:
    request = plan_up(settings, RUN, accelerator=accelerator, capacity=Capacity.SPOT, zone=ZONE, run_id=RUN).request
    assert MetadataKey.STARTUP_SCRIPT.value in request.metadata
    record = RunRecord(run_id=RUN, kind=RunKind.TRAIN, node=NodeSpec.of(request, [ZONE]), experiment="x")
    runs.declare(store, record, {"version": 1, "run_id": RUN})
    _status(store, LIVE)


def _status(store: Any, fields: dict[str, Any]) -> None:
    store.write_bytes(runs.status_key(RUN), runs.AgentStatus.model_validate(
        {**fields, "run_id": RUN}).model_dump_json().encode())


def _until(controller: Controller, done: Any, what: str) -> None:
    """Reconcile passes until ``done()`` holds (a replacement takes a pass to delete, one to create)."""
    for _ in range(MAX_PASSES):
        controller.run_pass(only=RUN)
        if done():
            return
    raise AssertionError(f"after {MAX_PASSES} passes, still not {what}")


def test_a_run_is_created_preempted_recreated_and_ended_on_the_jobset_provider(settings: Settings) -> None:
    store = session.store(settings)
    fleet = session.fleet(settings)
    cluster = cast(JobSetProvider, fleet.provider)
    assert isinstance(cluster, JobSetProvider)  # opened through the registry, as any command opens its provider
    controller = Controller(settings, store, fleet, billing=fleet.billing, sweeps=None, holder="test",
                            status_refresh_s=0.0)
    _declare(settings, store)

    _until(controller, lambda: (ZONE, RUN) in cluster.jobsets, "created")
    first = cluster.jobsets[(ZONE, RUN)]
    assert first["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["nodeSelector"][SPOT] == "true"
    cluster.pods_ready(ZONE, RUN)
    controller.run_pass(only=RUN)
    seen = fleet.find(ZONE, RUN)
    assert seen is not None and seen.state is NodeState.READY and seen.accelerator == "v4-8"

    cluster.evict(ZONE, RUN)  # GKE reclaims the spot slice
    _until(controller, lambda: (ZONE, RUN) in cluster.jobsets
           and cluster.jobsets[(ZONE, RUN)]["metadata"]["uid"] != first["metadata"]["uid"], "recreated")
    assert runs.load_memory(store, RUN)[0].preemptions == 1
    cluster.pods_ready(ZONE, RUN)
    controller.run_pass(only=RUN)

    _status(store, DONE)
    _until(controller, lambda: runs.load_memory(store, RUN)[0].outcome is not None, "finished")
    memory = runs.load_memory(store, RUN)[0]
    assert memory.outcome is Outcome.SUCCEEDED and memory.preemptions == 1
    _until(controller, lambda: (ZONE, RUN) not in cluster.jobsets, "its JobSet deleted")
    controller.release()


def test_the_dry_run_call_of_the_library_asks_the_configured_provider(settings: Settings) -> None:
    plan = api.plan_up(settings, "js-lib", accelerator="v4-8", capacity=Capacity.ON_DEMAND)
    body = api.create_body(settings, plan)
    selector = body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["nodeSelector"]
    assert SPOT not in selector and selector[TOPOLOGY] == "2x2x1"
    cloud_tpu = api.create_body(settings.model_copy(update={"node_provider": "cloud-tpu"}), plan)
    assert cloud_tpu["acceleratorType"] == "v4-8"  # the same plan, in Cloud TPU's words


def test_the_configured_provider_says_which_accelerators_the_settings_may_name(tmp_path: Path) -> None:
    config = tmp_path / "tpuops.toml"
    config.write_text('node_provider = "jobset"\naccelerator = "v3-8"\n')
    env = {"TPUOPS_HOME": str(tmp_path / "home")}
    with pytest.raises(UsageError) as refused:
        api.load_settings(config, env)
    assert str(refused.value) == (f"{config}: accelerator = 'v3-8' is not allowed: accelerator 'v3-8' has no GKE "
                                  "node pools (TPU v4, v5e, v5p, v6e do)")
    config.write_text('node_provider = "cloud-tpu"\naccelerator = "v3-8"\n')
    assert api.load_settings(config, env).accelerator == "v3-8"  # Cloud TPU has v3


def test_a_zone_flag_is_checked_by_the_configured_provider(settings: Settings) -> None:
    with pytest.raises(UsageError, match="zone 'us-central2-x' has no TPU node pools on GKE"):
        api.plan_up(settings, "js-zone", zone="us-central2-x")
    assert api.plan_up(settings, "js-zone", zone="us-central1-a").zones == ["us-central1-a"]


SLICE = "v4-16"
"""Two hosts of 4 chips (topology 2x2x2): a JobSet of 2 pods."""


@pytest.fixture
def slice_run(settings: Settings) -> tuple[Settings, Any, JobSetProvider, Controller]:
    """A v4-16 run declared on the JobSet provider, its controller, and the cluster (a worker's restart after the
    least grace the settings allow, so that the pass after the one that saw the dead pod acts)."""
    settings = settings.model_copy(update={"unhealthy_grace_s": 1e-6})
    store, fleet = session.store(settings), session.fleet(settings)
    cluster = cast(JobSetProvider, fleet.provider)
    controller = Controller(settings, store, fleet, billing=fleet.billing, sweeps=None, holder="test",
                            status_refresh_s=0.0)
    _declare(settings, store, SLICE)
    _until(controller, lambda: (ZONE, RUN) in cluster.jobsets, "created")
    cluster.pods_ready(ZONE, RUN)
    controller.run_pass(only=RUN)
    return settings, store, cluster, controller


def _uid(cluster: JobSetProvider) -> str:
    return str(cluster.jobsets[(ZONE, RUN)]["metadata"]["uid"]) if (ZONE, RUN) in cluster.jobsets else ""


def test_a_slice_is_one_pod_per_host_and_is_listed_with_its_hosts(
        slice_run: tuple[Settings, Any, JobSetProvider, Controller]) -> None:
    settings, _, cluster, controller = slice_run
    pods = cluster.jobsets[(ZONE, RUN)]["spec"]["replicatedJobs"][0]["template"]["spec"]
    container = pods["template"]["spec"]["containers"][0]
    assert (pods["parallelism"], container["resources"]["limits"]["google.com/tpu"]) == (2, "4")
    assert len(cluster.pods[(ZONE, RUN)]) == 2
    seen = cluster.find_node(ZONE, RUN)
    assert seen is not None and (seen.state, seen.hosts, seen.unhealthy_workers) == (NodeState.READY, 2, ())
    [row] = api.list_runs(settings)
    assert row.hosts == 2  # the runs table asks the provider's offers, not Cloud TPU's catalog
    with pytest.raises(UsageError) as refused:
        api.logs(settings, RUN, worker="2")
    assert str(refused.value) == f"--worker 2: run {RUN} is a {SLICE} with 2 hosts; give 0-1 or all"
    controller.release()


def test_a_workers_pod_that_dies_gets_the_slice_recreated_as_a_restart_naming_it(
        slice_run: tuple[Settings, Any, JobSetProvider, Controller]) -> None:
    _, store, cluster, controller = slice_run
    first = _uid(cluster)
    cluster.pod_fails(ZONE, RUN, 1)
    seen = cluster.find_node(ZONE, RUN)
    assert seen is not None and (seen.state, seen.unhealthy_workers) == (NodeState.READY, (1,))
    _until(controller, lambda: _uid(cluster) not in ("", first), "recreated")
    memory = runs.load_memory(store, RUN)[0]
    assert "worker-down" in [event["kind"] for event in memory.events]
    assert any("worker 1 of the slice unhealthy" in event["message"] for event in memory.events)
    assert (memory.crashes, memory.preemptions) == (1, 0)  # a restart, never a preemption
    assert [pod["status"]["phase"] for pod in cluster.pods[(ZONE, RUN)]] == ["Pending", "Pending"]
    controller.release()


def test_a_slice_wide_eviction_is_one_preemption_and_the_run_recovers_and_ends(
        slice_run: tuple[Settings, Any, JobSetProvider, Controller]) -> None:
    _, store, cluster, controller = slice_run
    first = _uid(cluster)
    cluster.evict(ZONE, RUN)  # GKE reclaims every pod of the spot slice at once
    _until(controller, lambda: _uid(cluster) not in ("", first), "recreated")
    memory = runs.load_memory(store, RUN)[0]
    assert (memory.preemptions, memory.crashes) == (1, 0)
    cluster.pods_ready(ZONE, RUN)
    controller.run_pass(only=RUN)
    _status(store, DONE)
    _until(controller, lambda: runs.load_memory(store, RUN)[0].outcome is not None, "finished")
    assert runs.load_memory(store, RUN)[0].outcome is Outcome.SUCCEEDED
    _until(controller, lambda: (ZONE, RUN) not in cluster.jobsets, "its JobSet deleted")
    controller.release()


def test_a_slice_costs_its_chips_at_the_providers_price_under_its_billing_rule(
        slice_run: tuple[Settings, Any, JobSetProvider, Controller]) -> None:
    settings, _, cluster, controller = slice_run
    cluster.evict(ZONE, RUN)  # within its first minute: free on Cloud TPU, billed on GKE
    controller.run_pass(only=RUN)
    catalog = catalog_for(settings)
    assert catalog.offers is GKE
    [history, *_] = session.open_ledger(settings).histories(settings.project, run_id=RUN)
    cost = node_cost(history, catalog, datetime.now(UTC))
    assert cost.usd_per_hour == 8 * PRICES["chip_hour"]["v4"]["spot"]  # 8 chips at the provider's spot price
    assert not cost.free and cost.ready_seconds > 0
    assert cost.usd == pytest.approx(cost.ready_seconds / 3600 * cost.usd_per_hour)
    assert CLOUD_TPU.preemption_is_free("spot", 0.0, 30.0)  # the same eviction Cloud TPU would not bill
    controller.release()


def test_exec_reaches_every_pod_of_the_slice_with_its_arguments_as_given(
        slice_run: tuple[Settings, Any, JobSetProvider, Controller]) -> None:
    """``exec --worker all`` on the second vocabulary: the session finds the provider's own ``RunsCommands``
    (``kubectl exec`` into each pod), each argument reaches the pod as given, and each pod's exit code comes back;
    a pod that died answers as kubectl does."""
    from tpuops import session

    settings, _, cluster, controller = slice_run
    reach = session.worker_commands(settings, cluster)
    argv = ["sh", "-c", 'echo "$JOB_COMPLETION_INDEX $1"; exit 3', "sh", "a; touch INJECTED"]
    ran = [reach.run_on_worker(ZONE, RUN, worker, argv, timeout_s=30) for worker in (0, 1)]
    assert [(r.code, r.stdout) for r in ran] == [(3, "0 a; touch INJECTED\n"), (3, "1 a; touch INJECTED\n")]
    cluster.pod_fails(ZONE, RUN, 1)
    dead = reach.run_on_worker(ZONE, RUN, 1, ["true"], timeout_s=30)
    assert dead.code == 1 and "phase is Failed" in dead.stderr, dead
    with pytest.raises(UsageError):
        reach.run_on_worker(ZONE, RUN, 2, ["true"], timeout_s=30)
    controller.release()
