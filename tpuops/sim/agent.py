"""The agent of a simulated run: its measured segments played on virtual time, its status written to the store.

It stands in for ``tpuops/agent`` on a node of the simulated cloud, and the controller reads what it
writes exactly as it reads the real agent: ``status.json`` through ``tpuops.runs`` (attempt, phase,
step, last checkpoint, heartbeat, evaluations, exit class, and when it ended: the simulated cloud deletes
a node whose job ended at that moment, as the startup script does on a VM, and billing stops there).
Its timeline per attempt (``AgentModel``): setup, a restore when a checkpoint exists, then stepping with a
periodic save every ``checkpoint_every_s`` of stepping, and the final stretch (``Segments.final``: a
notice in it no longer stops the job); a replacement's setup and speed may differ from the first
attempt's (``AgentModel.pace``). The node's end (a preemption after its notice, or a delete) ends the
attempt: the work since the last checkpoint is lost unless the save on the notice fits in it.

Evaluations, for sweeps, come from a synthetic response surface of the trial's hparams (``surface``):
smooth in the logarithm of each numeric hparam around an optimum drawn from the seed, so that the
real Optuna sampler has something to learn and the real pruner something to prune.

An attempt may have a ``Fate`` (the fault swarm's agent faults, ``tpuops.sim.swarm``): it crashes, meets a
deterministic user error, sees its loss turn NaN, hangs (steps stop, heartbeats go on), or its save on a notice
fails, ``after_s`` of stepping into the attempt. An attempt without one runs as the model says. The cloud may hang
an attempt later (``hung``: a worker of its slice died, or never booted), and a notice may reach the agent late
(``late``: the seconds after the notice it hears it, by when it came; past the node's end it never saves).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tpuops import runs
from tpuops.core.clock import UTC
from tpuops.core.guards import Guard
from tpuops.core.kinds import ValueEnum
from tpuops.runs import AgentStatus, EvalPoint, ExitClass, Phase
from tpuops.sim.model import AgentModel, Pace
from tpuops.store import Store

Metrics = Callable[[int], dict[str, float]]
"""The evaluation metrics at a step."""

RESTORE_NEWEST = Guard("agent.restore_newest", "an attempt resumes from the newest checkpoint any attempt before it "
                       "saved (the stand-in's, for the real agent's Checkpoints.restore_newest)")


def surface(hparams: Mapping[str, Any], total_steps: int, seed: int) -> Metrics:
    """Synthetic accuracy and loss for a trial: quality in (0.5, 0.95] peaks where each numeric hparam's
    logarithm meets a seeded optimum; learning approaches it as 1 - exp(-3 step / total)."""
    rng = random.Random(seed)
    distance = 0.0
    for name in sorted(hparams):
        value = hparams[name]
        optimum = rng.uniform(-4.0, 0.0)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            distance += (math.log10(value) - optimum) ** 2 / 4.0
    quality = 0.5 + 0.45 * math.exp(-distance)

    def metrics(step: int) -> dict[str, float]:
        learned = quality * (1.0 - math.exp(-3.0 * step / total_steps))
        return {"accuracy": round(learned, 6), "loss": round(1.0 - learned, 6)}

    return metrics


class FateKind(ValueEnum):
    """What goes wrong in one attempt of a simulated agent."""

    CRASH = "crash"
    USER_ERROR = "user-error"
    NAN = "nan"
    HANG = "hang"
    SAVE_FAILS = "save-fails"
    """Its save on a notice fails: the attempt keeps only its last periodic checkpoint."""


_EXIT_OF_FATE = {FateKind.CRASH: ExitClass.CRASHED, FateKind.USER_ERROR: ExitClass.USER_ERROR,
                 FateKind.NAN: ExitClass.DIVERGED}


@dataclass(frozen=True)
class Fate:
    """One attempt's fault: ``kind``, ``after_s`` of stepping into the attempt (0: as stepping starts)."""

    kind: FateKind
    after_s: float = 0.0

    @property
    def exit_class(self) -> ExitClass | None:
        """The exit the agent reports when the fate ends the attempt by itself (None: it does not)."""
        return _EXIT_OF_FATE.get(self.kind)


@dataclass(frozen=True)
class _Attempt:
    number: int
    ready_at: float
    base_step: int
    stepping_at: float
    """When steps start: after setup, and a restore when there is a checkpoint."""
    pace: Pace
    """This attempt's setup, speed and final stretch (``AgentModel.pace``: a replacement's may differ)."""
    fate: Fate | None = None


class SimulatedAgent:
    """One run's agent across its attempts (one per READY node of the run)."""

    def __init__(self, store: Store, run_id: str, model: AgentModel, metrics: Metrics | None = None,
                 seed: int = 0, fates: dict[int, Fate] | None = None) -> None:
        self.store = store
        self.fates = fates or {}
        """By attempt number (1 = the first): what goes wrong in it (the fault swarm's)."""
        self.run_id = run_id
        self.seed = seed
        """Seeds the attempt's draw of a measured replacement pace (``AgentModel.pace``), per run and attempt."""
        self.model = model
        self.metrics = metrics
        self.checkpoint = 0
        self.attempts = 0
        self.recomputed_steps = 0
        self.finished_at: float | None = None
        self.exits: list[tuple[float, ExitClass]] = []
        """Every attempt's exit as the agent reported it: (when, how)."""
        self.starts: list[tuple[int, float, int, int]] = []
        """Every attempt's start: (attempt, when, the step it resumed from, the newest step saved before it)."""
        self.reported: tuple[int, ExitClass | None] = (0, None)
        """The step and the exit class its status last reported."""
        self._attempt: _Attempt | None = None
        self._high = 0  # the highest step any attempt reached: what lies above the checkpoint is redone
        self._first_ready: float | None = None  # the first attempt's READY: a replacement's pace depends on its offset
        self._evals: list[EvalPoint] = []  # every evaluation up to the highest step written: a pure function of step
        self.late: Callable[[float], float] = lambda notice_at: 0.0
        """How many seconds after a notice at ``notice_at`` the agent hears it (the fault swarm's late notices)."""

    # -- the timeline (pure) -------------------------------------------------------------------

    def _plan(self, ready_at: float, accelerator: str = "") -> _Attempt:
        base = self.checkpoint if RESTORE_NEWEST.on else 0
        restore = self.model.segments.restore_s if base > 0 else 0.0
        first_ready = ready_at if self._first_ready is None else self._first_ready
        pace = self.model.sized(self.model.pace(self.attempts + 1, ready_at - first_ready, random.Random(
            f"{self.seed}/{self.run_id}/{self.attempts + 1}").random()), accelerator)
        return _Attempt(self.attempts + 1, ready_at, base, ready_at + pace.setup_s + restore, pace,
                        self.fates.get(self.attempts + 1))

    def _progress(self, attempt: _Attempt, at: float) -> tuple[int, int]:
        """(step reached, step of the last periodic checkpoint) at ``at``."""
        m, segments = self.model, self.model.segments
        if at <= attempt.stepping_at:
            return attempt.base_step, attempt.base_step
        elapsed = at - attempt.stepping_at
        if attempt.fate is not None and attempt.fate.kind is not FateKind.SAVE_FAILS:
            elapsed = min(elapsed, attempt.fate.after_s)  # its steps stop where it fails
        cycles, rest = divmod(elapsed, segments.checkpoint_every_s + segments.save_s)
        stepping = cycles * segments.checkpoint_every_s + min(rest, segments.checkpoint_every_s)
        speed = attempt.pace.steps_per_s
        step = min(m.total_steps, attempt.base_step + int(speed * stepping))
        saved = min(m.total_steps, attempt.base_step + int(speed * segments.checkpoint_every_s * cycles))
        return step, saved

    def finish_time(self, ready_at: float, accelerator: str = "") -> float | None:
        """When the job would end on a node (of ``accelerator``) READY at ``ready_at`` that nothing interrupts (None:
        it hangs)."""
        m, segments = self.model, self.model.segments
        attempt = self._plan(ready_at, accelerator)
        remaining_s = (m.total_steps - attempt.base_step) / attempt.pace.steps_per_s
        periodic = max(0, math.ceil(remaining_s / segments.checkpoint_every_s) - 1)
        ends = attempt.stepping_at + remaining_s + periodic * segments.save_s + self._final(attempt)
        fate = attempt.fate
        if fate is None or attempt.stepping_at + fate.after_s >= ends:
            return ends  # no fate, or the job ends before it strikes
        if fate.kind is FateKind.HANG:
            return None
        return attempt.stepping_at + fate.after_s if fate.exit_class is not None else ends

    @property
    def final_s(self) -> float:
        """The running attempt's final stretch (a notice in it no longer stops the job); none running: the first's."""
        return self.model.segments.final if self._attempt is None else self._final(self._attempt)

    def _final(self, attempt: _Attempt) -> float:
        return self.model.segments.final if attempt.pace.final_s is None else attempt.pace.final_s

    def stops_at(self, notice_at: float) -> tuple[float, float] | None:
        """After a notice at ``notice_at``: when the agent acts on it and when it has stopped (None: no attempt
        runs). It looks at the notice ``listen_s`` after READY, then after each call; the first call (it traces
        and compiles) ends when stepping starts. Then it saves and exits."""
        attempt = self._attempt
        if attempt is None:
            return None
        heard = notice_at + self.late(notice_at)
        if attempt.pace.listen_s is not None and heard < attempt.stepping_at:
            listen_at = attempt.ready_at + attempt.pace.listen_s
            heard = listen_at if heard <= listen_at else attempt.stepping_at
        return heard, heard + self.model.segments.save_s + self.model.segments.exit_s

    # -- what the node's life does to it -----------------------------------------------------------

    def started(self, at: float, accelerator: str = "") -> None:
        """The node (of ``accelerator``) is READY: a new attempt starts (its startup script runs the agent)."""
        self._attempt = self._plan(at, accelerator)
        self.attempts = self._attempt.number
        self.starts.append((self.attempts, at, self._attempt.base_step, self.checkpoint))
        if self._first_ready is None:
            self._first_ready = at
        self._write(at, Phase.STARTING, self._attempt.base_step)

    def publish(self, at: float) -> None:
        """A heartbeat at ``at``: the status as the agent would have last written it."""
        if self._attempt is None:
            return
        step, saved = self._progress(self._attempt, at)
        self._write(at, Phase.TRAINING if at > self._attempt.stepping_at else Phase.LOADING, step,
                    checkpoint=max(self.checkpoint, saved))

    def interrupted(self, notice_at: float, end_at: float) -> None:
        """The node is going (a preemption's notice, or a delete): save on the notice if it fits, then stop."""
        attempt = self._attempt
        if attempt is None:
            return
        notice_at = min(end_at, notice_at + self.late(notice_at))  # when it hears it: past the end, never
        step, saved = self._progress(attempt, max(attempt.ready_at, notice_at))
        fits = self.model.segments.save_s <= end_at - notice_at and notice_at >= attempt.stepping_at
        fate = attempt.fate
        if fate is not None and (fate.kind is FateKind.SAVE_FAILS or notice_at >= attempt.stepping_at + fate.after_s):
            fits = False  # a failed save, or an agent past saving (hung)
        self.checkpoint = max(self.checkpoint, step if fits else saved)
        self.recomputed_steps += max(0, min(self._high, step) - attempt.base_step)
        self._high = max(self._high, step)
        self._attempt = None
        self._write(end_at, Phase.DONE, step, exit_class=ExitClass.PREEMPTED, attempt=attempt.number)

    def hung(self, at: float) -> None:
        """The running attempt stops stepping at ``at`` and never ends by itself (heartbeats go on): a worker of its
        slice died or never booted, so its mesh cannot compute."""
        attempt = self._attempt
        if attempt is None:
            return
        after_s = max(0.0, at - attempt.stepping_at)
        if attempt.fate is not None and attempt.fate.kind is not FateKind.SAVE_FAILS:
            after_s = min(after_s, attempt.fate.after_s)
        self._attempt = dataclasses.replace(attempt, fate=Fate(FateKind.HANG, after_s))

    def finished(self, at: float) -> None:
        """The last step and the final save are done: the job succeeded; or the attempt's fate ended it."""
        attempt = self._attempt
        fate = attempt.fate if attempt else None
        step, saved = self._progress(attempt, at) if attempt is not None else (0, 0)
        if attempt is not None and fate is not None and fate.exit_class is not None and step < self.model.total_steps:
            self.checkpoint = max(self.checkpoint, saved)
            self._high = max(self._high, step)
            self._attempt = None
            self._write(at, Phase.DONE, step, exit_class=fate.exit_class, attempt=attempt.number)
            return
        self.checkpoint = self._high = self.model.total_steps
        self.finished_at = at
        self._attempt = None
        self._write(at, Phase.DONE, self.model.total_steps, exit_class=ExitClass.SUCCEEDED,
                    attempt=attempt.number if attempt else self.attempts)

    def _evals_to(self, step: int, metrics: Metrics) -> list[EvalPoint]:
        """The evaluations at every ``eval_every_steps`` up to ``step``: each made once, not at every status write
        (a long trial has thousands, and its status is written every pass)."""
        every = self.model.eval_every_steps
        for at in range((len(self._evals) + 1) * every, step + 1, every):
            self._evals.append(EvalPoint(step=at, metrics=metrics(at)))
        return self._evals[: step // every]

    @property
    def running(self) -> bool:
        return self._attempt is not None

    def _write(self, at: float, phase: Phase, step: int, *, checkpoint: int | None = None,
               exit_class: ExitClass | None = None, attempt: int | None = None) -> None:
        m = self.model
        evals: list[EvalPoint] = []
        final: dict[str, Any] = {}
        if self.metrics is not None and m.eval_every_steps:
            evals = self._evals_to(step, self.metrics)
            final = {"eval": self.metrics(step)}
        stamp = datetime.fromtimestamp(at, UTC).isoformat()
        number = self.attempts if attempt is None else attempt
        began = next((when for n, when, _, _ in reversed(self.starts) if n == number), None)  # as the agent's started
        self.reported = (step, exit_class)
        if exit_class is not None:
            self.exits.append((at, exit_class))
        runs.write_status(self.store, self.run_id, AgentStatus(
            run_id=self.run_id, attempt=number, phase=phase, step=step,
            started=datetime.fromtimestamp(began, UTC).isoformat() if began is not None else None,
            total_steps=m.total_steps, last_checkpoint_step=self.checkpoint if checkpoint is None else checkpoint,
            recomputed_steps=self.recomputed_steps, metrics=final, evals=evals, heartbeat=stamp,
            exit_class=exit_class, ended=stamp if exit_class else None,
            exit_code=exit_class.code if exit_class else None))
