"""The dashboard's routes in-process (Starlette's TestClient): the token guard, read-only, CSRF and confirmation,
the runs page painted from the index, and optuna-dashboard over a study in the store journal.

The source is ``tpuops.dashboard.source.bound_source`` over a local store and the in-memory node provider:
real api calls, no server.
"""

from __future__ import annotations

import dataclasses
import stat
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from tests.runs.test_runs import record
from tests.sweeps.test_sweep_template import BEFORE, Work, work  # noqa: F401  (work: the fixture)
from tpuops import runs
from tpuops.config import Settings
from tpuops.core.kinds import Cloud
from tpuops.dashboard.app import Dashboard
from tpuops.dashboard.auth import COOKIE, CSRF_HEADER, csrf_value, issue_token
from tpuops.dashboard.source import bound_source
from tpuops.runs import Outcome
from tpuops.session import store

pytestmark = pytest.mark.unit

TOKEN = "t0ken-for-tests"
GUARDED = [
    ("GET", "/runs"), ("GET", "/runs/r1"), ("GET", "/sweeps"), ("GET", "/sweeps/s1"), ("GET", "/nodes"),
    ("GET", "/cost"), ("GET", "/data/runs?ids=r1"), ("GET", "/data/runs/r1/panel"), ("GET", "/data/sweeps"),
    ("GET", "/data/sweeps/s1"),
    ("GET", "/data/nodes"), ("GET", "/data/cost"), ("GET", "/live/runs"), ("GET", "/live/runs/r1"),
    ("GET", "/sweeps/s1/optuna"), ("GET", "/api/studies"), ("GET", "/dashboard"), ("GET", "/assets/dashboard.js"),
    ("POST", "/actions/sweeps/s1/stop"), ("POST", "/actions/runs/r1/stop"),
    ("POST", "/actions/nodes/us-central1-a/r1/delete"),
]
ACTIONS = [(method, path) for method, path in GUARDED if path.startswith("/actions/")]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(tpu_endpoint=Cloud.GCP, node_provider="memory", project="p", zones=["us-central1-a"],
                    home=tmp_path / "home", store=str(tmp_path / "store"), lease_ttl_s=60.0)


def declare(settings: Settings, run_id: str, sweep: str | None = None) -> None:
    runs.declare(store(settings), record(run_id, sweep=sweep), {"version": 1, "run_id": run_id})


def client(settings: Settings, *, read_only: bool = False, token: str | None = TOKEN) -> TestClient:
    app = Dashboard(bound_source(settings), token=TOKEN, read_only=read_only, refresh_s=0.05).asgi()
    made = TestClient(app, base_url="http://127.0.0.1")
    if token is not None:
        made.cookies.set(COOKIE, token)
    return made


@pytest.mark.parametrize(("method", "path"), GUARDED)
def test_without_the_token_every_page_data_call_stream_and_action_is_401(settings: Settings, method: str,
                                                                          path: str) -> None:
    declare(settings, "r1")
    for token in (None, "wrong"):
        response = client(settings, token=token).request(method, path, headers={CSRF_HEADER: csrf_value(TOKEN)},
                                                         json={"confirm": "r1"})
        assert response.status_code == 401, (method, path, token)
        assert "r1" not in response.text
    assert not runs.load_memory(store(settings), "r1")[0].finished


def test_the_token_in_the_address_becomes_a_cookie_and_leaves_the_address(settings: Settings) -> None:
    anonymous = client(settings, token=None)
    response = anonymous.get(f"/runs?token={TOKEN}&phase=running", follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/runs?phase=running"
    assert "httponly" in response.headers["set-cookie"].lower()
    assert "samesite=strict" in response.headers["set-cookie"].lower()
    assert anonymous.get("/runs").status_code == 200  # the cookie it was given now opens the pages
    assert client(settings).get("/data/cost", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_the_token_file_is_its_owners_only_and_a_new_start_makes_a_new_token(tmp_path: Path) -> None:
    path = tmp_path / "home" / "dashboard-token"
    first = issue_token(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text().strip() == first
    assert issue_token(path) != first and stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize(("method", "path"), ACTIONS)
def test_read_only_serves_no_action_route(settings: Settings, method: str, path: str) -> None:
    declare(settings, "r1")
    response = client(settings, read_only=True).request(method, path, headers={CSRF_HEADER: csrf_value(TOKEN)},
                                                         json={"confirm": "r1"})
    assert response.status_code == 404
    assert not runs.load_memory(store(settings), "r1")[0].finished


def test_read_only_pages_offer_no_action(settings: Settings) -> None:
    declare(settings, "r1")
    page = client(settings, read_only=True).get("/runs/r1").text
    assert "data-action" not in page and "read-only" in page
    assert "data-action=\"/actions/runs/r1/stop\"" in client(settings).get("/runs/r1").text


def test_the_runs_page_paints_every_run_of_the_index_and_rows_come_in_pages(settings: Settings) -> None:
    for run_id in ("r1", "r2", "r3"):
        declare(settings, run_id, sweep="s1" if run_id != "r3" else None)
    web = client(settings)
    page = web.get("/runs").text
    assert all(f'data-run="{run_id}"' in page for run_id in ("r1", "r2", "r3"))
    rows = web.get("/data/runs?ids=r1,r3,nope").json()
    assert [(row["run_id"], row["sweep"], row["phase"]) for row in rows] == [("r1", "s1", "pending"),
                                                                              ("r3", None, "pending")]


def test_the_sweeps_pages_paint_a_shell_and_their_tables_come_from_the_data_api(
        work: Work) -> None:  # noqa: F811  (the imported fixture)
    from tpuops.billing.ledger import Ledger
    from tpuops.store.lease import Leases
    from tpuops.sweeps.advance import SweepPass
    from tpuops.sweeps.start import plan_sweep, start_sweep

    settings = work.settings(BEFORE)
    root = store(settings)
    start_sweep(plan_sweep(settings, work.root / "sweeps" / "frozen.yaml", root, base_dir=work.root), root,
                lambda _: None)
    SweepPass(settings, root, Ledger(settings.ledger_path), Leases(root, "test", ttl_s=60), held=set(),
              progress=lambda _: None).run()
    web = client(settings)
    for path, table, row in (("/sweeps", "sweeps", "<tr data-sweep"), ("/sweeps/frozen", "trials", "<tr data-trial")):
        shell = web.get(path).text  # no sweep read: the rows come from the data API, with a progress line
        assert f'<table id="{table}">' in shell and 'class="loading"' in shell and 'id="progress"' in shell
        assert row not in shell
    assert [(s["sweep"], s["phase"]) for s in web.get("/data/sweeps").json()] == [("frozen", "active")]
    trials = web.get("/data/sweeps/frozen").json()["trials"]
    assert [(t["number"], t["run_id"], t["state"]) for t in trials] == [(0, "frozen-t0000", "RUNNING"),
                                                                        (1, "frozen-t0001", "RUNNING")]
    assert all(set(t["params"]) == {"learning_rate"} for t in trials)
    unknown = web.get("/data/sweeps/nope")
    assert unknown.status_code in (400, 404) and "nope" in unknown.json()["error"]


def test_an_action_needs_the_csrf_header_and_the_target_repeated_and_bad_input_changes_nothing(
        settings: Settings) -> None:
    declare(settings, "r1")
    web = client(settings)
    no_header = web.post("/actions/runs/r1/stop", json={"confirm": "r1"})
    assert no_header.status_code == 403 and CSRF_HEADER in no_header.json()["error"]
    for body in ({"confirm": "r2"}, {}, ["r1"]):
        wrong = web.post("/actions/runs/r1/stop", headers={CSRF_HEADER: csrf_value(TOKEN)}, json=body)
        assert wrong.status_code == 400 and '"confirm": "r1"' in wrong.json()["error"]
    not_json = web.post("/actions/runs/r1/stop", headers={CSRF_HEADER: csrf_value(TOKEN)}, content=b"{")
    assert not_json.status_code == 400
    unknown = web.post("/actions/runs/nope/stop", headers={CSRF_HEADER: csrf_value(TOKEN)}, json={"confirm": "nope"})
    assert unknown.status_code == 400 and "nope" in unknown.json()["error"]
    assert not runs.load_memory(store(settings), "r1")[0].finished


def test_stopping_a_run_finishes_it_as_stopped_and_a_second_stop_says_it_ended(settings: Settings) -> None:
    declare(settings, "r1")
    web = client(settings)
    headers = {CSRF_HEADER: csrf_value(TOKEN)}
    done = web.post("/actions/runs/r1/stop", headers=headers, json={"confirm": "r1"})
    assert done.status_code == 200 and "stopped" in done.json()["done"]
    memory = runs.load_memory(store(settings), "r1")[0]
    assert memory.finished and memory.outcome is Outcome.STOPPED
    again = web.post("/actions/runs/r1/stop", headers=headers, json={"confirm": "r1"})
    assert again.status_code == 200 and "ended already" in again.json()["done"]


def test_the_stop_button_is_not_refused_while_another_controller_holds_the_runs_lease(settings: Settings) -> None:
    """It goes through ``api.stop``: the request is written, and the holder stops the run at its next pass."""
    from tpuops.store.lease import Leases

    declare(settings, "r1")
    holder = Leases(store(settings), "train-follow", ttl_s=settings.lease_ttl_s)
    assert holder.acquire("r1")
    done = client(settings).post("/actions/runs/r1/stop", headers={CSRF_HEADER: csrf_value(TOKEN)},
                                 json={"confirm": "r1"})
    assert done.status_code == 200 and "stop requested" in done.json()["done"]
    assert runs.read_stop(store(settings), "r1") is not None
    assert not runs.load_memory(store(settings), "r1")[0].finished  # the holder's to write


def test_deleting_a_node_that_is_not_in_view_deletes_nothing_and_says_so(settings: Settings) -> None:
    response = client(settings).post("/actions/nodes/us-central1-a/ghost/delete",
                                     headers={CSRF_HEADER: csrf_value(TOKEN)}, json={"confirm": "ghost"})
    assert response.status_code == 400 and "no node ghost in us-central1-a" in response.json()["error"]


def test_optuna_dashboard_answers_for_a_study_in_the_store_journal(settings: Settings) -> None:
    import optuna
    from optuna.storages import JournalStorage

    from tpuops.sweeps.journal import StoreJournal
    from tpuops.sweeps.studies import journal_prefix

    storage = JournalStorage(StoreJournal(store(settings), journal_prefix("s1")))
    study = optuna.create_study(study_name="s1", storage=storage, direction="maximize")
    study.add_trial(optuna.trial.create_trial(params={"lr": 0.1}, distributions={
        "lr": optuna.distributions.FloatDistribution(1e-3, 1.0)}, value=0.9))
    source = dataclasses.replace(bound_source(settings), sweep_storage=lambda name: JournalStorage(
        StoreJournal(store(settings), journal_prefix(name))))
    web = TestClient(Dashboard(source, token=TOKEN, read_only=True, refresh_s=0.05).asgi(),
                     base_url="http://127.0.0.1")
    web.cookies.set(COOKIE, TOKEN)
    assert web.get("/api/studies").status_code == 404  # no sweep chosen yet
    assert web.get("/sweeps/s1/optuna", follow_redirects=False).headers["location"] == "/dashboard"
    studies = web.get("/api/studies").json()["study_summaries"]
    assert [s["study_name"] for s in studies] == ["s1"]
    assert web.get("/dashboard").status_code == 200
    assert web.post(f"/api/studies/{studies[0]['study_id']}/note", json={}).status_code == 405  # read-only


def test_a_taken_port_is_one_line_exit_2_and_no_token_is_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    from tpuops.__main__ import run

    monkeypatch.setenv("TPUOPS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TPUOPS_CONFIG", str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text("")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert run(["dashboard", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "home" / "dashboard-token").exists()


def test_a_run_s_panel_lists_its_notifications_with_each_delivery_state(settings: Settings) -> None:
    from tpuops.core.notices import Delivery, Kind, Notice, State

    declare(settings, "r1")
    root = store(settings)
    memory, generation = runs.load_memory(root, "r1")
    memory.notices.append(Notice(key="r1/failed/1", kind=Kind.FAILED, at=1_900_000_000.0, subject="r1",
                                 title="run r1 failed", deliveries=[
                                     Delivery(target="team", state=State.SENT),
                                     Delivery(target="mail", error="the receiver answered HTTP 500")]))
    runs.save_memory(root, "r1", memory, generation)
    assert client(settings).get("/data/runs/r1/panel").json()["notices"] == [{
        "at": "2030-03-17T17:46:40+00:00", "kind": "failed", "title": "run r1 failed",
        "deliveries": "team: sent; mail: pending (the receiver answered HTTP 500)"}]
    assert '<table id="notices">' in client(settings).get("/runs/r1").text
