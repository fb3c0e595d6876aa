"""The wake-up without a server: the control plane's ``Waker`` over a local store, the agent's marker and
Cloud Run request as the control plane reads them, and the simulator's model of it (virtual time)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import settings_at

from tests.sim.test_simulate import ZONES, _record
from tpuops import runs
from tpuops.agent import wake as agent_wake
from tpuops.contract.wake import marker_text
from tpuops.controller.reconcile import PassReport
from tpuops.controller.wake import CLOCK_SKEW_S, Waker
from tpuops.core.naming import MetadataKey
from tpuops.providers.cloud_model import CloudModel, Latency
from tpuops.runs import Memory, layout
from tpuops.sim.engine import Simulation, WakeUp
from tpuops.sim.model import AgentModel, Segments
from tpuops.store import LocalStore

pytestmark = pytest.mark.unit

NOW = 2_000_000_000.0


def _marker(store: LocalStore, run_id: str, at: float) -> None:
    """A marker as the agent writes it (``tpuops.agent.wake.write_marker``, which needs TensorFlow)."""
    store.write_bytes(layout.wake_key(run_id), marker_text(run_id, 1, at).encode())


def _active(store: LocalStore, run_id: str, memory: Memory) -> None:
    store.write_bytes(layout.INDEX_ACTIVE + run_id, b"")
    runs.save_memory(store, run_id, memory, runs.load_memory(store, run_id)[1])


def test_the_marker_key_and_the_metadata_key_have_one_definition_each() -> None:
    assert layout.wake_key("r1") == agent_wake.marker_key("r1") == "wake/r1"
    assert MetadataKey.WAKE_JOB.value == agent_wake.WAKE_JOB_ATTRIBUTE


def test_the_cloud_run_request_is_jobs_run_on_the_named_job_with_the_token() -> None:
    request = agent_wake.run_request("projects/p-1234/locations/us-central1/jobs/tpuops-reconcile", "tok")
    assert request.get_method() == "POST"
    assert request.full_url == ("https://run.googleapis.com/v2/projects/p-1234/locations/us-central1/jobs/"
                                "tpuops-reconcile:run")
    assert request.get_header("Authorization") == "Bearer tok" and request.data == b"{}"
    with pytest.raises(ValueError, match="projects/P/locations/R/jobs/J"):
        agent_wake.run_request("tpuops-reconcile", "tok")


def test_fresh_returns_recent_markers_and_deletes_stale_ones(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    _marker(store, "recent", NOW - 5)
    _marker(store, "stale", NOW - 600)
    store.write_bytes(layout.wake_key("torn"), b"{not json")
    waker = Waker(store, clock=lambda: NOW)
    assert [m.run_id for m in waker.fresh()] == ["recent"]
    assert [o.key for o in store.list(layout.WAKE)] == ["wake/recent"]


def test_wait_returns_at_once_on_a_marker_and_empty_after_its_time_without_one(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            _marker(store, "r1", NOW)

    waker = Waker(store, clock=lambda: NOW, sleep=sleep, poll_s=1.0)
    assert [m.run_id for m in waker.wait(3600)] == ["r1"]
    assert slept == [1.0, 1.0, 1.0], "it looked every poll interval and stopped at the marker"
    store.delete(layout.wake_key("r1"))
    assert Waker(store, clock=lambda: NOW, sleep=lambda _s: None, poll_s=0.001).wait(0.01) == []


class _Passes:
    """Stands in for the controller: its third pass replaces the run's node (a create event, as ``decide`` writes)."""

    def __init__(self, store: LocalStore, run_id: str) -> None:
        self.store, self.run_id, self.count = store, run_id, 0

    def run_pass(self) -> PassReport:
        self.count += 1
        if self.count == 3:
            memory, generation = runs.load_memory(self.store, self.run_id)
            memory.event(NOW + 31, "create", "attempt 2 in us-central1-a: replacing the preempted node")
            runs.save_memory(self.store, self.run_id, memory, generation)
        return PassReport()


def test_hurry_passes_at_the_pace_until_the_run_is_replaced_then_deletes_the_marker(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    old = Memory()
    old.event(NOW - 3000, "create", "attempt 1")  # the first node's create, long before the notice
    _active(store, "r1", old)
    _marker(store, "r1", NOW)
    slept: list[float] = []
    waker = Waker(store, clock=lambda: NOW + 10, sleep=slept.append, pace_s=2.0)
    passes = _Passes(store, "r1")
    reports: list[PassReport] = []
    assert waker.hurry(passes, waker.fresh(), reports.append) == 3  # type: ignore[arg-type]
    assert len(reports) == 3 and len(slept) == 2 and all(0 < s <= 2.0 for s in slept)
    assert not store.list(layout.WAKE)


def test_hurry_gives_up_after_the_window_and_a_finished_run_is_handled(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    _active(store, "r1", Memory())
    _marker(store, "r1", NOW)
    late = Waker(store, clock=lambda: NOW + 61, sleep=lambda _s: None)
    assert late.hurry(_Passes(store, "other"), [m for m in Waker(store, clock=lambda: NOW).fresh()]) == 1  # type: ignore[arg-type]
    _marker(store, "r2", NOW)
    waker = Waker(store, clock=lambda: NOW)
    (marker,) = waker.fresh()
    assert marker.run_id == "r2" and waker.handled(marker), "a run out of the active index is over"
    skewed = Memory()
    skewed.event(NOW - CLOCK_SKEW_S + 1, "create", "a create a VM clock ahead makes look earlier")
    _active(store, "r2", skewed)
    assert waker.handled(marker)


def test_dropping_a_finished_run_from_the_index_drops_its_marker(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    _active(store, "r1", Memory())
    _marker(store, "r1", NOW)
    runs.drop_active(store, "r1")
    assert not store.list(layout.WAKE) and not store.list(layout.INDEX_ACTIVE)


def test_a_wake_pass_comes_at_the_first_hurried_pass_after_the_node_s_end() -> None:
    wake = WakeUp(delay_s=1.0, pace_s=2.0)
    assert wake.pass_at(notice=100.0, end=130.0, save_s=10.0) == 131.0  # marker 110, first pass 111, then 113...
    assert WakeUp(delay_s=20.0).pass_at(notice=100.0, end=130.0, save_s=10.0) == 130.0
    assert wake.pass_at(notice=100.0, end=130.0, save_s=40.0) is None, "killed before its save: no marker"
    with pytest.raises(ValueError):
        WakeUp(pace_s=0)


def test_the_wake_up_shortens_time_to_result_at_equal_preemptions_in_the_simulator(tmp_path: Path) -> None:
    job = AgentModel(total_steps=4 * 3600 * 10, steps_per_s=10,
                     segments=Segments(setup_s=120, checkpoint_every_s=600, save_s=10, restore_s=20))
    cloud = CloudModel(spot_hazard_per_hour=0.0, lifetime=Latency(3600.0, 0.0))
    results = {}
    for label, wake in (("cron", None), ("wake", WakeUp())):
        settings = settings_at(tmp_path / label, zones=ZONES)
        sim = Simulation(settings, tmp_path / label / "world", cloud, job, cron_s=300, seed=1, wake=wake)
        sim.declare([_record(settings, "day")])
        (results[label],) = sim.run(max_hours=24).runs
    cron, woken = results["cron"], results["wake"]
    assert cron.preemptions == woken.preemptions >= 3
    assert cron.outcome == woken.outcome == "succeeded"
    assert woken.hours_to_result is not None and cron.hours_to_result is not None
    assert woken.hours_to_result < cron.hours_to_result


def test_infra_lets_the_vm_account_run_the_reconcile_job_and_nothing_else() -> None:
    """Read the Terraform as text (no provider can be downloaded here, so ``terraform validate`` cannot run)."""
    import re

    from helpers import REPO

    module = (REPO / "infra" / "modules" / "reconcile" / "main.tf").read_text()
    blocks = re.findall(r'^resource "([^"]+)" "([^"]+)" \{\n(.*?)^\}', module, re.MULTILINE | re.DOTALL)
    granted = [(kind, body) for kind, _name, body in blocks if "var.vm_account_email" in body]
    assert len(granted) == 1, "one binding for the VMs' account in the module"
    kind, body = granted[0]
    assert kind == "google_cloud_run_v2_job_iam_member"
    assert 'role     = "roles/run.invoker"' in body and "google_cloud_run_v2_job.reconcile.name" in body
    root = (REPO / "infra" / "main.tf").read_text()
    assert "vm_account_email = google_service_account.vm.email" in root
    assert "run." not in " ".join(re.findall(r'role\s*=\s*"([^"]+)"', root)), "no Cloud Run role at project level"


# -- calibration (tpuops.sim.calibrate): the scoring, and the profile a real run gives ------------------------


def test_score_counts_runs_inside_both_bands_and_the_median_error_against_p50() -> None:
    from tpuops.sim.calibrate import Measured, Predicted, score
    from tpuops.sim.forecast import Band

    predicted = Predicted(seconds=Band(10.0, 20.0, 30.0), usd=Band(1.0, 2.0, 3.0), preemptions=1.0, simulated=100)
    runs_ = [Measured("a", 20.0, 2.0, 0), Measured("b", 25.0, 3.5, 1), Measured("c", 40.0, 2.5, 2)]
    scored = score(runs_, predicted)
    assert (scored.inside, scored.seconds_inside, scored.usd_inside) == (1, 2, 2)
    assert scored.median_abs_error_seconds == pytest.approx(0.2)  # 0, 5/25, 20/40
    assert scored.median_abs_error_usd == pytest.approx(0.2)  # 0, 1.5/3.5, 0.5/2.5
    free = score([Measured("a", 20.0, 0.0, 1), Measured("b", 20.0, 2.0, 0)], predicted)
    assert free.median_abs_error_usd == pytest.approx(0.5)  # a free run counts in full against its p50: 1, 0


def test_coverage_p_is_the_binomial_chance_of_so_few_inside_for_an_exact_forecast() -> None:
    from tpuops.sim.calibrate import coverage_p

    assert coverage_p(20, 20) == pytest.approx(1.0)
    assert coverage_p(15, 20) == pytest.approx(0.3704, abs=1e-4)  # "16 of 20" fails 37 % of exact sessions
    assert coverage_p(3, 10) == pytest.approx(0.000864, abs=1e-6)


def test_the_self_delete_is_timed_from_the_agent_s_end_to_the_node_s_delete_and_fitted_log_normal() -> None:
    from tpuops.runs import AgentStatus
    from tpuops.runs.models import AttemptTime
    from tpuops.sim.calibrate import fit, self_delete_of

    status = AgentStatus(run_id="r", attempt=1, step=300, exit_class="succeeded",
                         attempts=[AttemptTime(attempt=1, first_step_at=110.0, ended_at=125.0)])
    assert self_delete_of(status, 125.5, "deleted") == pytest.approx(0.5)
    assert self_delete_of(status, 126.0, "preempted") is None  # preempted first: no delete to time
    assert self_delete_of(status.model_copy(update={"exit_class": "crashed"}), 126.0, "deleted") is None
    fitted = fit([0.5, 1.0, 2.0])
    assert fitted.median_s == 1.0 and fitted.sigma == pytest.approx(0.6931, abs=1e-4)  # the logs' stdev: ln 2
    assert fit([]) == Latency(0.0, 0.0)


def test_a_run_s_profile_is_its_last_attempt_from_its_ready_and_the_session_measures_the_cloud_around_it() -> None:
    from tpuops.runs import AgentStatus
    from tpuops.runs.models import AttemptTime
    from tpuops.sim.calibrate import ReadyInterval, Session, measured_of, profile_of

    memory = Memory()
    memory.event(100.0, "create", "attempt 1")
    memory.event(130.0, "create", "attempt 2")
    status = AgentStatus(run_id="r", attempt=2, step=300, recomputed_steps=20, resumed_from_step=40,
                         exit_class="succeeded", attempts=[
        AttemptTime(attempt=1, loaded_at=120.0, first_step_at=None, ended_at=121.0),
        AttemptTime(attempt=2, loaded_at=139.0, first_step_at=141.0, ended_at=170.0, productive_s=20.0,
                    eval_s=0.5, save_s=0.5)])
    nodes = [ReadyInterval(100.5, 122.0, "preempted"), ReadyInterval(131.0, 170.5, "deleted")]
    profile = profile_of(status, [node.ready_at for node in nodes])
    assert profile is not None and profile.attempt == 2 and profile.offset_s == pytest.approx(30.5)
    assert profile.pace.setup_s == pytest.approx(10.0)  # its READY to its first completed step
    assert profile.pace.listen_s == pytest.approx(8.0)  # its READY to its model built and restored
    assert profile.pace.final_s == pytest.approx(1.0)  # the final evaluation and SavedModel
    assert profile.pace.steps_per_s == pytest.approx(260 / 28.0)  # its 260 steps over first step -> end less final
    assert profile_of(status, [100.5]) is None  # attempts that do not line up with the nodes
    measured = measured_of("r", status, memory, 0.01)
    assert measured is not None and measured.seconds == pytest.approx(70.0) and measured.usd == 0.01
    assert profile_of(status.model_copy(update={"exit_class": "preempted"}), [100.5, 131.0]) is None

    session = Session()
    session.add("r", status, memory, nodes, 0.01)
    assert session.profiles == [profile] and session.measured == [measured]
    assert session.ready_s == [pytest.approx(0.5)] and session.replacement_ready_s == [pytest.approx(1.0)]
    assert session.exit_s == [pytest.approx(2.0)]  # a notice during the import: from its loaded_at to the end
    assert session.recovery_s == [pytest.approx(8.0)]  # the preempted node's end to the replacement's create
    assert session.self_delete_s == [pytest.approx(0.5)]
    cloud = session.cloud(0.5, 30.0)
    assert cloud.ends_with_agent and cloud.notice_s == 30.0 and cloud.spot_hazard_per_hour == 30.0
    assert cloud.replacement_ready is not None and cloud.replacement_ready.median_s == pytest.approx(1.0)
