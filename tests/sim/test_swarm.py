"""The fault swarm (``tpuops.sim.swarm``): a fixed set of seeds breaks no invariant, every regression seed keeps what it
caught, a seed replays exactly, a failure shrinks, and every invariant's checker fails when its guard is off."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO

from tpuops.core import guards
from tpuops.sim.swarm.__main__ import main
from tpuops.sim.swarm.draw import Scenario, draw
from tpuops.sim.swarm.runner import KINDS, run_seed, sweep
from tpuops.sim.swarm.shrink import shrink

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (the compat lane)
    import tomli as tomllib

SEEDS = tomllib.loads((REPO / "tests" / "sim" / "swarm_seeds.toml").read_text())
FIXED = range(SEEDS["fixed"]["first"], SEEDS["fixed"]["first"] + SEEDS["fixed"]["count"])
"""The seeds ``make test`` plays (about 20 s of CPU)."""
REGRESSIONS: list[dict[str, Any]] = SEEDS["regression"]


def _names(result: Any) -> set[str]:
    return {name for name, _ in result.violations}


@pytest.mark.unit
@pytest.mark.slow  # some 120 seeds: tens of seconds of CPU, so make test's, not make unit's
def test_the_fixed_seeds_break_no_invariant_and_inject_every_fault_kind() -> None:
    left_out = {entry["seed"] for entry in REGRESSIONS if entry.get("open")} | set(SEEDS["fixed"]["unsteady"])
    summary = sweep(seed for seed in FIXED if seed not in left_out)
    assert not summary.failed, "\n".join(f"{r.replay()}: {r.violations[0]}" for r in summary.failed)
    assert [kind for kind in KINDS if not summary.injected[kind]] == []
    assert min(summary.checks.values()) >= summary.seeds


def _regression(entry: dict[str, Any]) -> Any:
    marks = [pytest.mark.xfail(strict=True, raises=AssertionError, reason=entry["caught"])] if entry.get("open") else []
    return pytest.param(entry, marks=marks, id=f"seed-{entry['seed']}-{entry['invariant']}")


@pytest.mark.unit
@pytest.mark.slow  # a few seconds of CPU in all: make test's
@pytest.mark.parametrize("entry", [_regression(entry) for entry in REGRESSIONS])
def test_a_regression_seed_keeps_its_invariant(entry: dict[str, Any]) -> None:
    scenario = Scenario.from_json(json.loads(entry["scenario"])) if "scenario" in entry else None
    result = run_seed(entry["seed"], scenario=scenario)
    assert entry["invariant"] not in _names(result), result.violations


@pytest.mark.unit
def test_a_seed_replays_exactly_and_another_seed_differs() -> None:
    first, again, other = run_seed(9), run_seed(9), run_seed(10)
    strip = {"cpu_s"}
    assert {k: v for k, v in first.to_json().items() if k not in strip} == \
        {k: v for k, v in again.to_json().items() if k not in strip}
    assert draw(9) == draw(9) != draw(10)
    assert all(Scenario.from_json(json.loads(json.dumps(draw(s).to_json()))) == draw(s) for s in range(30))
    assert first.injected != other.injected or first.passes != other.passes


GUARDS_OFF = [
    # (guard, the invariant that breaks without it, the first seed that shows it, found by a search from seed 0: the
    # swarm finds the violation within seed + 1 seeds). Every invariant the swarm checks has at least one.
    ("lease.damage_holds_nobody", "liveness.pass_completes", 2),
    ("decide.ended_stays_ended", "nodes.nothing_for_ended_run", 6),
    ("decide.stop_request", "liveness.stop_takes_effect", 0),
    ("decide.stop_request", "nodes.stop_never_undone", 16),
    ("runs.damage_tolerated", "liveness.poison_isolated", 1),
    ("lease.exclusive", "nodes.one_controller_acts", 37),
    ("fleet.write_ahead", "money.billing_never_missed", 54),
    # Off, a listing that lags re-opens a deleted node READY.
    ("ledger.closed_stays_closed", "money.ledger_matches_billing", 6),
    # Off, a self-delete's end is guessed between sightings (within billing_never_missed's half-pass slack): the
    # checker that holds it to its delete operation breaks.
    ("ledger.evidence_end", "money.self_delete_dated", 0),
    ("decide.ended_node_goes", "money.no_overrun", 359),
    ("decide.budget_stop", "money.within_budget", 1),
    ("decide.ended_node_goes", "nodes.none_left", 142),
    ("lease.damage_holds_nobody", "liveness.runs_end", 2),
    ("decide.agent_ending_wins", "truth.outcome_is_true", 43),
    ("decide.user_error_final", "truth.user_error_costs_one_node", 7),
    ("decide.own_delete_no_preemption", "truth.preemptions_are_real", 2),
    ("decide.preemption_counted", "truth.preemptions_counted", 0),
    ("agent.restore_newest", "truth.checkpoint_kept", 0),
    ("decide.own_delete_no_preemption", "truth.runs_json", 2),
    ("runs.damage_tolerated", "truth.runs_json", 1),
    # A sweep's (about three seeds in ten draw one): the sampler seeded by the trial's number, a stopped sweep asking
    # no trial, a trial asked by a pass that died before declaring its run adopted.
    ("sweeps.seed_per_trial", "sweeps.no_duplicate", 6),
    ("sweeps.stop_launches_nothing", "sweeps.nothing_after_stop", 8),
    ("sweeps.adopt_orphan", "sweeps.exact_trials", 16),
    ("sweeps.only_success_completes", "sweeps.study_matches_store", 212),
    # Notifications (about two seeds in three draw targets): a receiver's non-HTTP answer held to its delivery; a
    # notice sent only after its write-ahead (off: a lost compare-and-swap sends anyway, and the next pass decides the
    # ending again under a new key); a malformed url_env found at load (held back, or refused by a command that starts
    # work); a finished run kept until told; a stop told nothing.
    ("notify.isolated_delivery", "liveness.delivery_bounded", 12),
    ("notify.write_ahead", "notifications.exactly_once", 66),
    ("notify.url_checked_at_load", "notifications.bad_url_held_back", 0),
    ("notify.kept_until_told", "notifications.none_lost", 1),
    ("notify.none_for_stop", "notifications.none_for_recovered", 0),
]


@pytest.mark.unit
@pytest.mark.slow  # two plays each, a second or two of CPU: make test's
@pytest.mark.parametrize(("guard", "invariant", "seed"), GUARDS_OFF)
def test_with_a_guard_off_the_swarm_finds_its_violation(guard: str, invariant: str, seed: int) -> None:
    if guard not in guards.declared():
        pytest.skip(f"{guard} is not declared on this branch (it comes with another branch's merge)")
    assert invariant in _names(run_seed(seed, guards_off=[guard])), f"with {guard} off, seed {seed} kept {invariant}"
    assert invariant not in _names(run_seed(seed)), f"seed {seed} breaks {invariant} with every guard on"


@pytest.mark.unit
def test_every_invariant_has_a_guard_off_test() -> None:
    from tpuops.sim.swarm.invariants import AFTER_PASS, AT_END

    assert set(AFTER_PASS) | set(AT_END) <= {invariant for _, invariant, _ in GUARDS_OFF}


@pytest.mark.unit
def test_a_failing_seed_shrinks_to_fewer_parts_that_still_fail() -> None:
    shrunk = shrink(0, guards_off=["decide.stop_request"])
    assert shrunk is not None
    scenario, result = shrunk
    assert scenario.parts() < draw(0).parts()
    assert "liveness.stop_takes_effect" in _names(result)
    assert any(command.what in ("stop", "down") for command in scenario.commands)
    assert result.replay() == "python -m tpuops.sim.swarm --seed 0 --guard-off decide.stop_request"


@pytest.mark.unit
def test_the_command_replays_a_seed_sums_a_range_and_refuses_bad_input_in_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seed", "5"]) == 0
    assert "seed 5:" in capsys.readouterr().out
    assert main(["--seeds", "2", "--first", "9", "--workers", "1", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["seeds"] == 2 and summary["failed_seeds"] == [] and set(summary["injected"]) == set(KINDS)
    assert main(["--seed", "1", "--guard-off", "no.such"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no guard named no.such") and "\n" not in err


@pytest.mark.unit
def test_the_summary_table_shows_seeds_faults_by_kind_checks_and_violations_per_invariant(
        capsys: pytest.CaptureFixture[str]) -> None:
    from tpuops.sim.swarm.invariants import AFTER_PASS, AT_END

    assert main(["--seeds", "2", "--first", "9", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "seeds: 2 " in out and "failing seeds: 0 " in out and "violations: 0" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    assert [kind for kind in KINDS if kind not in rows] == []
    checked = dict.fromkeys((*AFTER_PASS, *AT_END))
    assert {name: rows[name][1] for name in checked} == dict.fromkeys(checked, "0")
    assert min(int(rows[name][0]) for name in checked) >= 2


@pytest.mark.unit
def test_the_swarm_docs_name_every_fault_kind_and_invariant() -> None:
    from tpuops.sim.swarm.invariants import AFTER_PASS, AT_END

    text = (REPO / "docs" / "testing.md").read_text()
    missing = [name for name in (*KINDS, *AFTER_PASS, *AT_END) if f"`{name}`" not in text]
    assert missing == []
    assert Path(REPO / "Makefile").read_text().count("tpuops.sim.swarm") >= 1


@pytest.mark.unit
@pytest.mark.parametrize("seed", [27, 1])  # 27: a run's memory garbled beside two others; 1: a run's run.json garbled
def test_the_front_doors_runs_json_agrees_with_the_rows_the_swarm_checks(seed: int, tmp_path: Path) -> None:
    from tpuops import api
    from tpuops.sim.swarm.promises import runs_json_rows
    from tpuops.sim.swarm.runner import _Play

    play = _Play(draw(seed), tmp_path)
    result = play.play()
    checked = runs_json_rows(play.trace)
    assert isinstance(checked, dict)
    shown = {run.run_id: run.to_json() for run in api.list_runs(play.sim.settings)}
    fields = ("finished", "outcome", "exit_class", "step", "preemptions", "damaged", "phase")
    assert {r: [row[k] for k in fields] for r, row in shown.items()} == \
        {r: [row[k] for k in fields] for r, row in checked.items()}
    assert any(row["damaged"] for row in shown.values()) and not result.violations
