"""The run module's contract (``tpuops.runs``), on every store: local and fake-gcs-server.

A run is declared once, read back typed, listed through its index (never through its history),
followed, finished and reopened. The agent's status parses with and without the fields a newer
agent adds (``evals``), and a record carries the frozen node request and an optional sweep id.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from lanes import LOCAL_AND_GCS

from tpuops import runs
from tpuops.billing.deadline import endgame
from tpuops.core.errors import DamagedDocument, PreconditionFailed, UsageError
from tpuops.core.kinds import Capacity
from tpuops.providers.cloud_tpu.adapter import node_body
from tpuops.runs import AgentStatus, ExitClass, Memory, NodeSpec, Outcome, Phase, RunKind, RunPhase, RunRecord
from tpuops.store import LocalStore, Store, open_store


@pytest.fixture(params=LOCAL_AND_GCS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    endpoint = request.getfixturevalue("fake_gcs").endpoint
    return open_store(f"gs://{request.getfixturevalue('gcs_bucket')}/root", gcs_endpoint=endpoint)


def record(run_id: str, *, sweep: str | None = None, created: str = "2026-01-01T00:00:00+00:00") -> RunRecord:
    node = NodeSpec(name=run_id, accelerator="v3-8", runtime="tpu-vm-tf-2.9.3", capacity=Capacity.SPOT,
                    zones=["us-central1-a", "us-central1-b"], labels={"managed-by": "tpuops", "tpuops-run": run_id},
                    metadata={"startup-script": "#!/bin/bash\necho hi\n"})
    return RunRecord(run_id=run_id, kind=RunKind.TRAIN, node=node, experiment="digits", created=created, sweep=sweep)


def declare(store: Store, run_id: str, **fields: object) -> RunRecord:
    made = record(run_id, **fields)  # type: ignore[arg-type]
    runs.declare(store, made, {"version": 1, "run_id": run_id})
    return made


def write_status(store: Store, run_id: str, **fields: object) -> None:
    store.write_bytes(runs.status_key(run_id), json.dumps({"run_id": run_id, "attempt": 1, **fields}).encode())


def finish(store: Store, run_id: str, outcome: Outcome) -> None:
    memory, generation = runs.load_memory(store, run_id)
    memory.phase, memory.outcome, memory.reason = RunPhase.FINISHED, outcome, "test"
    runs.save_memory(store, run_id, memory, generation)


def test_a_declared_run_reads_back_typed_with_its_frozen_node_and_sweep(store: Store) -> None:
    made = declare(store, "r1", sweep="sw-1")
    back = runs.read_record(store, "r1")
    assert back == made
    assert node_body(back.node)["acceleratorType"] == "v3-8"
    assert back.zones == ["us-central1-a", "us-central1-b"] and back.sweep == "sw-1"
    assert json.loads(store.read_bytes(runs.spec_key("r1"))) == {"version": 1, "run_id": "r1"}
    assert runs.read_status(store, "r1") is None
    assert runs.load_memory(store, "r1") == (Memory(), 0)


def test_declaring_the_same_run_twice_is_a_no_op_and_another_run_of_that_name_is_refused(store: Store) -> None:
    made = declare(store, "r1")
    runs.declare(store, made, {"version": 1, "run_id": "r1"})
    with pytest.raises(UsageError, match="exists with other content: choose another run name"):
        runs.declare(store, made.model_copy(update={"experiment": "other"}), {"version": 1, "run_id": "r1"})
    assert runs.read_record(store, "r1") == made


def test_a_missing_run_and_a_malformed_document_are_one_clear_error(store: Store) -> None:
    with pytest.raises(UsageError, match=r"no run 'ghost' in .*'tpuops runs' lists them"):
        runs.read_record(store, "ghost")
    declare(store, "r1")
    store.write_bytes(runs.status_key("r1"), b'{"step": "many"}')
    with pytest.raises(DamagedDocument, match=r"status\.json is damaged: step: ") as damaged:
        runs.read_status(store, "r1")
    assert damaged.value.exit_code == 1, "a damaged store document is a failure of the world, not a usage error"


def test_an_empty_status_object_reads_as_no_status_yet(store: Store) -> None:
    """The agent rewrites its status every heartbeat; a zero-byte one (an interrupted upload) is not a broken run."""
    declare(store, "r1")
    store.write_bytes(runs.status_key("r1"), b"")
    assert runs.read_status(store, "r1") is None
    write_status(store, "r1", phase="training", step=40)
    status = runs.read_status(store, "r1")
    assert status is not None and status.step == 40


def test_an_old_status_and_a_new_one_with_evals_both_parse(store: Store) -> None:
    declare(store, "r1")
    write_status(store, "r1", phase="training", step=40, metrics={"eval": {"accuracy": 0.5}})
    old = runs.read_status(store, "r1")
    assert old is not None and old.evals == [] and old.phase is Phase.TRAINING
    write_status(store, "r1", phase="done", step=80, exit_class="succeeded", some_future_field=1,
                 evals=[{"step": 40, "metrics": {"accuracy": 0.5}}, {"step": 80, "metrics": {"accuracy": 0.9}}])
    new = runs.read_status(store, "r1")
    assert new is not None and [(e.step, e.metrics["accuracy"]) for e in new.evals] == [(40, 0.5), (80, 0.9)]
    assert new.exit_class is ExitClass.SUCCEEDED and new.exit_class == "succeeded" and new.final


def test_memory_is_saved_with_compare_and_swap(store: Store) -> None:
    declare(store, "r1")
    memory, generation = runs.load_memory(store, "r1")
    memory.event(1.0, "create", "attempt 1")
    saved = runs.save_memory(store, "r1", memory, generation)
    with pytest.raises(PreconditionFailed):
        runs.save_memory(store, "r1", memory, generation)
    back, current = runs.load_memory(store, "r1")
    assert current == saved and back.events == [{"at": 1.0, "kind": "create", "message": "attempt 1"}]


def test_a_memory_in_its_legacy_file_is_read_and_the_next_save_moves_it_to_memory_json(store: Store) -> None:
    declare(store, "old")
    legacy = Memory(attempts=2, preemptions=1)
    store.write_bytes(runs.layout.run_key("old", runs.layout.LEGACY_MEMORY), legacy.to_bytes())
    memory, generation = runs.load_memory(store, "old")
    assert (memory.attempts, memory.preemptions, generation) == (2, 1, 0)
    memory.finish(5.0, Outcome.STOPPED, "by a sweep")
    runs.save_memory(store, "old", memory, generation)
    assert runs.load_memory(store, "old")[0].outcome is Outcome.STOPPED
    assert store.exists(runs.memory_key("old"))


@pytest.mark.unit
def test_memory_owns_its_transitions_finish_promote_and_reopen() -> None:
    memory = Memory()
    assert memory.promote(1.0, endgame(), Capacity.SPOT)
    assert (memory.capacity, memory.deleting, memory.events[-1]["message"]) == (
        Capacity.ON_DEMAND, True, "endgame: moving from spot to on-demand at the next checkpoint")
    assert not memory.promote(2.0, endgame(), Capacity.SPOT)  # once
    assert not memory.reopen(3.0, "not finished")
    memory.pending_create = None
    memory.finish(4.0, Outcome.PRUNED, "pruned at step 40")
    assert (memory.phase, memory.outcome, memory.events[-1]["message"]) == (
        RunPhase.FINISHED, Outcome.PRUNED, "pruned: pruned at step 40")
    assert not memory.promote(5.0, endgame(), Capacity.SPOT)
    assert memory.reopen(6.0, "train --resume")
    assert (memory.phase, memory.outcome, memory.reason, memory.crashes) == (RunPhase.ACTIVE, None, None, 0)


@pytest.mark.unit
@pytest.mark.parametrize(("memory_outcome", "exit_class", "finished"), [
    (None, None, False),
    (None, "preempted", False),  # the controller recreates it
    (None, "crashed", False),  # the controller restarts it
    (None, "succeeded", True),  # a detached run that no controller watched
    (None, "user-error", True),
    (Outcome.FAILED, None, True),  # ended by the controller before any agent wrote a status
    (Outcome.BUDGET_EXHAUSTED, "preempted", True),
])
def test_is_finished_is_the_controllers_word_or_a_final_agent_exit(
        memory_outcome: Outcome | None, exit_class: str | None, finished: bool) -> None:
    memory = Memory()
    if memory_outcome is not None:
        memory.phase, memory.outcome = RunPhase.FINISHED, memory_outcome
    status = AgentStatus.model_validate({"exit_class": exit_class}) if exit_class else None
    assert runs.is_finished(memory, status) is finished


def test_listing_goes_through_the_index_and_active_means_unfinished(store: Store) -> None:
    for i, run_id in enumerate(("a", "b", "c", "d")):
        declare(store, run_id, created=f"2026-01-01T00:00:0{i}+00:00")
    write_status(store, "b", phase="training", step=7)
    write_status(store, "c", phase="done", exit_class="succeeded")
    finish(store, "d", Outcome.FAILED)  # quota refused at create: no agent status at all
    store.write_bytes("runs/a/ckpt/ckpt-1.index", b"x")  # history under runs/ is never listed
    assert [r.run_id for r in runs.list_runs(store)] == ["a", "b", "c", "d"]
    active = runs.list_runs(store, active_only=True)
    assert [(r.run_id, r.phase) for r in active] == [("a", "pending"), ("b", "training")]
    listed = {r.run_id: r.to_json() for r in runs.list_runs(store)}
    assert (listed["d"]["phase"], listed["d"]["outcome"], listed["d"]["finished"]) == ("finished", "failed", True)
    assert (listed["c"]["outcome"], listed["c"]["exit_class"]) == ("succeeded", "succeeded")
    assert "metadata" not in listed["a"]["node"]  # the startup script stays out of listings


def test_a_listing_reads_from_several_threads_only_where_their_round_trips_overlap(store: Store) -> None:
    for run_id in ("a", "b", "c"):
        declare(store, run_id)
    store.delete("index/built")  # rebuilt on the first listing, by the same readers
    readers: set[int] = set()
    read = store.read_versioned

    def watched(key: str) -> tuple[bytes, int]:
        readers.add(threading.get_ident())
        return read(key)

    store.read_versioned = watched  # type: ignore[method-assign]
    assert [r.run_id for r in runs.list_runs(store)] == ["a", "b", "c"]
    assert readers
    assert (readers == {threading.get_ident()}) is not store.concurrent_reads


def test_a_store_from_before_the_index_is_indexed_on_first_use(store: Store) -> None:
    for run_id in ("old-1", "old-2"):
        store.write_bytes(runs.record_key(run_id), record(run_id).model_dump_json().encode())
    finish(store, "old-2", Outcome.SUCCEEDED)
    assert runs.active_run_ids(store) == ["old-1"]
    assert runs.all_run_ids(store) == ["old-1", "old-2"]
    assert store.exists("index/built")


def test_reopen_makes_a_finished_run_active_and_indexed_again(store: Store) -> None:
    declare(store, "r1")
    finish(store, "r1", Outcome.BUDGET_EXHAUSTED)
    runs.drop_active(store, "r1")
    assert runs.active_run_ids(store) == []
    assert runs.reopen(store, "r1", "tpuops train --resume") is True
    memory = runs.load_memory(store, "r1")[0]
    assert (memory.phase, memory.outcome, memory.events[-1]["kind"]) == (RunPhase.ACTIVE, None, "reopened")
    assert runs.active_run_ids(store) == ["r1"]


def write_log(store: Store, run_id: str, index: int, *lines: str) -> None:
    store.write_bytes(f"{runs.logs_prefix(run_id)}{index:06d}.log", ("\n".join(lines) + "\n").encode())


def test_logs_follow_goes_on_across_a_preemption_and_ends_when_the_run_ends(store: Store) -> None:
    """Attempt 1 is preempted (exit class preempted), attempt 2 appends to the log, then the run ends."""
    declare(store, "r1")
    write_log(store, "r1", 0, "attempt 1 step 10")
    script: list[Callable[[], None]] = [
        lambda: write_status(store, "r1", phase="done", exit_class="preempted", step=20),
        lambda: write_log(store, "r1", 1, "attempt 1 checkpointed at 20"),
        lambda: (write_status(store, "r1", attempt=2, phase="training", step=20),
                 write_log(store, "r1", 2, "attempt 2 resumed at 20")),
        lambda: (write_log(store, "r1", 3, "attempt 2 step 40", "done"),
                 write_status(store, "r1", attempt=2, phase="done", exit_class="succeeded", step=40)),
    ]
    polls: list[int] = []

    def next_moment(_seconds: float) -> None:  # each poll of the follower moves the run on by one moment
        polls.append(1)
        if script:
            script.pop(0)()

    lines = list(runs.follow_logs(store, "r1", follow=True, poll_s=0.0, sleep=next_moment))
    assert lines == ["attempt 1 step 10", "attempt 1 checkpointed at 20", "attempt 2 resumed at 20",
                     "attempt 2 step 40", "done"]
    assert script == [] and len(polls) == 4


def test_a_follower_still_gets_an_earlier_attempts_last_chunk_listed_after_the_next_attempts_first(
        store: Store) -> None:
    """Each writer names its own chunks (``<start>-NNNNNN.log``): attempt 1's last ship can land after attempt 2's
    first was read; it sorts before it, and is yielded all the same, once."""
    declare(store, "r1")
    prefix = runs.logs_prefix("r1")
    store.write_bytes(f"{prefix}20261207T040000000000Z-000001.log", b"attempt 1 step 10\n")
    script: list[Callable[[], None]] = [
        lambda: store.write_bytes(f"{prefix}20261207T041000000000Z-000001.log", b"attempt 2 resumed\n"),
        lambda: (store.write_bytes(f"{prefix}20261207T040000000000Z-000002.log", b"attempt 1 saved\n"),
                 write_status(store, "r1", attempt=2, phase="done", exit_class="succeeded", step=40)),
    ]
    lines = list(runs.follow_logs(store, "r1", follow=True, poll_s=0.0, sleep=lambda _s: script.pop(0)()))
    assert lines == ["attempt 1 step 10", "attempt 2 resumed", "attempt 1 saved"]


def test_logs_follow_ends_for_a_run_the_controller_ended_without_any_status(store: Store) -> None:
    declare(store, "r1")
    finish(store, "r1", Outcome.FAILED)
    done = threading.Event()
    lines = list(runs.follow_logs(store, "r1", follow=True, poll_s=0.0, sleep=lambda _s: done.set()))
    assert lines == [] and not done.is_set()


def test_each_worker_of_a_slice_has_its_own_log_and_all_reads_them_prefixed(store: Store) -> None:
    declare(store, "r1")
    write_log(store, "r1", 0, "w0 first", "w0 second")
    store.write_bytes(f"{runs.logs_prefix('r1', 2)}000000.log", b"w2 booted\n")
    assert runs.logs_prefix("r1", 2) == "runs/r1/logs/w2/"
    assert list(runs.follow_logs(store, "r1", follow=False, poll_s=0.0)) == ["w0 first", "w0 second"]
    assert list(runs.follow_logs(store, "r1", follow=False, poll_s=0.0, workers=[2])) == ["w2 booted"]
    assert list(runs.follow_logs(store, "r1", follow=False, poll_s=0.0, workers=[0, 1, 2])) == [
        "[w0] w0 first", "[w0] w0 second", "[w2] w2 booted"]


@pytest.mark.unit
def test_an_elastic_runs_workers_are_those_of_its_size_with_the_most_hosts(tmp_path: Path) -> None:
    """``logs --worker N`` checks N against every size the run may run on, not only the size its record names
    first: a worker any of its slices had is accepted, one none had is refused in one line naming the sizes."""
    from tpuops import api
    from tpuops.config import Settings

    settings = Settings(zones=["us-central1-a"], home=tmp_path / "home", store=str(tmp_path / "store"))
    store = open_store(settings.store_root)
    base = record("el")
    small = base.node.model_copy(update={"accelerator": "v2-8"})
    for run_id, node, smaller in (("big-first", base.node.model_copy(update={"accelerator": "v2-32"}), [small]),
                                  ("small-first", small, [base.node.model_copy(update={"accelerator": "v2-32"})])):
        made = base.model_copy(update={"run_id": run_id, "node": node, "smaller": smaller})
        runs.declare(store, made, {"version": 1, "run_id": run_id})
        store.write_bytes(f"{runs.logs_prefix(run_id, 3)}000000.log", b"w3 booted on the v2-32\n")
        assert list(api.logs(settings, run_id, worker="3")) == ["w3 booted on the v2-32"]
        assert len(list(api.logs(settings, run_id, worker="all"))) == 1
        with pytest.raises(UsageError) as refused:
            api.logs(settings, run_id, worker="4")
        sizes = {"big-first": "v2-32 with 4 hosts or v2-8 with 1 host",
                 "small-first": "v2-8 with 1 host or v2-32 with 4 hosts"}[run_id]
        assert str(refused.value) == f"--worker 4: run {run_id} runs on a {sizes}; give 0-3 or all"
