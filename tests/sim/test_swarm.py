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
from tpuops.sim.swarm import faults as f
from tpuops.sim.swarm.__main__ import main
from tpuops.sim.swarm.draw import Scenario, draw
from tpuops.sim.swarm.runner import run_seed, sweep
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
    assert [kind for kind in f.KINDS if not summary.injected[kind]] == []
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
    # (guard, the invariant that breaks without it, the first seeds among which the swarm finds that)
    ("decide.stop_request", "liveness.stop_takes_effect", 5),
    ("decide.budget_stop", "money.within_budget", 5),
    ("decide.ended_stays_ended", "nodes.nothing_for_ended_run", 10),
    ("decide.user_error_final", "truth.user_error_costs_one_node", 10),
    # Off, a node whose create's answer was lost, or that lived between two passes, bills unseen. (It broke
    # money.ledger_matches_billing first while the ledger took a READY for the name's closed incarnation.)
    ("fleet.write_ahead", "money.billing_never_missed", 55),
    # Off, a listing that lags re-opens a deleted node READY (the swarm's seed 6).
    ("ledger.closed_stays_closed", "money.ledger_matches_billing", 10),
    ("decide.ended_node_goes", "nodes.none_left", 35),
    # Off, a self-delete's end is guessed between sightings (within billing_never_missed's half-pass slack): the
    # checker that holds it to its delete operation breaks.
    ("ledger.evidence_end", "money.self_delete_dated", 3),
]


@pytest.mark.unit
@pytest.mark.slow  # up to 55 seeds each: make test's
@pytest.mark.parametrize(("guard", "invariant", "within"), GUARDS_OFF)
def test_with_a_guard_off_the_swarm_finds_its_violation(guard: str, invariant: str, within: int) -> None:
    if guard not in guards.declared():
        pytest.skip(f"{guard} is not declared on this branch (it comes with another branch's merge)")
    for seed in range(within):  # a seed that breaks it with the guard off, and keeps it with the guard on
        if invariant in _names(run_seed(seed, guards_off=[guard])) and invariant not in _names(run_seed(seed)):
            break
    else:
        pytest.fail(f"with {guard} off, no seed of the first {within} broke {invariant} (and kept it with it on)")


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
    assert summary["seeds"] == 2 and summary["failed_seeds"] == [] and set(summary["injected"]) == set(f.KINDS)
    assert main(["--seed", "1", "--guard-off", "no.such"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no guard named no.such") and "\n" not in err


@pytest.mark.unit
def test_the_swarm_docs_name_every_fault_kind_and_invariant() -> None:
    from tpuops.sim.swarm.invariants import AFTER_PASS, AT_END

    text = (REPO / "docs" / "testing.md").read_text()
    missing = [name for name in (*f.KINDS, *AFTER_PASS, *AT_END) if f"`{name}`" not in text]
    assert missing == []
    assert Path(REPO / "Makefile").read_text().count("tpuops.sim.swarm") >= 1
