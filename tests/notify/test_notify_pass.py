"""Notifications from the real controller pass, to real receivers on loopback (issue 33).

The cloud is the in-memory provider (held to the Cloud TPU adapter's contract); the store, the ledger, the
leases, the controller and its pass are the real ones, and so are the receivers: an HTTP server taking the
generic webhook and the Slack-compatible one, and an SMTP server (aiosmtpd) taking the email, with a login.
Time is passed to the passes (``now``), so a retry's backoff is crossed without waiting.

Checked: a run that succeeds, one that fails and one its budget stops bring one message each to every
target, and never again; a receiver that holds and then answers 500 gets the message later, once, while the
pass that could not deliver it recovered another run's preemption without waiting for it; two controllers
passing at once send one message; no secret is in any file the test produced, in a pass's progress or in
``tpuops events --json``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import LIVE, declare_run, poll, write_status
from receivers import (
    SECRET_PATH,
    SMTP_PASSWORD,
    SMTP_USER,
    HttpReceiver,
    SmtpReceiver,
    files_holding,
    http_receiver,
    mail_target,
    smtp_receiver,
    target_toml,
)

from tpuops import runs
from tpuops.billing.ledger import Ledger
from tpuops.config import Settings, load_settings
from tpuops.controller.reconcile import Controller
from tpuops.core.notices import State
from tpuops.fleet import Fleet
from tpuops.providers.memory import MemoryProvider
from tpuops.providers.nodes import NodeState
from tpuops.store import open_store
from tpuops.sweeps.advance import SweepStep

pytestmark = pytest.mark.emulator  # loopback receivers (HTTP, SMTP): servers of its own

ZONE = "us-central1-b"
T0 = 1_900_000_000.0
DONE = {**LIVE, "phase": "done", "exit_class": "succeeded", "step": 1000,
        "evals": [{"step": 1000, "metrics": {"accuracy": 0.93}}]}
BROKEN = {**LIVE, "phase": "done", "exit_class": "user-error", "exit_code": 1,
          "traceback": "Traceback (most recent call last):\n  File \"train.py\", line 3\n"
                       "ValueError: bad <input> & \x1b[31mcolour\x1b[0m"}


@dataclass
class World:
    settings: Settings
    store: Any
    cloud: MemoryProvider
    hook: HttpReceiver
    chat: HttpReceiver
    mail: SmtpReceiver
    progress: list[str]
    root: Path

    def controller(self, holder: str) -> Controller:
        fleet = Fleet(self.cloud, self.settings, Ledger(self.settings.ledger_path))
        return Controller(self.settings, self.store, fleet, billing=fleet.billing, sweeps=SweepStep(), holder=holder,
                          status_refresh_s=0.0, progress=self.progress.append)

    def declare(self, run_id: str, *, budget_usd: float | None = None) -> None:
        declare_run(self.settings, self.store, run_id, ZONE, budget_usd=budget_usd)

    def status(self, run_id: str, fields: dict[str, Any]) -> None:
        write_status(self.store, run_id, fields)

    def memory(self, run_id: str) -> runs.Memory:
        return runs.load_memory(self.store, run_id)[0]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with http_receiver() as hook, http_receiver() as chat, smtp_receiver() as mail:
        config = tmp_path / "tpuops.toml"
        config.write_text(f'zones = ["{ZONE}"]\nstore = "{tmp_path / "store"}"\n'
                          'lease_ttl_s = 3600.0\nmax_run_hours = 0\n\n[notify]\ndashboard_url = "http://127.0.0.1:8080"\n'
                          + target_toml("hook", kind="webhook", url_env="HOOK_URL")
                          + target_toml("chat", kind="slack", url_env="CHAT_URL")
                          + mail_target("mail", mail.port, user=SMTP_USER, password_env="SMTP_PASSWORD"))
        settings = load_settings(config_path=config, environ={
            "TPUOPS_HOME": str(tmp_path / "home"), "HOOK_URL": hook.url, "CHAT_URL": chat.url,
            "SMTP_PASSWORD": SMTP_PASSWORD})
        yield World(settings, open_store(settings.store_root), MemoryProvider(poll_interval_s=0.01), hook, chat,
                    mail, [], tmp_path)


def _running(world: World, controller: Controller, *run_ids: str, now: float = T0) -> None:
    for run_id in run_ids:
        world.declare(run_id)
    controller.run_pass(now=now)
    for run_id in run_ids:
        world.cloud.set_state(ZONE, run_id, NodeState.READY)
    controller.run_pass(now=now + 1)


def _no_secret_anywhere(world: World, *outputs: str) -> None:
    secrets = (SECRET_PATH, SMTP_PASSWORD)
    assert files_holding(world.root, *secrets) == []
    for text in (*world.progress, *outputs):
        assert not any(secret in text for secret in secrets), text


def test_a_success_a_failure_and_a_budget_bring_one_message_each_to_every_target(world: World) -> None:
    controller = world.controller("cron")
    _running(world, controller, "run-ok", "run-bad")
    world.declare("run-broke", budget_usd=0.0)
    world.status("run-ok", DONE)
    world.status("run-bad", BROKEN)
    for offset in range(2, 8):
        controller.run_pass(now=T0 + offset)

    kinds = {got.body["subject"]["id"]: got.body["kind"] for got in world.hook.delivered}
    assert kinds == {"run-ok": "succeeded", "run-bad": "failed", "run-broke": "budget"}
    assert len(world.hook.delivered) == len(world.chat.delivered) == len(world.mail.messages) == 3
    for got in world.hook.delivered:
        assert got.key == got.body["idempotency_key"] and got.body["schema"] == "tpuops.notification/1"
        assert got.body["link"] == f"http://127.0.0.1:8080/runs/{got.body['subject']['id']}"
    ok = next(got.body for got in world.hook.delivered if got.body["kind"] == "succeeded")
    assert ok["metrics"] == {"accuracy": 0.93} and ok["cost_usd"] is not None
    bad = next(got.body for got in world.hook.delivered if got.body["kind"] == "failed")
    assert bad["log_tail"][-1] == "ValueError: bad <input> & [31mcolour[0m"  # control characters dropped
    slack = next(got.body for got in world.chat.delivered if "run-bad" in got.body["text"])
    assert "bad &lt;input&gt; &amp;" in json.dumps(slack["blocks"]) and "<input>" not in json.dumps(slack["blocks"])
    subjects = sorted(message["Subject"] for message in world.mail.messages)
    assert subjects == ["[tpuops] run run-bad failed", "[tpuops] run run-broke stopped: its budget is spent",
                        "[tpuops] run run-ok succeeded"]
    assert {login for login, _ in world.mail.logins} == {SMTP_USER}
    assert len({message["Message-ID"] for message in world.mail.messages}) == 3

    for run_id in ("run-ok", "run-bad", "run-broke"):
        memory = world.memory(run_id)
        assert [[d.state for d in n.deliveries] for n in memory.notices] == [[State.SENT] * 3]
        assert sum(event["kind"] == "notified" for event in memory.events) == 3
    assert runs.active_run_ids(world.store) == []  # delivered, finished and gone: out of the index
    events = world.memory("run-bad").model_dump_json()
    _no_secret_anywhere(world, events)


def test_a_receiver_failing_for_a_while_gets_it_later_once_and_recovery_never_waited(world: World) -> None:
    controller = world.controller("cron")
    _running(world, controller, "run-ok", "run-next")
    world.status("run-ok", DONE)
    world.cloud.set_state(ZONE, "run-next", NodeState.PREEMPTED)
    world.hook.hold()
    world.hook.failing = 2
    creates = len([call for call in world.cloud.calls if call[0] == "CreateNode"])
    passing = threading.Thread(target=controller.run_pass, kwargs={"now": T0 + 2})
    passing.start()
    poll(world.hook.got_held.is_set, "the notice reaches the holding receiver")
    poll(lambda: len([call for call in world.cloud.calls if call[0] == "CreateNode"]) > creates,
         "the preempted run is replaced while the other run's message is held")
    world.hook.release.set()
    passing.join(60)
    assert not passing.is_alive()
    assert world.hook.delivered == [] and world.memory("run-ok").notices[0].deliveries[0].state is State.PENDING
    assert len(world.chat.delivered) == 1 and len(world.mail.messages) == 1  # the other targets are not held up

    now = T0 + 2
    for _ in range(6):  # retries at +30 s, +60 s, +120 s: two 500s, then delivered
        now += 125
        controller.run_pass(now=now)
    assert len(world.hook.delivered) == 1 and len(world.hook.refused) == 2
    keys = {got.key for got in (*world.hook.held, *world.hook.refused, *world.hook.delivered)}
    assert len(keys) == 1  # every try carried the same idempotency key
    memory = world.memory("run-ok")
    assert [d.state for d in memory.notices[0].deliveries] == [State.SENT] * 3
    assert [e["kind"] for e in memory.events].count("notify-failed") == 3
    assert len(world.chat.delivered) == 1 and len(world.mail.messages) == 1
    _no_secret_anywhere(world)


def test_two_controllers_at_once_send_one_message(world: World) -> None:
    cron, watch = world.controller("cron"), world.controller("watch")
    _running(world, cron, "run-ok")
    world.status("run-ok", DONE)
    start = threading.Barrier(2, timeout=60)
    errors: list[BaseException] = []

    def passes(controller: Controller) -> None:
        try:
            start.wait()
            for offset in range(2, 6):
                controller.run_pass(now=T0 + offset)
        except BaseException as err:  # reported by the test thread
            errors.append(err)

    threads = [threading.Thread(target=passes, args=(c,)) for c in (cron, watch)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    assert len(world.hook.delivered) == len(world.chat.delivered) == len(world.mail.messages) == 1
    _no_secret_anywhere(world)


def test_a_sweep_that_ends_sends_one_message_and_its_trials_none(tmp_path: Path) -> None:
    from helpers import sweeps_world

    from tpuops.providers.cloud_model import CloudModel
    from tpuops.sim.engine import Simulation
    from tpuops.sim.model import AgentModel
    from tpuops.sweeps import ops as sweep_ops

    with http_receiver() as hook:
        sim = sweeps_world(tmp_path, ("s",), config_tail=target_toml("hook", kind="webhook", url=hook.url))
        assert sim.run(max_hours=4).ended
        assert Simulation(sim.settings, tmp_path / "quiet", CloudModel(),
                          AgentModel(total_steps=10, steps_per_s=1)).settings.notify.targets == {}
        for _ in range(2):  # later passes send nothing more
            sim.controller.run_pass()
        assert [(got.body["kind"], got.body["subject"]) for got in hook.delivered] == [
            ("sweep-finished", {"type": "sweep", "id": "s"})]
        body = hook.delivered[0].body  # the simulated agent reports no accuracy: no trial completed, no best
        assert (body["title"], body["details"], body["metrics"]) == (
            "sweep s completed", ["completed: all 2 trials ended"], {})
        assert body["cost_usd"] > 0
        state, _ = sweep_ops.load_state(sim.store, "s")
        assert [[d.state for d in n.deliveries] for n in state.notices] == [[State.SENT]]
        assert sweep_ops.active_sweeps(sim.store) == []
        config = str(tmp_path / "tpuops.toml")  # the user's own file, where this test put the URL
        assert [f for f in files_holding(tmp_path, SECRET_PATH) if not f.startswith(config)] == []


def test_a_recovered_preemption_and_a_user_s_stop_tell_nothing_and_events_json_shows_delivery_states(
        world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from tpuops.cli.main import run

    controller = world.controller("cron")
    _running(world, controller, "run-pre", "run-stop")
    world.cloud.set_state(ZONE, "run-pre", NodeState.PREEMPTED)
    runs.request_stop(world.store, "run-stop", "stopped by the user", T0 + 2)
    controller.run_pass(now=T0 + 2)
    world.cloud.set_state(ZONE, "run-pre", NodeState.READY)
    for offset in range(3, 6):
        controller.run_pass(now=T0 + offset)
    assert world.memory("run-pre").preemptions == 1 and world.memory("run-stop").outcome == "stopped"
    assert world.memory("run-pre").notices == world.memory("run-stop").notices == []
    assert world.hook.delivered == world.chat.delivered == [] and world.mail.messages == []

    world.status("run-pre", DONE)
    world.hook.failing = 1
    for offset in range(6, 9):
        controller.run_pass(now=T0 + offset)
    assert [got.body["kind"] for got in world.hook.refused] == ["succeeded"] and len(world.chat.delivered) == 1

    monkeypatch.setenv("TPUOPS_HOME", str(world.root / "home"))
    for name, value in (("HOOK_URL", world.hook.url), ("CHAT_URL", world.chat.url), ("SMTP_PASSWORD", SMTP_PASSWORD)):
        monkeypatch.setenv(name, value)
    assert run(["--config", str(world.root / "tpuops.toml"), "events", "run-pre", "--json"]) == 0
    out = capsys.readouterr().out
    notice, = json.loads(out)["notices"]
    assert (notice["kind"], notice["key"]) == ("succeeded", world.chat.delivered[0].key)
    states = {d["target"]: (d["state"], d["attempts"], d["next_at"], d["error"]) for d in notice["deliveries"]}
    assert states == {"hook": ("pending", 1, T0 + 6 + 30, "the receiver answered HTTP 500"),
                      "chat": ("sent", 1, None, None), "mail": ("sent", 1, None, None)}
    _no_secret_anywhere(world, out)
