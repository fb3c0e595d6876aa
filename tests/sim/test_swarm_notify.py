"""The fault swarm's notification receivers (``tpuops.sim.swarm.receivers``, ``notices``): drawn from a stream of
their own, answered in virtual time through the real outbox, a malformed URL held back by a controller process and
refused by a command that starts work, and checkers that
fail on a lost, a phantom and a falsely marked delivery (their guard-off tests are with the others, in
tests/sim/test_swarm.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tpuops.config import load_settings
from tpuops.core.notices import Delivery, Kind, Notice, State
from tpuops.notify.outbox import LATE_S, Round, deliver
from tpuops.notify.wire import wired
from tpuops.sim.engine import START
from tpuops.sim.swarm import draw as draw_module
from tpuops.sim.swarm import faults as f
from tpuops.sim.swarm import notices
from tpuops.sim.swarm import receivers as r
from tpuops.sim.swarm.draw import draw
from tpuops.sim.swarm.runner import _Play

pytestmark = pytest.mark.unit

HOOKS = (r.TargetPlan("hook-0", "webhook", env=True), r.TargetPlan("hook-1", "slack", env=False),
         r.TargetPlan("hook-2", "webhook", env=True))
ALWAYS = (0.0, 1e9)


def _receivers(tmp_path: Path, *faults: f.Fault, at: float = 100.0) -> tuple[r.Receivers, object]:
    plan = r.NotifyPlan(HOOKS, timeout_s=5.0, deliver_budget_s=15.0, faults=faults)
    config = tmp_path / "tpuops.toml"
    config.write_text(r.config_text(7, plan))
    environ = {"TPUOPS_HOME": str(tmp_path / "home"), **r.environ(7, plan)}
    settings = load_settings(config_path=config, environ=environ)
    receivers = r.Receivers(7, plan, config, environ, f.Injected(7, (), lambda: at), lambda: START + at, START)
    return receivers, settings.notify


def _notice(run: str, at: float) -> Notice:
    return Notice(key=f"{run}/failed/{round(at * 1000)}", kind=Kind.FAILED, at=at, subject=run,
                  title=f"run {run} failed", deliveries=[Delivery(target=hook.name) for hook in HOOKS])


def test_the_receivers_draw_from_their_own_stream_so_every_seed_draws_its_runs_and_faults_as_before(
        monkeypatch: pytest.MonkeyPatch) -> None:
    drawn = [draw(seed) for seed in range(200)]
    monkeypatch.setattr(draw_module, "draw_notify", lambda seed, hours: r.NotifyPlan())
    assert [dataclasses.replace(d, notify=r.NotifyPlan()) for d in drawn] == [draw(seed) for seed in range(200)]
    assert 80 < sum(1 for d in drawn if d.notify.targets) < 190  # zero to three targets
    assert {x.kind for d in drawn for x in d.notify.faults} == set(r.KINDS)
    old = drawn[0].to_json()
    del old["notify"]  # a scenario kept before receivers existed replays without any
    assert type(drawn[0]).from_json(old).notify == r.NotifyPlan()


def test_a_pass_delivers_through_the_real_outbox_to_receivers_that_fail_hang_and_drip_in_virtual_time(
        tmp_path: Path) -> None:
    receivers, config = _receivers(tmp_path, f.Fault(r.NOTIFY_5XX, *ALWAYS, arg="hook-0"),
                                   f.Fault(r.NOTIFY_HANG, *ALWAYS, arg="hook-1"),
                                   f.Fault(r.NOTIFY_HANG, *ALWAYS, arg="hook-2", count=1))
    said: list[tuple[str, str]] = []
    first, second = _notice("run-0", START), _notice("run-1", START)
    with wired(receivers):
        one_pass = Round(config.deliver_budget_s)
        receivers.begin_pass()
        assert deliver([first], config, START + 100, lambda *e: said.append(e), one_pass)
        assert receivers.t == 5.0 + LATE_S  # the hang's timeout and the drip's bound, at once: not one per target
        assert deliver([second], config, START + 100, lambda *e: said.append(e), one_pass)
        receivers.end_pass()
    assert [d.state for d in first.deliveries] == [State.PENDING] * 3  # all retried later, none given up
    assert first.deliveries[0].next_at == START + 130 and "HTTP" in first.deliveries[0].error
    assert "no answer" in first.deliveries[1].error and "no answer" in first.deliveries[2].error
    # the targets that did not answer in time are skipped for the rest of the pass; the 5xx one is tried again
    assert [d.attempts for d in second.deliveries] == [1, 0, 0]
    assert receivers.spans == [5.0 + LATE_S]
    taken = [(a.target, a.answer) for a in receivers.arrivals if a.taken]
    assert taken == [("hook-2", "drip")]  # taken, yet pending: the next try is the allowed duplicate, same key
    assert all(a.key == a.body_key for a in receivers.arrivals)
    assert receivers.injected.counts == {r.NOTIFY_5XX: 2, r.NOTIFY_HANG: 2}


def test_a_4xx_gives_up_at_once_and_a_healthy_receiver_takes_it(tmp_path: Path) -> None:
    receivers, config = _receivers(tmp_path, f.Fault(r.NOTIFY_4XX, *ALWAYS, arg="hook-0"))
    notice = _notice("run-0", START)
    with wired(receivers):
        deliver([notice], config, START + 100, lambda *e: None, Round(config.deliver_budget_s))
    assert [d.state for d in notice.deliveries] == [State.GAVE_UP, State.SENT, State.SENT]
    assert receivers.t == 0.0


def test_a_malformed_url_env_is_held_back_by_each_controller_that_starts_and_refused_by_a_command_that_starts_work(
        tmp_path: Path) -> None:
    for index in range(len(r.BAD_URLS)):
        receivers, _ = _receivers(tmp_path, f.Fault(r.NOTIFY_MALFORMED_URL, 50.0, 200.0, arg="hook-2", count=index))
        started, notify = receivers.starts()
        assert started and notify is not None and list(notify.held_back()) == ["hook-2"], r.BAD_URLS[index]
        receivers.begin_pass()  # the one-shot `train` at the window's start
        assert [x.verdict for x in receivers.loads] == ["held back", "refused"], r.BAD_URLS[index]
    later, _ = _receivers(tmp_path, f.Fault(r.NOTIFY_MALFORMED_URL, 50.0, 200.0, arg="hook-2"), at=300.0)
    assert later.starts() == (True, None) and later.loads == []
    assert later.fixed(notify) and not receivers.fixed(notify)


def test_a_held_back_target_gets_nothing_its_deliveries_wait_untried_and_the_others_deliver(tmp_path: Path) -> None:
    receivers, _ = _receivers(tmp_path, f.Fault(r.NOTIFY_MALFORMED_URL, *ALWAYS, arg="hook-0", count=1))
    _, config = receivers.starts()
    assert config is not None
    notice = _notice("run-0", START)
    with wired(receivers):
        deliver([notice], config, START + 100, lambda *e: None, Round(config.deliver_budget_s))
    assert [(d.state, d.attempts) for d in notice.deliveries] == [(State.PENDING, 0), (State.SENT, 1),
                                                                 (State.SENT, 1)]
    assert {a.target for a in receivers.arrivals} == {"hook-1", "hook-2"}


def test_a_watch_restarted_while_a_url_env_is_malformed_holds_it_back_then_tells_it_once_fixed(tmp_path: Path) -> None:
    drawn = draw(107)
    target = next(t for t in drawn.notify.targets if t.env).name
    kill = f.Fault(f.CONTROLLER_KILL, 600.0, 600.0, run=drawn.runs[0].run_id, count=1)
    bad = f.Fault(r.NOTIFY_MALFORMED_URL, 500.0, 3500.0, arg=target, count=1)
    scenario = dataclasses.replace(drawn, faults=(kill, f.Fault(f.CONTROLLER_RIVAL, 900.0, 900.0)),
                                   notify=dataclasses.replace(drawn.notify, faults=(bad,)))
    play = _Play(scenario.played(), tmp_path)
    result = play.play()
    assert result.ok, result.violations  # none_lost among them: the held-back delivery went out in the end
    # the one-shot command at the window's start, the watch restarted after the kill (once: it started and passed, it
    # did not refuse at each pass), the rival cron pass
    assert result.injected[r.NOTIFY_MALFORMED_URL] == 3 and result.injected[f.CONTROLLER_KILL] == 1
    # the run's ending (+40 min, decided by the watch that holds the target back) reaches the other targets at once,
    # and the held-back one only once the URL is fixed and the watch restarted (the pass at +60 min): once, same key
    at = {a.target: (a.at - START, a.key) for a in play.receivers.arrivals if a.taken}
    assert len(play.receivers.arrivals) == len(at) == len(drawn.notify.targets)
    assert {name: when for name, (when, _) in at.items()} == {t.name: 3600.0 if t.name == target else 2400.0
                                                              for t in drawn.notify.targets}
    assert len({key for _, key in at.values()}) == 1


def test_the_notification_checkers_fail_on_a_lost_a_phantom_and_a_false_sent_delivery(tmp_path: Path) -> None:
    seed = next(s for s in range(50)
                if draw(s).notify.targets and all(x.kind != f.STORE_GARBLE for x in draw(s).faults))
    play = _Play(draw(seed), tmp_path)
    assert play.play().ok
    trace, store = play.trace, play.sim.store
    assert trace.receivers is not None and any(a.taken for a in trace.receivers.arrivals)
    assert notices.exactly_once(trace) == notices.none_lost(trace) == []
    from tpuops import runs

    run_id = next(a.key.split("/")[0] for a in trace.receivers.arrivals)
    memory, generation = runs.load_memory(store, run_id)
    memory.notices[0].deliveries[0].state = State.PENDING
    memory.notices.append(memory.notices[0].model_copy(update={"key": f"{run_id}/failed/1"}, deep=True))
    memory.notices[-1].deliveries[0].state = State.SENT
    runs.save_memory(store, run_id, memory, generation)
    trace.receivers.arrivals.append(dataclasses.replace(trace.receivers.arrivals[0], key=f"{run_id}/failed/2",
                                                        body_key=f"{run_id}/failed/2"))
    lost, once = notices.none_lost(trace), notices.exactly_once(trace)
    assert any("still pending" in line for line in lost)
    assert any("which no memory" in line for line in once) and any("never took it" in line for line in once)
