"""One sweep's failure is that sweep's error, never the controller pass's.

Two sweeps share a store; the study of one has a sampler that raises (in real life: user-supplied code,
or a journal entry Optuna cannot read). The real controller pass, on the simulated cloud, still advances
the other sweep and creates nodes for its trials; the failing sweep is reported in the pass report,
its state left as it was for the next pass. KeyboardInterrupt is not a sweep's failure: it ends the pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from helpers import sweeps_world

from tpuops import runs
from tpuops.controller.reconcile import PassReport
from tpuops.core.errors import TransientError
from tpuops.sim.engine import START, Simulation
from tpuops.sweeps import ops as sweep_ops
from tpuops.sweeps import studies
from tpuops.sweeps.spec import SweepSpec

pytestmark = pytest.mark.unit

class Raising(optuna.samplers.RandomSampler):
    """A sampler whose every draw raises ``error``."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(seed=0)
        self.error = error

    def sample_independent(self, study: Any, trial: Any, param_name: str, param_distribution: Any) -> Any:
        raise self.error


@pytest.fixture
def world(tmp_path: Path) -> Simulation:
    """Two sweeps, ``good`` and ``bad``, started in one simulated world's store."""
    return sweeps_world(tmp_path, ("good", "bad"))


def _break(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    """The ``bad`` sweep's study samples with ``Raising``; every other study with its own sampler."""
    real = studies.sampler_for

    def sampler_for(spec: SweepSpec, number: int, space: Any = None) -> optuna.samplers.BaseSampler:
        return Raising(error) if spec.name == "bad" else real(spec, number, space)

    monkeypatch.setattr(studies, "sampler_for", sampler_for)


def test_a_sweep_whose_sampler_raises_is_that_sweeps_error_and_the_pass_goes_on(
        world: Simulation, monkeypatch: pytest.MonkeyPatch) -> None:
    _break(monkeypatch, ValueError("the sampler's own bug"))
    before, _ = sweep_ops.load_state(world.store, "bad")
    passed = world.controller.run_pass(now=START)
    assert passed.sweeps["errors"] == {"bad": "its study failed (ValueError: the sampler's own bug)"}
    assert passed.sweeps["advanced"] == ["good"] and len(passed.sweeps["launched"]) == 2
    assert all(r.startswith("good-") for r in passed.sweeps["launched"])
    # The good sweep's trials got their nodes in this same pass: the runs were reconciled after the failure.
    assert sorted((run_id, str(kind)) for run_id, kind, _ in passed.acted) == [
        ("good-t0000", "create"), ("good-t0001", "create")]
    assert sum(world.world.creates.values()) == 2
    after, _ = sweep_ops.load_state(world.store, "bad")
    assert after == before and "bad" in sweep_ops.active_sweeps(world.store)  # left as it was for the next pass
    assert not [r for r in runs.active_run_ids(world.store) if r.startswith("bad-")]
    monkeypatch.undo()
    again = world.controller.run_pass(now=START + 300)
    assert not again.sweeps["errors"] and "bad" in again.sweeps["advanced"]  # the next pass tries it again
    assert len([r for r in again.sweeps["launched"] if r.startswith("bad-")]) == 2


def test_ctrl_c_in_a_sampler_ends_the_pass(world: Simulation, monkeypatch: pytest.MonkeyPatch) -> None:
    _break(monkeypatch, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        world.controller.run_pass(now=START)


def _pass(world: Simulation, now: float) -> PassReport:
    """One controller pass at ``now``, the simulated cloud's clock moved there first."""
    world.world.clock.advance_to(now)
    return world.controller.run_pass(now=now)


def test_a_store_that_cannot_list_the_sweeps_fails_no_run_and_the_next_pass_goes_on(
        world: Simulation, monkeypatch: pytest.MonkeyPatch) -> None:
    first = _pass(world, START)
    trials = sorted(first.sweeps["launched"])
    assert len(trials) == 4 and sorted(r for r, _, _ in first.acted) == trials
    real = world.store.list

    def failing(prefix: str = "") -> list[Any]:
        if prefix == sweep_ops.ACTIVE:
            raise TransientError("the store did not answer (503)")
        return real(prefix)

    monkeypatch.setattr(world.store, "list", failing)
    said: list[str] = []
    world.controller.progress = said.append
    broken = _pass(world, START + 600)  # the trials' jobs (100 s of steps) have ended meanwhile
    assert broken.sweeps["unlisted"] == "the store did not answer (503)" and not broken.sweeps["advanced"]
    assert [line for line in said if "sweeps" in line] == [
        "cannot list the active sweeps this pass (the store did not answer (503)); runs are reconciled, "
        "sweeps wait for the next pass"]
    assert broken.finished == dict.fromkeys(trials, "succeeded")  # the run pass went on without the sweeps
    monkeypatch.undo()
    again = _pass(world, START + 900)
    assert not again.sweeps["unlisted"] and sorted(again.sweeps["advanced"]) == ["bad", "good"]
    assert sorted(again.sweeps["told"]) == trials and not again.sweeps["launched"]  # each told once, none asked again
    assert again.sweeps["ended"] == {"bad": "completed", "good": "completed"}
    assert sorted(runs.all_run_ids(world.store)) == trials and not world.world.provider.list_nodes("us-central1-a")
