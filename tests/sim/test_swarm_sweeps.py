"""The fault swarm's sweeps (``tpuops.sim.swarm.sweeps``): drawn from a stream of their own, so that every seed keeps
the runs, commands and faults it drew before; of every kind the issue names among the fixed seeds; a sweep's
scenario round-trips and shrinks part by part. What the sweep invariants find is ``tests/sim/test_swarm.py``'s (the
fixed seeds, the regression seeds, the guard-off tests)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tpuops.sim.model import AgentModel
from tpuops.sim.swarm.draw import Scenario, draw
from tpuops.sim.swarm.runner import run_seed
from tpuops.sim.swarm.sweeps import STOP_SWEEP, SwarmSweep
from tpuops.sim.world import Agents
from tpuops.store import LocalStore

pytestmark = pytest.mark.unit

FIXED = range(120)


def test_a_seed_draws_the_same_runs_commands_and_faults_with_or_without_its_sweep() -> None:
    for seed in range(400):
        drawn = draw(seed)
        assert dataclasses.replace(drawn, sweep=None) == draw(seed, sweeps=False), seed
    assert draw(5, sweeps=False).played() == draw(5, sweeps=False)


def test_the_fixed_seeds_draw_sweeps_of_every_kind() -> None:
    plans = [plan for plan in (draw(seed).sweep for seed in FIXED) if plan is not None]
    assert 20 <= len(plans) <= 50
    assert {p.sampler for p in plans} == {"random", "tpe"} and {p.pruner for p in plans} == {"none", "median"}
    assert any(p.elastic and p.stockouts for p in plans) and any(not p.spot for p in plans)
    assert any(p.stop_at is not None for p in plans) and any(p.parallel > 1 for p in plans)
    assert min(p.trials for p in plans) == 3 and max(p.trials for p in plans) >= 15
    kinds = {x.kind for p in plans for x in p.faults}
    assert {"controller.kill", "store.garble", "agent.crash"} <= kinds
    assert any(x.kind == "controller.kill" and x.run == "" for p in plans for x in p.faults)  # the sweep's own writes


def test_a_sweep_plays_its_faults_and_stop_after_the_seeds_own_and_round_trips() -> None:
    seed = next(s for s in FIXED if (p := draw(s).sweep) is not None and p.stop_at is not None and p.faults)
    scenario = draw(seed)
    sweep = scenario.sweep
    assert sweep is not None and sweep.stop_at is not None
    played = scenario.played()
    assert played.faults == scenario.faults + sweep.faults
    assert played.commands[:len(scenario.commands)] == scenario.commands
    assert played.commands[-1].what == STOP_SWEEP and played.commands[-1].at == sweep.stop_at
    assert Scenario.from_json(json.loads(json.dumps(scenario.to_json()))) == scenario
    assert SwarmSweep.from_json(json.loads(json.dumps(sweep.to_json()))) == sweep


def test_a_sweep_shrinks_part_by_part_and_whole() -> None:
    seed = next(s for s in FIXED if (p := draw(s).sweep) is not None and p.stop_at is not None and p.faults)
    scenario = draw(seed)
    sweep = scenario.sweep
    assert sweep is not None
    first = len(scenario.runs) + len(scenario.commands) + len(scenario.faults)
    assert scenario.parts() == first + 1 + 1 + len(sweep.stockouts) + len(sweep.faults) + scenario.notify.parts()
    assert scenario.without(first).sweep is None
    assert scenario.without(first + 1).sweep == dataclasses.replace(sweep, stop_at=None)
    last = scenario.without(scenario.parts() - scenario.notify.parts() - 1).sweep  # the receivers' parts come last
    assert last is not None and last.faults == sweep.faults[:-1]
    assert scenario.without(0).sweep == sweep  # a run dropped keeps the sweep


def test_a_node_labelled_as_a_run_the_store_does_not_know_evaluates_nothing(tmp_path: Path) -> None:
    """An elastic trial's probe node is labelled as a run of its own name (``tpuops.controller.probes``): in a sweep's
    simulation, where agents evaluate, its booting crashed the world (the swarm's seed 16 before its draw changed)."""
    agents = Agents(LocalStore(tmp_path, durable=False),
                    AgentModel(total_steps=100, steps_per_s=1.0, eval_every_steps=10), seed=3)
    assert agents.agent("sw-t0001-up").metrics is None


def test_a_seed_with_an_elastic_sweep_replays_exactly() -> None:
    """Optuna's samplers are seeded by the trial's number, and the controller passes on one thread: the same seed
    plays the same passes and injects the same faults."""
    seed = next(s for s in FIXED if (p := draw(s).sweep) is not None and p.elastic and p.stockouts)
    first, again = run_seed(seed).to_json(), run_seed(seed).to_json()
    assert first.pop("cpu_s") >= 0 and again.pop("cpu_s") >= 0
    assert first == again and first["ok"] and first["injected"].get("api.stockout", 0) > 0
