"""One contract for both study storages: the journal in the store (local and fake-gcs-server) and PostgreSQL 15.

Every backend must: create a study, ask/tell, report and prune, enqueue fixed params; keep every
trial of two processes writing at once (distinct numbers, every tell applied once); survive a
writer SIGKILLed mid-write (the study still loads, a new writer goes on). The database password
appears nowhere: not in messages, not in the store.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from local_postgres import LocalPostgres, find_bindir

from tpuops.core.errors import TpuopsError, UsageError
from tpuops.store import LocalStore, Store, gcs_client
from tpuops.store.gcs import GcsStore
from tpuops.sweeps import studies
from tpuops.sweeps.journal import JournalConflict, StoreJournal
from tpuops.sweeps.spec import DatabaseStorage, SweepSpec

pytestmark = pytest.mark.emulator

PASSWORD_ENV = "TPUOPS_TEST_SWEEP_DB_PASSWORD"

WORKER = """
import json, sys, time
from tpuops.store import open_store
from tpuops.sweeps import studies
from tpuops.sweeps.spec import SweepSpec

spec = SweepSpec.model_validate(json.loads(sys.argv[1]))
store = open_store(sys.argv[2], gcs_endpoint=sys.argv[3] or None)
count, tag = int(sys.argv[4]), sys.argv[5]
for i in range(count):
    study = studies.load_study(spec, studies.open_storage(spec, store))
    trial = studies.ask(study, spec)
    trial.set_user_attr("worker", tag)
    trial.report(trial.params["x"], 1)
    study.tell(trial, trial.params["x"] * 2)
    print(trial.number, flush=True)
"""


@dataclass
class Backend:
    name: str
    spec: SweepSpec
    store: Store
    store_uri: str
    endpoint: str
    env: dict[str, str]

    def open(self) -> object:
        return studies.open_storage(self.spec, self.store, environ=self.env)

    def worker(self, count: int, tag: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-c", WORKER, self.spec.model_dump_json(), self.store_uri,
                                 self.endpoint, str(count), tag], env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)


def _spec(name: str, storage: dict[str, object] | None = None) -> SweepSpec:
    raw: dict[str, object] = {"name": name, "experiment": "x.yaml", "trials": 100,
                              "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
                              "sampler": {"type": "random", "seed": 3}, "pruner": {"type": "median",
                                                                                    "startup_trials": 1}}
    if storage:
        raw["storage"] = storage
    return SweepSpec.model_validate(raw)


@pytest.fixture(scope="module")
def postgres() -> Iterator[LocalPostgres]:
    if find_bindir() is None:
        pytest.skip("PostgreSQL server not installed (make test installs the Debian package 'postgresql')")
    with LocalPostgres() as server:
        yield server


_COUNTER = iter(range(10**6))


@pytest.fixture(params=["store-local", "store-gcs", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    name = f"contract-{next(_COUNTER)}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUOPS_")}
    local = tmp_path / "store"
    if request.param == "store-gcs":
        server = request.getfixturevalue("fake_gcs")
        bucket = request.getfixturevalue("gcs_bucket")
        store: Store = GcsStore(bucket, "root", client=gcs_client(server.endpoint), deadline_s=10)
        return Backend(request.param, _spec(name), store, f"gs://{bucket}/root", server.endpoint, env)
    if request.param == "store-local":
        return Backend(request.param, _spec(name), LocalStore(local), str(local), "", env)
    pg: LocalPostgres = request.getfixturevalue("postgres")
    env[PASSWORD_ENV] = pg.password
    spec = _spec(name, {"kind": "database", "url": pg.url, "password_env": PASSWORD_ENV})
    return Backend(request.param, spec, LocalStore(local), str(local), "", env)


def _study(backend: Backend, create: bool = False) -> object:
    storage = backend.open()
    return (studies.create_study if create else studies.load_study)(backend.spec, storage)


def test_create_ask_tell_report_prune_and_enqueue(backend: Backend) -> None:
    import optuna

    study = _study(backend, create=True)
    first = studies.ask(study, backend.spec)
    first.report(0.5, 10)
    first.report(0.6, 20)
    study.tell(first, 0.9)
    study.enqueue_trial({"x": 0.25})
    second = studies.ask(study, backend.spec)
    assert second.params == {"x": 0.25}
    second.report(0.1, 10)
    second.report(0.05, 20)
    assert second.should_prune()  # below the median of the completed trial at step 20
    study.tell(second, state=optuna.trial.TrialState.PRUNED)
    third = studies.ask(study, backend.spec)
    study.tell(third, state=optuna.trial.TrialState.FAIL)
    fourth = studies.ask(study, backend.spec)
    fourth.set_user_attr("run_id", "contract-t0003")

    again = _study(backend)  # a fresh process's view
    trials = again.get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE", "PRUNED", "FAIL", "RUNNING"]
    assert trials[0].value == 0.9 and trials[0].intermediate_values == {10: 0.5, 20: 0.6}
    assert trials[1].params == {"x": 0.25} and trials[1].intermediate_values == {10: 0.1, 20: 0.05}
    assert trials[3].user_attrs == {"run_id": "contract-t0003"}
    assert again.best_trial.number == 0
    with pytest.raises(UsageError, match="exists already"):
        studies.create_study(backend.spec, backend.open())


def test_the_same_seed_gives_the_same_params_whichever_process_asks(backend: Backend) -> None:
    study = _study(backend, create=True)
    params = []
    for _ in range(3):
        fresh = _study(backend)  # every ask from a new storage, as from a new cron pass
        trial = studies.ask(fresh, backend.spec)
        params.append(trial.params["x"])
        fresh.tell(trial, 1.0)
    other = _spec(backend.spec.name + "-b", backend.spec.storage.model_dump())
    replay = studies.create_study(other, studies.open_storage(other, backend.store, environ=backend.env))
    again = [studies.ask(replay, other).params["x"] for _ in range(3)]
    assert params == again and len(set(params)) == 3
    assert len(study.get_trials()) == 3


def test_two_processes_at_once_keep_every_trial(backend: Backend) -> None:
    _study(backend, create=True)
    workers = [backend.worker(6, tag) for tag in ("left", "right")]
    numbers = []
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
        numbers.extend(int(line) for line in out.split())
    trials = _study(backend).get_trials()
    assert sorted(numbers) == list(range(12)) == [t.number for t in trials]
    assert all(t.state.name == "COMPLETE" and t.value == t.params["x"] * 2 for t in trials)
    assert all(t.intermediate_values == {1: t.params["x"]} for t in trials)
    assert sorted(t.user_attrs["worker"] for t in trials) == ["left"] * 6 + ["right"] * 6


def test_a_writer_sigkilled_mid_write_leaves_a_study_that_loads_and_goes_on(backend: Backend) -> None:
    _study(backend, create=True)
    rng = random.Random(8)
    for kills in range(1, 3):
        before = len(_study(backend).get_trials())
        worker = backend.worker(1000, "doomed")
        assert worker.stdout is not None
        assert worker.stdout.readline(), "the worker died before its first trial"  # blocks until it told one
        time.sleep(rng.uniform(0.0, 0.3))  # a random moment of its write loop, not synchronisation
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        trials = _study(backend).get_trials()
        assert len(trials) > before
        # Every write is whole: a told trial has its value; each kill leaves at most one trial between ask
        # and tell (without its params if killed between its creation and its first param: a pass adopts it).
        assert [t.number for t in trials] == list(range(len(trials)))
        complete = [t for t in trials if t.state.name == "COMPLETE"]
        assert all(t.value == t.params["x"] * 2 for t in complete)
        assert len(trials) - len(complete) <= kills
    survivor = backend.worker(2, "after")
    _, err = survivor.communicate(timeout=60)
    assert survivor.returncode == 0, err
    trials = _study(backend).get_trials()
    assert [t.user_attrs.get("worker") for t in trials[-2:]] == ["after", "after"]
    assert [t.number for t in trials] == list(range(len(trials)))


def test_an_exclusive_journal_detects_another_writer(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    spec = _spec("exclusive")
    studies.create_study(spec, studies.open_storage(spec, store))
    holder = studies.load_study(spec, studies.open_storage(spec, store, exclusive=True))
    intruder = studies.load_study(spec, studies.open_storage(spec, store))
    studies.ask(intruder, spec)
    with pytest.raises(JournalConflict, match="held the sweep's lease"):
        studies.ask(holder, spec)


def test_compaction_keeps_the_study_and_bounds_what_a_load_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    import tpuops.sweeps.journal as journal

    monkeypatch.setattr(journal, "COMPACT_AFTER", 10)
    store = LocalStore(tmp_path / "store")
    spec = _spec("compact")
    study = studies.create_study(spec, studies.open_storage(spec, store))
    for value in range(6):
        trial = studies.ask(study, spec)
        study.tell(trial, float(value))
    backend = StoreJournal(store, studies.journal_prefix(spec.name), exclusive=True)
    logs = backend.read_logs(0)
    assert backend.compact() and backend.segments_since_snapshot == 0
    reads: list[str] = []
    original = store.read_bytes
    monkeypatch.setattr(store, "read_bytes", lambda key: reads.append(key) or original(key))
    reloaded = StoreJournal(store, studies.journal_prefix(spec.name), exclusive=True)
    assert reloaded.read_logs(0) == logs
    snapshot = backend.segments_total
    assert [k.rsplit("/", 1)[1] for k in reads] == ["head.json", f"snap-{snapshot:010d}.jsonl",
                                                    f"seg-{snapshot:010d}.json"]
    again = studies.load_study(spec, studies.open_storage(spec, store))
    assert [t.value for t in again.get_trials()] == [float(v) for v in range(6)]
    studies.ask(again, spec)  # appends after the snapshot
    assert len(studies.load_study(spec, studies.open_storage(spec, store)).get_trials()) == 7


def test_the_database_password_comes_from_env_or_an_owner_only_file_and_is_never_shown(
        postgres: LocalPostgres, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    storage = DatabaseStorage(kind="database", url=postgres.url, password_env=None,
                              password_file=str(tmp_path / "pw"))
    (tmp_path / "pw").write_text(postgres.password + "\n")
    (tmp_path / "pw").chmod(0o644)
    with pytest.raises(UsageError, match="readable by others") as loose:
        studies.database_password(storage)
    (tmp_path / "pw").chmod(0o600)
    assert studies.database_password(storage) == postgres.password
    spec = _spec("secret", storage.model_dump())
    studies.create_study(spec, studies.open_storage(spec, LocalStore(tmp_path / "store")))
    wrong = _spec("secret", {"kind": "database", "url": postgres.url, "password_env": PASSWORD_ENV})
    with pytest.raises(TpuopsError) as refused:
        studies.load_study(wrong, studies.open_storage(wrong, LocalStore(tmp_path / "store"),
                                                       environ={PASSWORD_ENV: "not-" + postgres.password}))
    assert "password authentication failed" in str(refused.value)
    with pytest.raises(ValueError, match="carries a password"):
        _spec("inline", {"kind": "database", "url": postgres.url.replace("tpuops@", f"tpuops:{postgres.password}@")})
    out, err = capfd.readouterr()
    shown = [str(loose.value), str(refused.value), out, err, json.dumps(spec.model_dump())]
    assert all(postgres.password not in text for text in shown)
    assert all(postgres.password.encode() not in p.read_bytes() for p in tmp_path.rglob("*")
               if p.is_file() and p.name != "pw")
