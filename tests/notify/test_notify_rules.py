"""What is worth a message (``tpuops.notify.rules``, pure), the config's refusals, and ``tpuops notify test``.

The rules need no server: a memory, the events a pass just added and the time in, notices out. The config
and the command are run in-process against real receivers on loopback (an HTTP server, aiosmtpd).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from receivers import (
    SECRET_PATH,
    SMTP_PASSWORD,
    SMTP_USER,
    files_holding,
    free_port,
    http_receiver,
    mail_target,
    smtp_receiver,
    target_toml,
)

from tpuops.billing.deadline import LATE_EVEN_ON_DEMAND
from tpuops.cli.main import run
from tpuops.core.kinds import Capacity
from tpuops.core.notices import DEFAULT_KINDS, Kind, Notice
from tpuops.notify.rules import KIND_OF_OUTCOME, RunFacts, run_notices
from tpuops.runs import Memory, Outcome

T0 = 1_900_000_000.0
FACTS = RunFacts("run-1", ("hook",), frozenset(DEFAULT_KINDS), stalled_after_s=3600.0)


def _ended(outcome: Outcome) -> tuple[Memory, list]:
    memory = Memory()
    memory.finish(T0, outcome, "why")
    return memory, memory.events[-1:]


@pytest.mark.unit
def test_every_outcome_has_its_entry_and_the_user_s_own_stop_is_worth_nothing() -> None:
    assert set(KIND_OF_OUTCOME) == set(Outcome)
    found = {}
    for outcome in Outcome:
        memory, new = _ended(outcome)
        found[outcome] = [n.kind for n in run_notices(FACTS, memory, new, T0)]
    assert found[Outcome.SUCCEEDED] == [Kind.SUCCEEDED]
    assert found[Outcome.CRASHED] == [Kind.RESTARTS_EXHAUSTED]
    assert found[Outcome.BUDGET_EXHAUSTED] == [Kind.BUDGET]
    assert found[Outcome.USER_ERROR] == found[Outcome.DIVERGED] == [Kind.FAILED]
    assert found[Outcome.STOPPED] == found[Outcome.PRUNED] == []


@pytest.mark.unit
def test_a_decision_is_worth_one_notice_with_a_stable_key_and_never_a_second() -> None:
    memory, new = _ended(Outcome.SUCCEEDED)
    first = run_notices(FACTS, memory, new, T0)
    again = run_notices(FACTS, memory, new, T0 + 60)
    assert [n.key for n in first] == [n.key for n in again] == ["run-1/succeeded/1900000000000"]
    assert [d.target for d in first[0].deliveries] == ["hook"]
    memory.notices.extend(first)
    assert run_notices(FACTS, memory, new, T0 + 60) == []


@pytest.mark.unit
def test_kinds_turned_off_no_target_and_a_sweep_s_trial_are_quiet() -> None:
    memory, new = _ended(Outcome.SUCCEEDED)
    off = RunFacts("run-1", ("hook",), frozenset(DEFAULT_KINDS) - {Kind.SUCCEEDED}, 3600.0)
    nobody = RunFacts("run-1", (), frozenset(DEFAULT_KINDS), 3600.0)
    trial = RunFacts("s-t0001", ("hook",), frozenset(DEFAULT_KINDS), 3600.0, sweep="s")
    assert run_notices(off, memory, new, T0) == run_notices(nobody, memory, new, T0) == []
    assert run_notices(trial, memory, new, T0) == []


@pytest.mark.unit
def test_a_recovered_preemption_is_not_worth_a_message() -> None:
    memory = Memory()
    memory.event(T0, "preempted", "node PREEMPTED in us-central1-b (preemption 1)")
    memory.event(T0, "create", "attempt 2 in us-central1-b")
    assert run_notices(FACTS, memory, memory.events, T0) == []


@pytest.mark.unit
def test_no_progress_while_billed_is_told_once_per_stall() -> None:
    memory = Memory(ready_since=T0, progress_at=T0, progress_attempt=1, progress_step=40)
    assert run_notices(FACTS, memory, [], T0 + 3599) == []
    stalled = run_notices(FACTS, memory, [], T0 + 3600)
    assert [n.kind for n in stalled] == [Kind.STALLED] and "60 min" in stalled[0].details[0]
    memory.notices.extend(stalled)
    assert run_notices(FACTS, memory, [], T0 + 7200) == []
    memory.progress_step, memory.progress_at = 80, T0 + 7200  # progress, then a new stall: a new notice
    assert [n.kind for n in run_notices(FACTS, memory, [], T0 + 7200 + 3600)] == [Kind.STALLED]
    memory.ready_since = None  # no READY node: nothing billed, nothing to say
    assert run_notices(FACTS, memory, [], T0 + 99999) == []


@pytest.mark.unit
def test_a_deadline_move_to_on_demand_and_a_deadline_that_cannot_be_met() -> None:
    facts = RunFacts("run-1", ("hook",), frozenset(DEFAULT_KINDS), 3600.0, deadline_at=T0 + 7200)
    memory = Memory(capacity=Capacity.ON_DEMAND)
    memory.event(T0, "capacity", "2 h of work needs 3 h on spot: moving from spot to on-demand")
    memory.event(T0 + 1, "capacity", f"... {LATE_EVEN_ON_DEMAND}: moving from spot to on-demand")
    kinds = [n.kind for n in run_notices(facts, memory, memory.events, T0 + 1)]
    assert kinds == [Kind.DEADLINE_ON_DEMAND, Kind.DEADLINE_AT_RISK]
    passed = run_notices(facts, Memory(), [], T0 + 7200)
    assert [n.kind for n in passed] == [Kind.DEADLINE_AT_RISK]


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tpuops.toml"
    path.write_text(f'zones = ["us-central1-b"]\nstore = "{tmp_path / "store"}"\n{text}')
    return path


@pytest.mark.parametrize(("text", "says"), [
    ('[notify.targets.m]\nkind = "email"\nhost = "h"\nsender = "a@b"\nto = ["c@d"]\npassword = "pw-s3cr3t"\n',
     "notify.targets.m: a password is never read from the config: give password_env"),
    (f'[notify.targets.w]\nkind = "webhook"\nurl = "http://example.com/{SECRET_PATH}"\n',
     "notify.targets.w.url: a webhook URL must be https:// (http:// only to a loopback address)"),
    ('[notify]\non = ["sucess"]\n', "notify.on.0: Input should be"),
    (f'[notify.targets.w]\nkind = "webhook"\nurl = "https://example.com/{SECRET_PATH} x"\n',
     "notify.targets.w.url: a webhook URL holds a space (character 49): write it without (percent-encode"),
    ('[notify.targets.m]\nkind = "email"\nhost = "h"\nsender = "a@b"\nto = ["c@d\\nBcc: e@f"]\n',
     "notify.targets.m.to: a control character (a CR, an LF, a tab...) is not allowed here"),
])
@pytest.mark.unit
def test_bad_notify_config_is_refused_in_one_line_without_echoing_a_secret(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, text: str,
        says: str) -> None:
    monkeypatch.setenv("TPUOPS_HOME", str(tmp_path / "home"))
    assert run(["--config", str(_config(tmp_path, text)), "notify", "test"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert "pw-s3cr3t" not in err and SECRET_PATH not in err


def _run_hooked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], url: str,
                target: str, command: list[str]) -> tuple[int, Any]:
    """Run ``command`` with ``HOOK_URL`` set to ``url`` and ``target`` configured: its exit code and its output."""
    monkeypatch.setenv("TPUOPS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HOOK_URL", url)
    code = run(["--config", str(_config(tmp_path, target)), *command])
    return code, capsys.readouterr()


@pytest.mark.parametrize("bad", [" ", "\r", "\n", "\r\n", "\t", "\x7f", "é"])
@pytest.mark.parametrize("command", [["notify", "test"], ["train", "exp.yaml"], ["up", "n-1", "--accelerator", "v3-8"],
                                     ["sweep", "start", "sweep.yaml"]])
@pytest.mark.unit
def test_a_url_env_value_the_http_client_would_refuse_stops_a_command_that_starts_work_in_one_line_without_the_secret(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, bad: str,
        command: list[str]) -> None:
    code, captured = _run_hooked(tmp_path, monkeypatch, capsys, f"https://hooks.example.com/{SECRET_PATH}{bad}more",
                                 target_toml("hook", kind="webhook", url_env="HOOK_URL"), command)
    assert code == 2
    err = captured.err.strip()
    assert err.startswith("error: notify.targets.hook: the environment variable HOOK_URL (url_env): a webhook URL "
                          "holds "), err
    assert len(err.splitlines()) == 1 and captured.out == ""
    assert SECRET_PATH not in err and "hooks.example.com" not in err
    assert not (tmp_path / "store").exists()  # refused before anything was read or written


@pytest.mark.parametrize("where", ["url_env", "url"])
@pytest.mark.parametrize("command", [["reconcile"], ["watch", "--passes", "2", "--interval", "0.1", "--no-wake"],
                                     ["runs"], ["stop", "no-such-run"]])
@pytest.mark.unit
def test_a_malformed_webhook_url_holds_its_target_back_and_a_command_that_drives_work_goes_on_saying_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, where: str,
        command: list[str]) -> None:
    target = (target_toml("hook", kind="webhook", url_env="HOOK_URL") if where == "url_env" else
              target_toml("hook", kind="webhook", url=f"http://hooks.example.com/{SECRET_PATH}"))
    code, captured = _run_hooked(tmp_path, monkeypatch, capsys, f"https://hooks.example.com/{SECRET_PATH} x", target,
                                 command)
    said = [line for line in captured.err.splitlines() if "held back" in line]
    assert code == (2 if command[0] == "stop" else 0), captured.err  # stop: the unknown run, not the URL
    why = ("notify.targets.hook: the environment variable HOOK_URL (url_env): a webhook URL holds a space"
           if where == "url_env" else "notify.targets.hook.url: a webhook URL must be https://")
    assert said and all(line.startswith(f"tpuops: {why}") for line in said), captured.err
    assert len(said) == (2 if command[0] == "watch" else 1)  # once per command; a watch's after each pass but its last
    assert all(line.endswith("held back: its messages wait, unsent, until the URL is fixed") for line in said)
    assert SECRET_PATH not in captured.err + captured.out and "hooks.example.com" not in captured.err + captured.out


@pytest.mark.emulator
def test_notify_test_sends_one_message_per_target_and_says_what_happened(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    with http_receiver() as hook, http_receiver() as gone, smtp_receiver() as mail:
        password = tmp_path / "smtp-password"
        config = _config(tmp_path, target_toml("hook", kind="webhook", url_env="HOOK_URL")
                         + target_toml("gone", kind="slack", url=gone.url.replace(SECRET_PATH, "nothing-here"))
                         + mail_target("mail", mail.port, user=SMTP_USER, password_file=str(password)))
        password.write_text(SMTP_PASSWORD + "\n")
        monkeypatch.setenv("TPUOPS_HOME", str(tmp_path / "home"))
        monkeypatch.setenv("HOOK_URL", hook.url)
        assert run(["--config", str(config), "notify", "test", "--json"]) == 1
        out = capsys.readouterr().out
        assert json.loads(out) == {"targets": [
            {"target": "hook", "kind": "webhook", "result": "sent"},
            {"target": "gone", "kind": "slack",
             "result": "failed: the receiver answered HTTP 404: the webhook is gone"},
            {"target": "mail", "kind": "email", "result": "sent"}]}
        assert [got.body["kind"] for got in hook.delivered] == ["test"] and len(mail.messages) == 1
        assert re.fullmatch(r"tpuops-local/test/\d{13}", hook.delivered[0].key or ""), hook.delivered[0].key
        assert SECRET_PATH not in out and SMTP_PASSWORD not in out
        assert files_holding(tmp_path, SECRET_PATH) == []

        monkeypatch.delenv("HOOK_URL")
        assert run(["--config", str(config), "notify", "test"]) == 2
        assert capsys.readouterr().err.strip() == ("error: notify target 'hook': the environment variable HOOK_URL "
                                                    "(url_env) is not set")


@pytest.mark.emulator
def test_notify_test_refuses_an_smtp_host_where_nothing_answers_before_sending_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    with http_receiver() as hook:
        config = _config(tmp_path, target_toml("hook", kind="webhook", url=hook.url) + mail_target("mail", port))
        monkeypatch.setenv("TPUOPS_HOME", str(tmp_path / "home"))
        assert run(["--config", str(config), "notify", "test"]) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"error: notify target 'mail': no SMTP server answers at 127.0.0.1:{port}"
        assert hook.delivered == []


@pytest.mark.unit
def test_a_notice_round_trips_through_the_memory() -> None:
    memory, new = _ended(Outcome.FAILED)
    memory.notices.extend(run_notices(FACTS, memory, new, T0))
    again = Memory.model_validate_json(memory.to_bytes())
    assert again.notices == memory.notices and isinstance(again.notices[0], Notice)


@pytest.mark.unit
def test_a_sweep_s_ending_carries_its_best_trial_unless_turned_off() -> None:
    from tpuops.notify.rules import sweep_notice

    notice = sweep_notice("s", ("hook",), frozenset(DEFAULT_KINDS), ("completed", "all 8 trials ended"),
                          (3, 0.9512), "accuracy", 4.567, T0)
    assert notice is not None and notice.key == "s/sweep-finished/1900000000000" and notice.scope == "sweep"
    assert notice.details == ["completed: all 8 trials ended", "best trial 3: accuracy 0.9512"]
    assert (notice.metric, notice.cost_usd) == ({"accuracy": 0.9512}, 4.57)
    assert sweep_notice("s", ("hook",), frozenset({Kind.FAILED}), ("completed", "x"), None, "accuracy", 0, T0) is None


@pytest.mark.unit
def test_an_experiment_or_sweep_names_targets_and_an_unknown_one_is_refused_in_one_line() -> None:
    from tpuops.config import Settings
    from tpuops.core.errors import UsageError
    from tpuops.core.notices import NotifyChoice, NotifySettings, NotifyTarget
    from tpuops.launch.jobs import check_notify

    choice = NotifyChoice.model_validate({"to": ["team", "pager"], "on": ["failed"]})
    settings = Settings(notify=NotifySettings(targets={"team": NotifyTarget(kind="slack", url="https://hooks.example/x")}))
    with pytest.raises(UsageError) as refused:
        check_notify(settings, choice, "exp.yaml")
    assert str(refused.value) == ("exp.yaml: notify: target 'pager' is not in tpuops.toml's [notify.targets] "
                                  "(known: team)")
    check_notify(settings, NotifyChoice(to=["team"]), "exp.yaml")
    assert settings.notify.chosen(NotifyChoice(to=[]))[0] == []  # notifications off for this run
    assert settings.notify.chosen(None)[0] == ["team"]
    assert settings.notify.chosen(choice)[1] == {Kind.FAILED}


@pytest.mark.emulator
def test_deliveries_back_off_give_up_and_are_bounded_per_pass() -> None:
    from tpuops.core.notices import Delivery, NotifySettings, NotifyTarget, State
    from tpuops.notify.outbox import BACKOFF_S, MAX_TRIES, deliver

    with http_receiver() as hook:
        hook.failing = 1000
        config = NotifySettings(give_up_after_s=600, targets={
            "down": NotifyTarget(kind="webhook", url=hook.url),
            "gone": NotifyTarget(kind="webhook", url=hook.url.replace(SECRET_PATH, "deleted"))})
        notices = [Notice(key=f"r/failed/{i}", kind=Kind.FAILED, at=T0, subject="r", title="t",
                          deliveries=[Delivery(target="down"), Delivery(target="gone"), Delivery(target="removed")])
                   for i in range(4)]
        said: list[tuple[str, str]] = []

        def note(kind: str, text: str) -> None:
            said.append((kind, text))

        assert deliver(notices, config, T0, note)
        tried = [d for n in notices for d in n.deliveries if d.attempts]
        assert len(tried) == MAX_TRIES == len(said)  # the rest waits for the next pass
        first = notices[0].deliveries
        assert [d.state for d in first] == [State.PENDING, State.GAVE_UP, State.GAVE_UP]  # 500; 404; not configured
        assert first[0].next_at == T0 + BACKOFF_S[0] and "retrying after 30 s" in said[0][1]
        assert "target 'removed' is no longer in [notify.targets]; given up" in said[2][1]
        assert not deliver(notices[:1], config, T0 + 1, note)  # nothing due before the backoff ends
        deliver(notices[:1], config, T0 + 601, note)  # still failing past give_up_after_s
        assert notices[0].deliveries[0].state is State.GAVE_UP


@pytest.mark.unit
def test_every_kind_s_key_is_subject_kind_and_when_in_ms() -> None:
    """docs/notifications.md: ``<run or sweep>/<kind>/<when, in ms>``, when being the deciding event's time, a
    stall's start, a passed deadline, a sweep's end, the test message's sending."""
    from tpuops.notify.rules import key, sweep_notice

    found: dict[Kind, tuple[str, float]] = {}
    for outcome in (Outcome.SUCCEEDED, Outcome.FAILED, Outcome.CRASHED, Outcome.BUDGET_EXHAUSTED):
        memory, new = _ended(outcome)
        notice, = run_notices(FACTS, memory, new, T0 + 5)
        found[notice.kind] = (notice.key, T0)
    facts = RunFacts("run-1", ("hook",), frozenset(DEFAULT_KINDS), 3600.0, deadline_at=T0 + 7200)
    memory = Memory(capacity=Capacity.ON_DEMAND)
    memory.event(T0 + 1, "capacity", "2 h of work needs 3 h on spot: moving from spot to on-demand")
    notice, = run_notices(facts, memory, memory.events, T0 + 2)
    found[notice.kind] = (notice.key, T0 + 1)
    notice, = run_notices(facts, Memory(), [], T0 + 9000)
    found[notice.kind] = (notice.key, T0 + 7200)  # the deadline that passed
    stalled = Memory(ready_since=T0 - 50, progress_at=T0 + 3.25, progress_attempt=1, progress_step=40)
    notice, = run_notices(FACTS, stalled, [], T0 + 4000)
    found[notice.kind] = (notice.key, T0 + 3.25)  # the stall began at the last progress
    sweep = sweep_notice("run-1", ("hook",), frozenset(DEFAULT_KINDS), ("completed", "x"), None, "accuracy", 0.0,
                         T0 + 8)
    assert sweep is not None
    found[sweep.kind] = (sweep.key, T0 + 8)
    found[Kind.TEST] = (key("run-1", Kind.TEST, T0 + 9), T0 + 9)  # outbox.test_all's, with the project's name

    assert set(found) == set(Kind)
    for kind, (got, when) in found.items():
        assert got == f"run-1/{kind.value}/{round(when * 1000)}", kind
