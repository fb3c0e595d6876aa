"""The goodput split: billed READY intervals and the agent's attempt clocks, laid over each other."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tpuops.accounting.goodput import split
from tpuops.billing.cost import Interval
from tpuops.core.clock import UTC
from tpuops.runs import AgentStatus, Goodput
from tpuops.runs.models import AttemptTime, parse

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _attempt(number: int, started: float, ended: float | None, **seconds: float) -> AttemptTime:
    last = ended if ended is not None else started + 1
    return AttemptTime(attempt=number, started_at=_at(started).timestamp(),
                       ended_at=None if ended is None else _at(ended).timestamp(), seen_at=_at(last).timestamp(),
                       **{f"{name}_s": value for name, value in seconds.items()})


def _parts(goodput: Goodput) -> float:
    return sum(getattr(goodput, name) for name in Goodput.PARTS)


def test_one_uninterrupted_attempt() -> None:
    attempt = _attempt(1, 4.0, 95.0, setup=11.0, productive=70.0, checkpoint=3.0, eval=5.0, save=1.5, input_wait=2.0)
    got = split([Interval(_at(0), _at(100))], [attempt], usd=1.0)
    assert got is not None
    assert (got.billed_s, got.boot_s, got.idle_after_end_s) == (100.0, 4.0, 5.0)
    assert got.unaccounted_s == pytest.approx(100 - 4 - 11 - 70 - 3 - 5 - 1.5 - 5)
    assert _parts(got) == pytest.approx(got.billed_s)
    assert got.goodput == pytest.approx(0.70)
    assert got.lost_s == 0 and got.lost_usd == 0
    assert got.to_json()["goodput"] == 0.7 and got.to_json()["input_wait_s"] == 2.0


def test_a_preemption_costs_the_tail_the_second_boot_and_setup_and_the_redone_steps() -> None:
    first = _attempt(1, 2.0, 50.0, setup=10.0, productive=35.0, checkpoint=1.0)
    second = _attempt(2, 63.0, 120.0, setup=8.0, productive=40.0, recomputed=5.0, checkpoint=1.0, save=1.0)
    intervals = [Interval(_at(60), _at(122)), Interval(_at(0), _at(51))]  # any order
    got = split(intervals, [second, first], usd=2.2)
    assert got is not None and got.attempts == 2
    assert got.billed_s == pytest.approx(113.0)
    assert got.boot_s == pytest.approx(2.0 + 3.0)
    assert got.idle_after_end_s == pytest.approx(1.0 + 2.0)
    assert got.lost_s == pytest.approx(1.0 + 3.0 + 8.0 + 5.0)  # first's tail, second's boot and setup, redone
    assert got.lost_usd == pytest.approx(2.2 * got.lost_s / got.billed_s)
    assert _parts(got) == pytest.approx(got.billed_s)


def test_an_interval_no_attempt_started_in_is_all_boot() -> None:
    only = _attempt(1, 31.0, 80.0, setup=5.0, productive=40.0)
    got = split([Interval(_at(0), _at(20)), Interval(_at(30), _at(81))], [only], usd=1.0)
    assert got is not None
    assert got.boot_s == pytest.approx(20.0 + 1.0)
    assert _parts(got) == pytest.approx(71.0)
    # Issue 38: the first node never ran an attempt (a slice that never booted, 20 s): paid for, it produced
    # nothing, so it is lost, with the replacement's boot.
    assert got.lost_s == pytest.approx(20.0 + 1.0)


def test_a_running_attempt_has_no_idle_tail_and_a_killed_one_ends_at_its_last_write() -> None:
    killed = _attempt(1, 1.0, None, setup=5.0, productive=10.0)  # seen_at = started + 1 = 2 s
    running = _attempt(2, 41.0, None, setup=5.0, productive=10.0)
    got = split([Interval(_at(0), _at(30)), Interval(_at(40), _at(70), open=True)], [killed, running], usd=1.0)
    assert got is not None
    assert got.idle_after_end_s == pytest.approx(30.0 - 2.0)
    assert _parts(got) == pytest.approx(60.0)


def test_without_attempts_the_split_is_unknown_and_old_status_documents_still_parse() -> None:
    assert split([Interval(_at(0), _at(10))], [], usd=1.0) is None
    old = parse(AgentStatus, b'{"run_id": "r", "attempt": 2, "step": 5}', "status.json")
    assert old.attempts == []
    new = parse(AgentStatus, b'{"attempts": [{"attempt": 1, "productive_s": 2.5, "future_field": 1}]}', "s")
    assert new.attempts[0].productive_s == 2.5 and new.attempts[0].last_alive is None


def test_nothing_billed_yet_has_no_goodput_ratio() -> None:
    got = split([], [_attempt(1, 0.0, None)], usd=0.0)
    assert got is not None and got.goodput is None and got.ratio_text() == "?"
    assert "goodput ?" in got.summary()


def test_every_segment_the_agent_clocks_has_a_home_in_the_status_and_the_split() -> None:
    """The names are the agent's (``tpuops.contract.timing``): a segment it adds must not vanish on the way."""
    from dataclasses import fields

    from tpuops.contract.timing import DISJOINT, SEGMENTS, AttemptClock

    clock = AttemptClock(attempt=1, started_at=0.0)
    written = {key[:-2] for key in clock.entry() if key.endswith("_s")}
    assert written == set(SEGMENTS)
    goodput_fields = {f.name for f in fields(Goodput)}
    for segment in SEGMENTS:
        assert f"{segment}_s" in AttemptTime.model_fields and f"{segment}_s" in goodput_fields, segment
    assert [part[:-2] for part in Goodput.PARTS[1:1 + len(DISJOINT)]] == list(DISJOINT)


def test_unaccounted_a_hair_below_zero_never_reads_as_negative_zero() -> None:
    """The agent's clocks may sum a few hundredths past the ledger's billed interval: the summary and the JSON say
    0.0, not -0.0; a real shortfall keeps its sign."""
    import json

    hair = _attempt(1, 0.0, 100.0, setup=10.0, productive=90.03)  # boot 0, idle 0: unaccounted -0.03
    got = split([Interval(_at(0), _at(100))], [hair], usd=1.0)
    assert got is not None and got.unaccounted_s == pytest.approx(-0.03)
    assert "-0.0" not in got.summary() and "unaccounted 0.0 s" in got.summary()
    tiny = split([Interval(_at(0), _at(100))], [_attempt(1, 0.0, 100.0, setup=10.0, productive=90.0004)], usd=1.0)
    assert tiny is not None and "-0.0" not in json.dumps(tiny.to_json())
    assert tiny.to_json()["unaccounted_s"] == 0.0
    short = split([Interval(_at(0), _at(100))], [_attempt(1, 0.0, 100.0, setup=10.0, productive=90.4)], usd=1.0)
    assert short is not None and "unaccounted -0.4 s" in short.summary()


def test_format_seconds_never_prints_a_negative_zero() -> None:
    from tpuops.core.formats import format_seconds

    assert [format_seconds(v) for v in (-0.04, -0.0, 0.0, 0.04, -0.06, 12.345)] == \
        ["0.0", "0.0", "0.0", "0.0", "-0.1", "12.3"]
    assert format_seconds(-0.00004, 4) == "0.0000" and format_seconds(-0.00006, 4) == "-0.0001"


def test_the_runs_table_bills_a_run_whose_agent_reported_no_attempt_clocks(tmp_path: Path) -> None:
    """A script-mode run reports no attempt clocks, so its goodput is unknown; its cost is not: the dashboard's
    Runs table showed $0.0000 for what the ledger (and ``tpuops cost``) billed it."""
    from tpuops import runs
    from tpuops.api.pages import run_rows
    from tpuops.billing.cost import catalog_for, spent
    from tpuops.config import Settings
    from tpuops.core.kinds import Capacity, Cloud
    from tpuops.dashboard.views import run_row
    from tpuops.launch.provision import plan_up
    from tpuops.providers.nodes import NodeState
    from tpuops.runs import NodeSpec, RunKind, RunRecord
    from tpuops.session import open_ledger, store

    settings = Settings(tpu_endpoint=Cloud.GCP, node_provider="memory", project="p", zones=["us-central1-b"],
                        home=tmp_path / "home", store=str(tmp_path / "store"))
    request = plan_up(settings, "script-1", accelerator="v2-8", capacity=Capacity.SPOT, zone="us-central1-b",
                      run_id="script-1").request
    root = store(settings)
    root.write_bytes(runs.record_key("script-1"), RunRecord(
        run_id="script-1", kind=RunKind.TRAIN, node=NodeSpec.of(request, ["us-central1-b"]),
        experiment="x").model_dump_json().encode())
    runs.write_status(root, "script-1", AgentStatus(run_id="script-1", phase="done", exit_class="succeeded"))
    ledger = open_ledger(settings)
    ledger.record_node("p", "us-central1-b", "script-1", "v2-8", "spot", run_id="script-1", uid="1", at=_at(0))
    ledger.observe("p", "us-central1-b", "script-1", NodeState.READY, _at(60), uid="1")
    ledger.mark_deleted("p", "us-central1-b", "script-1", _at(660), uid="1")
    [run] = run_rows(settings, ["script-1"])
    billed = spent(ledger, catalog_for(settings), project="p", run_id="script-1")
    assert run.goodput is None and billed > 0
    assert run_row(run, datetime.now(UTC))["usd"] == pytest.approx(billed)


def test_a_finished_agent_s_node_still_ready_is_billed_after_its_end_up_to_now() -> None:
    """Issue 38, defect 1: the agent ended at 60 s, but its node is still READY at 100 s (its deletes fail): the
    40 s after its end show as idle after the end, where a live agent's open interval shows none."""
    start = datetime(2024, 5, 1, tzinfo=UTC)
    open_now = [Interval(start, start + timedelta(seconds=100), open=True)]
    attempt = AttemptTime(attempt=1, started_at=start.timestamp() + 5, ended_at=start.timestamp() + 60)
    ended = split(open_now, [attempt], 1.0, finished=True)
    running = split(open_now, [attempt], 1.0, finished=False)
    assert ended is not None and running is not None
    assert (ended.idle_after_end_s, running.idle_after_end_s) == (40.0, 0.0)
