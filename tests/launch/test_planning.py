"""What a plan rests on, learned from history (``tpuops.launch.planning``): the spot hazard from the ledger's risk, the
cost of a recovery from PREEMPTED -> replacement READY plus the agent's setup and redone work, the rate of lost
work from the attempts; the labelled assumptions without history; and that a run's record, its deadline rule,
its ``every: auto`` interval and the forecast all take them from there."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from helpers import REPO

from tpuops.billing.ledger import NodeHistory, NodeRecord, Transition
from tpuops.billing.risk import Prior, RiskKey
from tpuops.billing.risk import learn as learn_risk
from tpuops.contract.interval import young_daly_s
from tpuops.controller.decide import capacity_rule
from tpuops.core.clock import UTC
from tpuops.launch.planning import LOSS_MIN_S, Defaults, keys_of, learn, lost_work, recovery_samples
from tpuops.providers.cloud_tpu.offers import CLOUD_TPU
from tpuops.runs.models import AttemptTime, PlanInputs

P, US, EU = "tpuops-local", "us-central1-b", "europe-west4-a"
T0 = datetime(2024, 5, 1, tzinfo=UTC)
DEFAULTS = Defaults(prior=Prior(0.1, CLOUD_TPU), recovery_s=900.0, lost_work_per_hour=0.05)
KEYS = [RiskKey(US, "v2-8", "spot")]


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _node(node_id: int, run_id: str | None, *steps: tuple[str, float], created: float = 0.0,
          zone: str = US) -> NodeHistory:
    deleted = next((_at(s) for state, s in steps if state == "DELETED"), None)
    record = NodeRecord(id=node_id, project=P, zone=zone, name=run_id or f"n{node_id}", uid=str(node_id),
                        accelerator="v2-8", capacity="spot", run_id=run_id, sweep_id=None, created_at=_at(created),
                        deleted_at=deleted)
    return NodeHistory(record, tuple(Transition(state, _at(s)) for state, s in steps))


def _attempt(number: int, started: float, setup_s: float, productive_s: float = 3000.0,
             recomputed_s: float = 0.0) -> AttemptTime:
    return AttemptTime(attempt=number, started_at=_at(started).timestamp(),
                       first_step_at=_at(started + setup_s).timestamp(), setup_s=setup_s,
                       productive_s=productive_s, recomputed_s=recomputed_s)


# Run "a": preempted at 3,600 s; its replacement is created at 3,900, READY at 4,020, and the agent on it spends
# 150 s setting up and 30 s training again: the preemption cost 420 + 150 + 30 = 600 s. Run "b" is preempted
# at 7,200; the replacement is READY at 7,500 and its agent takes 100 s: 400 s. Run "c" was preempted but has no
# replacement yet: no sample.
HISTORIES = [
    _node(1, "a", ("READY", 60), ("PREEMPTED", 3600), ("DELETED", 3610)),
    _node(2, "a", ("READY", 4020), ("DELETING", 9000), ("DELETED", 9010), created=3900),
    _node(3, "b", ("READY", 60), ("PREEMPTED", 7200), ("DELETED", 7210)),
    _node(4, "b", ("READY", 7500), ("DELETING", 9000), ("DELETED", 9010), created=7400),
    _node(5, "c", ("READY", 60), ("PREEMPTED", 1800)),
]
ATTEMPTS = {
    "a": [_attempt(1, 30, 120), _attempt(2, 4000, 150, recomputed_s=30)],
    "b": [_attempt(1, 30, 120), _attempt(2, 7450, 100)],
    "c": [_attempt(1, 30, 120)],
}


@pytest.mark.unit
def test_a_recovery_is_preempted_to_replacement_ready_plus_setup_and_work_redone() -> None:
    assert recovery_samples(HISTORIES, ATTEMPTS) == {KEYS[0]: [600.0, 400.0]}
    # Without the agent's status of the replacement's attempt the cost is not known yet: no sample.
    assert recovery_samples(HISTORIES, {"a": ATTEMPTS["a"][:1], "b": ATTEMPTS["b"]}) == {KEYS[0]: [400.0]}


@pytest.mark.unit
def test_the_inputs_are_learned_where_history_exists_and_say_so() -> None:
    risks = learn_risk(HISTORIES, _at(10_000), DEFAULTS.prior)
    inputs = learn(risks, HISTORIES, ATTEMPTS, KEYS, DEFAULTS)
    ready_hours = sum(r.ready_hours for r in risks)
    assert inputs.hazard_per_hour.learned
    assert inputs.hazard_per_hour.value == pytest.approx(3 / ready_hours)
    assert "learned from 3 preemptions" in inputs.hazard_per_hour.source
    assert inputs.recovery_s.learned and inputs.recovery_s.value == pytest.approx(500.0)
    assert "learned from 2 preemptions" in inputs.recovery_s.source
    # Five attempts stepping 3,000 s and redoing 30 s, none losing more than a minute: no loss in 4.2 hours,
    # which cannot yet rule the assumed 0.05 an hour out (its 95 % upper end is 0.88 an hour).
    assert not inputs.lost_work_per_hour.learned
    assert inputs.lost_work_per_hour.value == DEFAULTS.lost_work_per_hour


@pytest.mark.unit
def test_without_history_every_input_is_the_labelled_assumption() -> None:
    inputs = learn([], [], {}, [RiskKey(EU, "v2-8", "spot")], DEFAULTS)
    assert (inputs.hazard_per_hour.value, inputs.recovery_s.value, inputs.lost_work_per_hour.value) == (0.1, 900.0,
                                                                                                          0.05)
    for found, setting in ((inputs.hazard_per_hour, "spot_preemptions_per_hour"),
                           (inputs.recovery_s, "recovery_s"), (inputs.lost_work_per_hour, "lost_work_per_hour")):
        assert not found.learned and found.source.startswith(f"assumed: {setting}")
    # Another zone's history is not this zone's.
    risks = learn_risk(HISTORIES, _at(10_000), 0.1)
    other = learn(risks, HISTORIES, ATTEMPTS, [RiskKey(EU, "v2-8", "spot")], DEFAULTS)
    assert not other.hazard_per_hour.learned and not other.recovery_s.learned


@pytest.mark.unit
def test_lost_work_is_losses_per_running_hour_or_bounded_by_a_long_clean_history() -> None:
    lossy = [_attempt(1, 0, 60, productive_s=7200), _attempt(2, 8000, 60, productive_s=7200,
                                                              recomputed_s=LOSS_MIN_S + 1)]
    found = lost_work(lossy, 0.05)
    assert found.learned and found.value == pytest.approx(1 / ((14_400 + LOSS_MIN_S + 1) / 3600))
    # 200 hours without a loss: at most 3.69 / 200 = 0.018 an hour at 95 %, which rules the assumed 0.05 out.
    clean = [_attempt(n, 0, 60, productive_s=3600) for n in range(200)]
    bounded = lost_work(clean, 0.05)
    assert bounded.learned and bounded.value == pytest.approx(3.6889 / 200, rel=1e-3)
    assert "no loss" in bounded.source
    # A notice save's redone step call (under a minute) is not a loss.
    assert lost_work([_attempt(1, 0, 60, productive_s=3600, recomputed_s=LOSS_MIN_S)], 0.05).source.startswith(
        "assumed")


@pytest.mark.unit
def test_the_deadline_rule_and_every_auto_take_the_learned_inputs(tmp_path: Path) -> None:
    from tpuops.config import load_settings
    from tpuops.launch.jobs import plan_train
    from tpuops.session import store

    (tmp_path / "tpuops.toml").write_text("")
    settings = load_settings(config_path=tmp_path / "tpuops.toml", environ={"TPUOPS_HOME": str(tmp_path / "home")})
    spec = _auto_experiment(tmp_path)
    risks = learn_risk(HISTORIES, _at(10_000), 0.1)
    asked: list[list[RiskKey]] = []

    def learner(keys: Sequence[RiskKey]) -> PlanInputs:
        asked.append(list(keys))
        return learn(risks, HISTORIES, ATTEMPTS, keys, DEFAULTS)

    plan = plan_train(settings, spec, store(settings), learner=learner, base_dir=tmp_path)
    assert asked == [keys_of(plan.record)]
    inputs = plan.record.inputs
    assert inputs is not None
    rule = capacity_rule(plan.record, hazard_per_hour=99.0, recovery_s=99.0)
    assert rule is not None
    assert (rule.hazard_per_hour, rule.recovery_s) == (inputs.hazard_per_hour.value, inputs.recovery_s.value)
    train = plan.spec.train
    assert train is not None and train.checkpoint_loss_rate_per_hour == inputs.lost_work_per_hour.value
    assert train.checkpoint_every_seconds == young_daly_s(10.0, inputs.lost_work_per_hour.value)
    # A record from before learned inputs keeps the settings' assumptions.
    old = plan.record.model_copy(update={"inputs": None})
    rule = capacity_rule(old, hazard_per_hour=0.7, recovery_s=700.0)
    assert rule is not None and (rule.hazard_per_hour, rule.recovery_s) == (0.7, 700.0)


def _auto_experiment(tmp_path: Path) -> Path:
    """The digits experiment with ``every: auto`` and a deadline, on its sample data."""
    import shutil

    from tpuops.api import data_sample

    root = REPO
    for name in ("digits_cnn.yaml", "models.py"):
        shutil.copy(root / "experiments" / name, tmp_path / name)
    data_sample("digits", tmp_path / "data" / "digits")
    text = (tmp_path / "digits_cnn.yaml").read_text()
    text = (text.replace("train: data/digits/train", f"train: {tmp_path}/data/digits/train")
            .replace("eval: data/digits/test", f"eval: {tmp_path}/data/digits/test")
            .replace("  every_steps: 100\n  every_seconds: 60\n", "  every: auto\n"))
    assert "every: auto" in text
    spec = tmp_path / "digits_cnn.yaml"
    spec.write_text(text + "finish_within: 30h\n")
    return spec


@pytest.mark.unit
def test_status_shows_each_input_of_a_run_with_its_source() -> None:
    from tpuops.cli.nodes import _input_lines

    risks = learn_risk(HISTORIES, _at(10_000), 0.1)
    inputs = learn(risks, HISTORIES, ATTEMPTS, KEYS, DEFAULTS)
    lines = _input_lines({"run_id": "r", "inputs": inputs.model_dump(mode="json")})
    assert lines[1] == f"  r: recovery_s 500 ({inputs.recovery_s.source})"
    assert lines[2].startswith("  r: lost_work_per_hour 0.05 (assumed: lost_work_per_hour in tpuops.toml")
    assert _input_lines({"run_id": "r", "inputs": None}) == []  # a record from before them, or neither rule
