"""Profiles of running jobs: ``tpuops profile`` asks the agent through the store, ``tpuops tensorboard`` shows them.

The control plane opens no connection to a VM (docs/design.md, "The store is the message bus"): a profile is a
request written to ``runs/<run>/profile.json`` that the agent reads and answers with a capture under
``runs/<run>/profiles/<attempt>-step<N>/`` and its ``record.json`` (format, states and what happens through a
preemption: ``tpuops/agent/profiles.py``; the names both read: ``tpuops.contract.profiles``). TensorBoard runs
in the TF 2.9 runtime (``tpuops.tfenv``), which holds TensorBoard 2.9 and the Profile tab's plugin; it reads a
local copy of the run's complete captures and event files, so no store credentials reach it.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tpuops.config import Settings
from tpuops.contract.profiles import ANSWERED, COMPLETE, DISCARDED, EXPERIMENT_REQUEST, PROFILES, RECORD, REQUEST
from tpuops.core.errors import Timeout, TpuopsError, UsageError
from tpuops.runs import layout
from tpuops.runs.models import RunKind
from tpuops.store.base import Store

Say = Callable[[str], None]

PROFILE_PLUGIN = "tensorboard-plugin-profile==2.8.0"
"""The Profile tab's release of TF 2.8/2.9's time, which converts TF 2.9's xplane traces with TF 2.9's own
converter (newer releases ship converters built for newer TF); installed in the TF 2.9 runtime
(``templates/requirements-tf29.txt``)."""


@dataclass(frozen=True)
class Capture:
    """One capture of a run, as its record says (``tpuops/agent/profiles.py``)."""

    folder: str
    """Its key under the store root: ``runs/<run>/profiles/<attempt>-step<N>``."""
    request: str
    state: str
    attempt: int
    first_step: int
    last_step: int
    seconds: float
    hosts: list[str] = field(default_factory=list)
    reason: str | None = None

    @property
    def name(self) -> str:
        return self.folder.rsplit("/", 1)[-1]


def _profiles_prefix(run_id: str) -> str:
    return layout.run_key(run_id, PROFILES + "/")


def captures(root: Store, run_id: str) -> list[Capture]:
    """The run's recorded captures, oldest attempt and step first; a folder without a readable record is no
    capture (a process killed while writing it)."""
    found = []
    for info in root.list(_profiles_prefix(run_id)):
        if not info.key.endswith("/" + RECORD):
            continue
        try:
            obj = json.loads(root.read_bytes(info.key))
            found.append(Capture(folder=info.key[: -len(RECORD) - 1], request=str(obj["request"]),
                                 state=str(obj["state"]), attempt=int(obj["attempt"]),
                                 first_step=int(obj["first_step"]), last_step=int(obj["last_step"]),
                                 seconds=float(obj["seconds"]), hosts=[str(h) for h in obj.get("hosts") or []],
                                 reason=obj.get("reason")))
        except (ValueError, KeyError, TypeError):
            continue
    return sorted(found, key=lambda c: (c.attempt, c.first_step))


def _running_train(root: Store, run_id: str) -> None:
    """Refuse (``UsageError``) a run that cannot be profiled now: unknown, not a training run, script mode, ended."""
    from tpuops import runs

    run = runs.whole_run(root, run_id)
    if run.record.kind is not RunKind.TRAIN:
        raise UsageError(f"run {run_id} is an {run.record.kind.value} run: only a training run can be profiled")
    spec = json.loads(root.read_bytes(layout.run_key(run_id, layout.SPEC)))
    if spec.get("script") is not None:
        raise UsageError(f"run {run_id} runs its own script: profile it from the script "
                         "(tf.profiler.experimental.start), tpuops profiles the built-in training loop")
    if run.finished:
        outcome = run.outcome.value if run.outcome is not None else "finished"
        raise UsageError(f"run {run_id} is not running ({outcome}): a profile is captured from a running job; "
                         f"'tpuops runs' lists the runs going")


def request_profile(settings: Settings, run_id: str, *, steps: int | None = None, seconds: float | None = None,
                    wait: bool = True, timeout_s: float = 900.0, progress: Say = lambda _t: None) -> Capture | str:
    """``tpuops profile RUN``: ask the run's agent for a profile of ``steps`` steps or ``seconds`` seconds from its
    next call; with ``wait``, until its record says complete or failed (the capture), else the request's id.

    Raises:
        UsageError: a bad window, or a run that is not a running training run (nothing written).
        TpuopsError: the run ended before the profile was captured, or the capture failed.
        Timeout: no answer within ``timeout_s``.
    """
    from tpuops import runs
    from tpuops.session import store

    if (steps is None) == (seconds is None):
        raise UsageError("give --steps N or --seconds S (the window to capture), not both")
    if (steps is not None and steps <= 0) or (seconds is not None and seconds <= 0):
        raise UsageError("the window must be positive: --steps N >= 1 or --seconds S > 0")
    root = store(settings)
    _running_train(root, run_id)
    request = f"p{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"
    document = {"id": request, "steps": steps, "seconds": seconds, "requested_at": time.time()}
    root.write_bytes(layout.run_key(run_id, REQUEST), json.dumps(document).encode())
    progress(f"asked run {run_id} for a profile ({request}); the agent reads it within its heartbeat")
    if not wait:
        return request
    deadline = time.monotonic() + timeout_s
    said: set[str] = set()
    while True:
        for capture in captures(root, run_id):
            if capture.request != request:
                continue
            if capture.state in ANSWERED:
                if capture.state != COMPLETE:
                    raise TpuopsError(f"run {run_id}: the profile failed: {capture.reason}")
                return capture
            if capture.state == DISCARDED and capture.folder not in said:
                said.add(capture.folder)
                progress(f"the window from step {capture.first_step} was discarded ({capture.reason}); "
                         "the next attempt captures it again")
        if runs.open_run(root, run_id).finished:
            raise TpuopsError(f"run {run_id} ended before its profile {request} was captured")
        if time.monotonic() > deadline:
            raise Timeout(f"run {run_id}: no profile {request} after {timeout_s:g} s; it is still asked for "
                          f"('tpuops profile {run_id} --list' shows when it is there)")
        time.sleep(max(settings.poll_interval_s, 0.5))


def list_profiles(settings: Settings, run_id: str) -> list[Capture]:
    """``tpuops profile RUN --list``: the run's captures (``UsageError`` for an unknown run)."""
    from tpuops import runs
    from tpuops.session import store

    root = store(settings)
    runs.whole_run(root, run_id)
    return captures(root, run_id)


@dataclass(frozen=True)
class Board:
    """What ``tpuops tensorboard`` serves: a local copy of the run's complete captures and event files."""

    logdir: Path
    profiles: list[Capture]
    argv: list[str]
    """The command that serves it (the TF 2.9 runtime's TensorBoard)."""


def tensorboard(settings: Settings, run_id: str, *, port: int = 6006) -> Board:
    """``tpuops tensorboard RUN``: copy the run's complete captures (``profiles/``) and event files (``tb/``) to
    ``~/.tpuops/tensorboard/<run>`` and say how to serve them; the caller runs ``argv``.

    Raises:
        UsageError: an unknown run, or a TF runtime without the Profile tab's plugin (how to install it).
    """
    from tpuops import runs
    from tpuops.session import store
    from tpuops.tfenv.locate import require

    root = store(settings)
    runs.whole_run(root, run_id)
    python = str(require(settings))
    missing = plugin_missing(python)
    if missing is not None:
        raise UsageError(missing)
    logdir = settings.home.expanduser() / "tensorboard" / run_id
    complete = [c for c in captures(root, run_id) if c.state == COMPLETE]
    wanted = [layout.run_key(run_id, "tb/"), *(c.folder + "/" for c in complete)]
    for prefix in wanted:
        for info in root.list(prefix):
            relative = info.key[len(layout.run_key(run_id, "")):]
            target = logdir / relative
            if not target.exists() or target.stat().st_size != info.size:
                target.parent.mkdir(parents=True, exist_ok=True)
                root.download_file(info.key, target)
    argv = [python, "-m", "tensorboard.main", "--logdir", str(logdir), "--port", str(port)]
    return Board(logdir=logdir, profiles=complete, argv=argv)


def plugin_missing(python: str) -> str | None:
    """Why the runtime at ``python`` cannot show the Profile tab, or None when it can."""
    import subprocess

    probe = subprocess.run([python, "-c", "import tensorboard_plugin_profile, tensorboard"], capture_output=True,
                           text=True, timeout=120, check=False)
    if probe.returncode == 0:
        return None
    return (f"the TF 2.9 runtime ({python}) has no {PROFILE_PLUGIN}: 'tpuops runtime install --force' installs "
            "it with the runtime's pins")


__all__ = ["EXPERIMENT_REQUEST", "Board", "Capture", "captures", "list_profiles", "plugin_missing",
           "request_profile", "tensorboard"]
