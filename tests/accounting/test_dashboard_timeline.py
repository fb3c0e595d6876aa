"""A run's timeline from ledger intervals, memory events and attempt clocks (pure: tpuops/accounting/timeline.py)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from tpuops.accounting.timeline import MarkKind, build, steps_at
from tpuops.billing.ledger import NodeHistory, NodeRecord, Transition
from tpuops.core.clock import UTC
from tpuops.dashboard import svg
from tpuops.providers.cloud_tpu.offers import CLOUD_TPU
from tpuops.runs import AgentStatus, EvalPoint
from tpuops.runs.models import AttemptTime

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
S0 = T0.timestamp()


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def incarnation(uid: str, states: list[tuple[str, float]], deleted: float | None) -> NodeHistory:
    node = NodeRecord(id=1, project="p", zone="us-central1-a", name="r1", uid=uid, accelerator="v3-8",
                      capacity="spot", run_id="r1", sweep_id=None, created_at=at(states[0][1]),
                      deleted_at=at(deleted) if deleted is not None else None)
    return NodeHistory(node, tuple(Transition(state, at(t)) for state, t in states))


def preempted_once() -> tuple[list[NodeHistory], list, AgentStatus]:
    """Boot, train 100 s, preempted at 130 s, replaced, back training at 200 s, still going at 300 s."""
    histories = [
        incarnation("a", [("CREATING", 0), ("READY", 20), ("PREEMPTED", 130), ("DELETING", 135), ("DELETED", 150)],
                    deleted=150),
        incarnation("b", [("CREATING", 150), ("READY", 170)], deleted=None),
    ]
    events = [{"at": S0, "kind": "create", "message": "attempt 1"},
              {"at": S0 + 130, "kind": "preempted", "message": "node PREEMPTED"},
              {"at": S0 + 150, "kind": "create", "message": "attempt 2"},
              {"at": S0 + 160, "kind": "waiting", "message": "not drawn"}]
    status = AgentStatus(run_id="r1", attempt=2, step=300, resumed_from_step=100, last_checkpoint_step=250,
                         evals=[EvalPoint(step=200, metrics={"accuracy": 0.9})],
                         attempts=[AttemptTime(attempt=1, started_at=S0 + 25, first_step_at=S0 + 30, seen_at=S0 + 128),
                                   AttemptTime(attempt=2, started_at=S0 + 175, first_step_at=S0 + 200,
                                               seen_at=S0 + 300)])
    return histories, events, status


def test_nodes_and_attempts_are_bars_by_state_with_the_last_state_open_until_now() -> None:
    histories, events, status = preempted_once()
    timeline = build(histories, events, status, now=S0 + 310, offers=CLOUD_TPU)
    assert timeline.lanes == ["node r1 #1", "node r1 #2", "attempt 1", "attempt 2"]
    first = [(b.state, b.start - S0, b.end - S0) for b in timeline.bars if b.lane == "node r1 #1"]
    assert first == [("CREATING", 0, 20), ("READY", 20, 130), ("PREEMPTED", 130, 135), ("DELETING", 135, 150)]
    second = [(b.state, b.start - S0, b.end - S0) for b in timeline.bars if b.lane == "node r1 #2"]
    assert second == [("CREATING", 150, 170), ("READY", 170, 310)]
    attempt2 = [(b.state, b.start - S0, b.end - S0) for b in timeline.bars if b.lane == "attempt 2"]
    assert attempt2 == [("SETUP", 175, 200), ("TRAINING", 200, 300)]
    assert (timeline.start, timeline.end) == (S0, S0 + 310)


def test_a_preemption_is_marked_with_its_recovery_to_the_first_new_step() -> None:
    histories, events, status = preempted_once()
    timeline = build(histories, events, status, now=S0 + 310, offers=CLOUD_TPU)
    assert [r.seconds for r in timeline.recoveries] == [70.0]
    kinds = [m.kind for m in timeline.marks]
    assert kinds.count(MarkKind.PREEMPTION) == 1 and kinds.count(MarkKind.RECOVERY) == 1
    assert kinds.count(MarkKind.CREATE) == 2 and MarkKind.EVAL in kinds and MarkKind.CHECKPOINT in kinds
    assert not [m for m in timeline.marks if m.label == "not drawn"]
    assert [m.at for m in timeline.marks] == sorted(m.at for m in timeline.marks)


def test_a_preemption_not_recovered_yet_has_no_recovery() -> None:
    histories, events, status = preempted_once()
    status.attempts.pop()
    assert build(histories, events, status, now=S0 + 160, offers=CLOUD_TPU).recoveries == []


def test_steps_are_placed_in_time_over_the_attempt_that_trained_them() -> None:
    _, _, status = preempted_once()
    assert steps_at(status, 100) == S0 + 200
    assert steps_at(status, 300) == S0 + 300
    assert steps_at(status, 200) == pytest.approx(S0 + 250)
    assert steps_at(status, 50) is None  # trained by an attempt whose clock the status no longer places
    assert steps_at(None, 10) is None


def test_an_empty_run_is_an_empty_picture() -> None:
    timeline = build([], [], None, now=S0, offers=CLOUD_TPU)
    assert (timeline.lanes, timeline.bars, timeline.marks) == ([], [], [])
    assert "<svg" in svg.timeline_svg(timeline)


def test_the_drawing_carries_what_each_element_shows_and_escapes_text() -> None:
    histories, events, status = preempted_once()
    events.append({"at": S0 + 140, "kind": "crash", "message": "<script>alert(1)</script>"})
    drawn = svg.timeline_svg(build(histories, events, status, now=S0 + 310, offers=CLOUD_TPU))
    assert drawn.count('data-state="PREEMPTED"') == 1 and drawn.count('data-state="READY"') == 2
    assert drawn.count('data-kind="preemption"') == 1 and drawn.count('data-kind="recovery"') == 1
    assert drawn.count('data-kind="restart"') == 1
    assert "<script>" not in drawn and "&lt;script&gt;" in drawn


def test_the_goodput_split_is_one_bar_in_proportion() -> None:
    drawn = svg.stacked_bar_svg([("productive", 75.0), ("recomputed", 25.0), ("boot", 0.0)])
    assert 'data-part="productive"' in drawn and 'width="720.0"' in drawn and 'width="240.0"' in drawn
    assert 'data-part="boot"' not in drawn


def test_a_slice_is_drawn_as_its_workers_and_an_unhealthy_worker_restart_is_marked() -> None:
    slice_ = incarnation("s", [("CREATING", 0), ("READY", 20), ("DELETING", 90), ("DELETED", 95)], deleted=95)
    slice_ = NodeHistory(replace(slice_.node, accelerator="v3-32"), slice_.transitions)
    events = [{"at": S0 + 60, "kind": "unhealthy", "message": "worker 2 of the slice unhealthy for 30 s"}]
    timeline = build([slice_], events, None, S0 + 100, CLOUD_TPU)
    assert timeline.lanes == [f"node r1 #1 w{w}" for w in range(4)]
    assert {bar.state for bar in timeline.bars if bar.lane.endswith("w3")} == {"CREATING", "READY", "DELETING"}
    [mark] = timeline.marks
    assert mark.kind is MarkKind.RESTART and "worker 2" in mark.label
    assert 'data-lane="node r1 #1 w2"' in svg.timeline_svg(timeline)


def test_an_elastic_runs_incarnations_name_their_size_and_a_move_is_drawn_apart_from_preemptions() -> None:
    small = incarnation("a", [("CREATING", 0), ("READY", 20), ("DELETING", 130), ("DELETED", 140)], deleted=140)
    big = incarnation("b", [("CREATING", 140), ("READY", 160)], deleted=None)
    histories = [replace(small, node=replace(small.node, accelerator="v2-8")),
                 replace(big, node=replace(big.node, accelerator="v2-32"))]
    events = [{"at": S0 + 130, "kind": "moved-up", "message": "moving from v2-8 to v2-32 through a checkpoint"}]
    timeline = build(histories, events, None, now=S0 + 200, offers=CLOUD_TPU)
    assert timeline.lanes == ["node r1 #1 v2-8", *(f"node r1 #2 v2-32 w{w}" for w in range(4))]
    assert [mark.kind for mark in timeline.marks] == [MarkKind.MOVE]
    assert timeline.recoveries == []
