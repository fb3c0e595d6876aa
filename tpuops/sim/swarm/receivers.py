"""The swarm's notification receivers: drawn targets, their faults, and the wire that answers for them.

A seed draws, from a stream of its own (``random.Random(f"{seed}:notify")``, so that the runs, commands and
faults every seed drew before receivers existed stay exactly as they were), zero to three webhook-like
targets (the generic webhook or Slack's, each URL in ``tpuops.toml`` or in a ``url_env`` variable), the
``[notify]`` bounds (``timeout_s``, ``deliver_budget_s``, ``give_up_after_s``, ``stalled_after_s``) and a
few receiver faults (``NotifyPlan``). The runner writes them into the seed's config and environment, so the
controller loads them through the real ``load_settings``.

The receivers are simulated in-process in virtual time: ``Receivers`` is a ``tpuops.notify.wire.Wire``, the
one seam of the real delivery code (``tpuops.notify.send`` builds the request, ``tpuops.notify.outbox``
rounds, bounds, marks and retries as in production). Its POST answers at once from the target's faults, in
urllib's own terms (an ``HTTPError``, a socket's ``TimeoutError``, ``http.client.BadStatusLine``), and its
clock is a pass's virtual delivery time: a hang holds the send ``timeout_s`` (or, dripping, for ever) of that
clock and never a real second. A pass has no duration on the world's clock, so that delivery time is kept
apart, per pass (``spans``), for ``liveness.delivery_bounded``.

Whether a call meets a fault is a hash of the seed, the target, the notice's key and the try (``faults.chance``),
as the swarm's other faults are: the same seed answers the same sends the same way on a replay.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import math
import random
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Any

from tpuops.config import load_settings
from tpuops.core.errors import UsageError
from tpuops.core.notices import NotifySettings
from tpuops.notify.wire import Waiter, Wire
from tpuops.sim.swarm import faults as f

NOTIFY_5XX = "notify.5xx"
"""A share (``rate``) of the target's (``arg``) deliveries answered 500, 502, 503 or 429 over the window."""
NOTIFY_4XX = "notify.4xx"
"""A share of the target's deliveries answered 400, 403, 404 or 410 (a webhook deleted): given up at once."""
NOTIFY_HANG = "notify.hang"
"""A share of the target's deliveries never answered: silent (``count`` 0: the socket's timeout fires at
``timeout_s``), or dripping (``count`` 1: the message is taken but the answer never ends; only the pass's own
bound stops the wait). Costs the pass virtual time, never real time."""
NOTIFY_BAD_ANSWER = "notify.bad_answer"
"""A share of the target's deliveries answered with something that is not HTTP (``http.client.BadStatusLine``:
outside urllib's errors and the taxonomy, what ``notify.isolated_delivery`` holds to that delivery)."""
NOTIFY_MALFORMED_URL = "notify.malformed_url"
"""The target's ``url_env`` variable holds a URL the HTTP client would refuse (``BAD_URLS[count]``) over the
window: a one-shot command that starts work (``train``, ``notify test``) at its start must refuse it in one line;
every controller process started in it (a rival cron pass, a watch restarted after a kill) must start and pass
with that target held back (nothing sent to it, its deliveries pending) and say so in one line; a process already
running keeps the URL it read. When the window ends the user restarts the watch that holds it back (a fixed
variable reaches a running process no other way) and its deliveries go out (docs/notifications.md)."""

KINDS = (NOTIFY_5XX, NOTIFY_4XX, NOTIFY_HANG, NOTIFY_BAD_ANSWER, NOTIFY_MALFORMED_URL)
"""The receiver fault kinds, in the summary's order."""

BAD_URLS = ("https://hooks.swarm.invalid/a b", "https://hooks.swarm.invalid/x\r\nX-Injected: 1",
            "https://hooks.swarm.invalid/x\n", "https:///no-host", "https://hooks.swarm.invalid:0/x",
            "https://hooks.swarm.invalid/caf\u00e9", "http://hooks.swarm.invalid/plain", "\thttps://hooks.swarm.invalid/")
"""Values a pasted, quoted or mistyped ``url_env`` brings (issue 38's second defect), each found at load."""

_CALLS = (NOTIFY_5XX, NOTIFY_4XX, NOTIFY_HANG, NOTIFY_BAD_ANSWER)
_CODES = {NOTIFY_5XX: (500, 502, 503, 429), NOTIFY_4XX: (400, 403, 404, 410)}


@dataclass(frozen=True)
class TargetPlan:
    """One drawn target: ``kind`` webhook or slack, its URL in the file or (``env``) in a variable."""

    name: str
    kind: str
    env: bool


@dataclass(frozen=True)
class NotifyPlan:
    """A seed's notification part (module docstring); empty: no target, nothing sent."""

    targets: tuple[TargetPlan, ...] = ()
    timeout_s: float = 5.0
    deliver_budget_s: float = 15.0
    give_up_after_s: float = 3600.0
    stalled_after_s: float = 3600.0
    faults: tuple[f.Fault, ...] = ()

    def parts(self) -> int:
        return len(self.faults) + len(self.targets)

    def without(self, index: int) -> NotifyPlan:
        """Without its ``index``-th part (faults first, then targets; a target takes its faults along)."""
        if index < len(self.faults):
            return dataclasses.replace(self, faults=self.faults[:index] + self.faults[index + 1:])
        gone = self.targets[index - len(self.faults)].name
        return dataclasses.replace(self, targets=tuple(t for t in self.targets if t.name != gone),
                                   faults=tuple(x for x in self.faults if x.arg != gone))

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> NotifyPlan:
        """As ``to_json`` wrote it; a scenario kept from before receivers existed has none (no target)."""
        if not data:
            return cls()
        return cls(**{**data, "targets": tuple(TargetPlan(**t) for t in data["targets"]),
                      "faults": tuple(f.Fault(**x) for x in data["faults"])})


def draw_notify(seed: int, fault_hours: float) -> NotifyPlan:
    """The seed's targets, bounds and receiver faults, from its own stream (module docstring)."""
    rng = random.Random(f"{seed}:notify")
    count = rng.choice([0, 1, 1, 2, 2, 3])
    targets = tuple(TargetPlan(f"hook-{i}", rng.choice(("webhook", "webhook", "slack")), rng.random() < 0.8)
                    for i in range(count))
    plan = NotifyPlan(targets, timeout_s=rng.choice([2.0, 5.0, 10.0]),
                      deliver_budget_s=rng.choice([5.0, 15.0, 30.0]),
                      give_up_after_s=rng.choice([1800.0, 3600.0, 7200.0]),
                      stalled_after_s=rng.choice([1800.0, 3600.0]))
    faults = []
    for _ in range(rng.randint(1, 4) if targets else 0):
        kind, target = rng.choice(KINDS), rng.choice(targets)
        start = rng.uniform(0, fault_hours * 3600 * 2 / 3)
        if kind == NOTIFY_MALFORMED_URL:
            with_env = [t for t in targets if t.env]
            if not with_env:
                continue
            faults.append(f.Fault(kind, start, start + rng.uniform(60, 1800), arg=rng.choice(with_env).name,
                                  count=rng.randrange(len(BAD_URLS))))
            continue
        faults.append(f.Fault(kind, start, start + rng.uniform(1800, 6 * 3600), rate=rng.choice([0.3, 0.7, 1.0]),
                              arg=target.name, count=rng.randint(0, 1) if kind == NOTIFY_HANG else 0))
    return dataclasses.replace(plan, faults=tuple(faults))


def _url(seed: int, target: TargetPlan) -> str:
    return f"https://{target.name}.receivers.swarm.invalid/hooks/s3cr3t-{seed}"


def _env_name(target: TargetPlan) -> str:
    return f"SWARM_{target.name.upper().replace('-', '_')}_URL"


def config_text(seed: int, plan: NotifyPlan) -> str:
    """The seed's ``tpuops.toml``: its ``[notify]`` bounds and targets (nothing without a target)."""
    if not plan.targets:
        return ""
    lines = ["[notify]", f"timeout_s = {plan.timeout_s}", f"deliver_budget_s = {plan.deliver_budget_s}",
             f"give_up_after_s = {plan.give_up_after_s}", f"stalled_after_s = {plan.stalled_after_s}"]
    for target in plan.targets:
        where = f'url_env = "{_env_name(target)}"' if target.env else f'url = "{_url(seed, target)}"'
        lines += ["", f"[notify.targets.{target.name}]", f'kind = "{target.kind}"', where]
    return "\n".join(lines) + "\n"


def environ(seed: int, plan: NotifyPlan) -> dict[str, str]:
    """The variables the ``url_env`` targets read (their good values)."""
    return {_env_name(t): _url(seed, t) for t in plan.targets if t.env}


@dataclass(frozen=True)
class Arrival:
    """One POST a receiver saw: to which target, the keys in its header and body, at which pass (world time),
    how it was answered (``ok``, ``drip``, or the fault kind), and whether the receiver took the message."""

    target: str
    key: str
    body_key: str
    at: float
    answer: str
    taken: bool


@dataclass(frozen=True)
class Load:
    """One process start that read the config while a target's ``url_env`` was malformed: what came of it
    (``refused`` by a command that starts work, ``held back`` by a controller process, or what was wrong: a
    controller that refused, a start that accepted it, a traceback's worth of lines, the value in the message)."""

    at: float
    target: str
    verdict: str


@dataclass
class Receivers(Wire):
    """The simulated receivers and the virtual wire to them (module docstring)."""

    seed: int
    plan: NotifyPlan
    config: Path
    environ: dict[str, str]
    injected: f.Injected
    clock: Callable[[], float]
    """The world's clock (a fault's window is in offsets from the simulation's start)."""
    start_at: float
    arrivals: list[Arrival] = field(default_factory=list)
    loads: list[Load] = field(default_factory=list)
    spans: list[float] = field(default_factory=list)
    """The virtual seconds each pass's deliveries took, from the first send to the last wait (since last read)."""
    escaped: list[str] = field(default_factory=list)
    """What a receiver answered that reached a pass (since last read)."""
    memories: dict[str, tuple[int, Any]] = field(default_factory=dict)
    """The runs' memories the notifications checkers last read, by run: (generation, memory)."""
    t: float = 0.0
    _delay: float = 0.0
    _passes: list[tuple[float | None, float]] = field(default_factory=list)
    """The passes under way, innermost last: (its first send's time, the clock at its start). A rival's pass runs
    inside the watch's (``FaultyStore.meanwhile``) yet beside it in truth: its time is its own, not the watch's."""
    _tries: Counter[tuple[str, str]] = field(default_factory=Counter)
    _raised: list[BaseException] = field(default_factory=list)
    _opened: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._names = {_url(self.seed, t): t.name for t in self.plan.targets}

    # -- the wire: a pass's virtual time, sends run inline --------------------------------------------------

    def now(self) -> float:
        return self.t

    def start(self, work: Callable[[], None], name: str) -> Waiter:
        started = self.t
        if self._passes and self._passes[-1][0] is None:
            self._passes[-1] = (started, self._passes[-1][1])
        self._delay = 0.0
        work()  # the real send, through post() below
        answered = started + self._delay

        def ended(until: float) -> bool:
            self.t = max(self.t, min(answered, until))
            return answered <= until

        return ended

    def post(self, request: urllib.request.Request, timeout_s: float) -> None:
        name = self._names.get(request.full_url)
        if name is None:
            raise urllib.error.URLError(OSError("simulated: no receiver at this address"))
        key = request.get_header("Idempotency-key") or ""
        self._tries[(name, key)] += 1
        fault = self._fault(name, key)
        answer = "ok" if fault is None else fault.kind
        if fault is not None and fault.kind == NOTIFY_HANG and fault.count:
            answer = "drip"
        self.arrivals.append(Arrival(name, key, _body_key(request.data), self.clock(), answer,
                                     taken=answer in ("ok", "drip")))
        if fault is None:
            return
        self.injected.count(fault.kind)
        if fault.kind == NOTIFY_HANG:
            self._delay = math.inf if fault.count else timeout_s
            if not fault.count:
                raise TimeoutError("timed out")  # what the socket raises once timeout_s has passed
            return
        if fault.kind == NOTIFY_BAD_ANSWER:
            err = http.client.BadStatusLine("simulated: SSH-2.0-OpenSSH_9.6")
            self._raised.append(err)
            raise err
        codes = _CODES[fault.kind]
        code = codes[int(f.chance(self.seed, "notify-code", name, key, self._tries[(name, key)]) * len(codes))]
        raise urllib.error.HTTPError(request.full_url, code, "simulated", Message(), None)

    def _fault(self, name: str, key: str) -> f.Fault | None:
        offset = self.clock() - self.start_at
        nth = self._tries[(name, key)]
        for fault in self.plan.faults:
            if (fault.kind in _CALLS and fault.arg == name and fault.covers(offset)
                    and f.chance(self.seed, "notify", fault.kind, name, key, nth) < fault.rate):
                return fault
        return None

    # -- around a pass (the runner's hooks) ------------------------------------------------------------------

    def begin_pass(self) -> None:
        """A pass begins: its deliveries' time starts; a malformed value's one-shot command runs at its start."""
        self._passes.append((None, self.t))
        offset = self.clock() - self.start_at
        for index, fault in enumerate(self.plan.faults):
            if fault.kind == NOTIFY_MALFORMED_URL and fault.start <= offset and index not in self._opened:
                self._opened.add(index)
                self._load(fault)  # the user's `tpuops train` (or `notify test`) while it is there

    def end_pass(self) -> None:
        first, began = self._passes.pop()
        if first is not None:
            self.spans.append(self.t - first)
        if self._passes:  # a pass inside another (a rival's): the outer one's clock goes on from where it was
            self.t = began

    def reached_pass(self, err: BaseException) -> None:
        """``err`` escaped a pass: if a receiver raised it, a target's answer stopped that pass."""
        if any(err is raised for raised in self._raised):
            self.escaped.append(f"{type(err).__name__}: {err}")

    def starts(self) -> tuple[bool, NotifySettings | None]:
        """A controller process starts and reads the config, its environment as it is now (a target's url_env
        malformed in a window): whether it started, and the ``[notify]`` it read when that differs from the
        world's (a target held back). It must start, that target held back, and say why (``Load``)."""
        bad = self._malformed_now()
        if not bad:
            return True, None
        environ = dict(self.environ)
        for fault in bad:
            environ[self._variable(fault)] = self._bad_value(fault)
        try:
            settings = load_settings(config_path=self.config, environ=environ)
        except UsageError as err:
            self._note(bad, f"refused its config (exit 2) instead of holding the target back: {str(err)!r}")
            return False, None
        except Exception as err:  # anything but a usage error is a traceback at the user
            self._note(bad, f"raised {type(err).__name__}, not a start with the target held back")
            return False, None
        held = settings.notify.held_back()
        for fault in bad:
            self._note([fault], self._wrong(fault, held.get(fault.arg), "held back") if fault.arg in held else
                       "started without holding the target back (its URL would be sent to)")
        return True, settings.notify

    def fixed(self, notify: NotifySettings) -> bool:
        """A process holds a target back that is no longer malformed (its window ended): the user restarts it."""
        now = {fault.arg for fault in self._malformed_now()}
        return any(name not in now for name in notify.held_back())

    def _malformed_now(self) -> list[f.Fault]:
        offset = self.clock() - self.start_at
        return [x for x in self.plan.faults if x.kind == NOTIFY_MALFORMED_URL and x.covers(offset)]

    def _variable(self, fault: f.Fault) -> str:
        return _env_name(next(t for t in self.plan.targets if t.name == fault.arg))

    def _bad_value(self, fault: f.Fault) -> str:
        return BAD_URLS[fault.count] + f"/s3cr3t-{self.seed}"

    def _note(self, faults: list[f.Fault], verdict: str) -> None:
        for fault in faults:
            self.injected.count(NOTIFY_MALFORMED_URL)
            self.loads.append(Load(self.clock(), fault.arg, verdict))

    def _wrong(self, fault: f.Fault, line: str | None, good: str) -> str:
        """``good``, or what is wrong with the ``line`` said about the target: it spans lines, names the value,
        or names neither the target nor its variable."""
        line = line or ""
        wrong = ("spans lines" if "\n" in line.strip() else "names the value" if "s3cr3t" in line else
                 "does not name the target and variable" if fault.arg not in line or self._variable(fault) not in line
                 else "")
        return f"{good}, but the line {wrong}: {line!r}" if wrong else good

    def _load(self, fault: f.Fault) -> None:
        """A command that starts work (``train``, ``notify test``) reads the config with the target's variable
        malformed: it must refuse in one line (``Load``)."""
        environ = {**self.environ, self._variable(fault): self._bad_value(fault)}
        try:
            load_settings(config_path=self.config, environ=environ, starts=True)
        except UsageError as err:
            self._note([fault], self._wrong(fault, str(err), "refused"))
            return
        except Exception as err:  # anything but a usage error is a traceback at the user
            self._note([fault], f"raised {type(err).__name__}, not a one-line refusal")
            return
        self._note([fault], "a command that starts work accepted a malformed URL")


def _body_key(data: Any) -> str:
    """The idempotency key a body carries: the generic webhook's field, or Slack's context block ("key K")."""
    try:
        body = json.loads(data)
    except (TypeError, ValueError):
        return ""
    if "idempotency_key" in body:
        return str(body["idempotency_key"])
    for block in body.get("blocks", []):
        for element in block.get("elements", []):
            text = element.get("text", "")
            if text.startswith("key "):
                return str(text[4:])
    return ""
