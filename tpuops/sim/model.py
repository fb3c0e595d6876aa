"""The agent of a simulated run by its measured segments (``tpuops/contract/timing.py`` measures them).

Durations are seconds of virtual time. A caller with an experiment's history passes its numbers in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from tpuops.contract.interval import FIRST_SAVE_S
from tpuops.core.errors import UsageError

REPLACEMENT_WINDOW_S = 2.0
"""How far apart (in their offset from the first READY) measured replacements count as started at about the
same moment: one controller pass at the bench's pace."""


@dataclass(frozen=True)
class Segments:
    """Where an attempt's time goes besides stepping, with stated defaults."""

    setup_s: float = 120.0
    """Bundle, TensorFlow import, TPU init and the first (compiling) call."""
    checkpoint_every_s: float = 600.0
    """Stepping time between two periodic saves."""
    save_s: float = FIRST_SAVE_S
    """One checkpoint save, periodic or on the notice (the agent's assumption until it measures one)."""
    restore_s: float = 20.0
    final_s: float | None = None
    """The job's end after its last step (final save, evaluation, SavedModel): a notice then no longer
    stops it. None: one ``save_s``."""
    listen_s: float | None = None
    """READY to the agent's first look at a notice (TensorFlow imported, the model built and restored):
    before it a notice waits, and so does one during the first call (it traces and compiles) until the
    call ends. None: a notice is heard at once. It matters where a node ends only when its agent exits
    (``CloudModel.ends_with_agent``, the local emulator)."""
    exit_s: float = 1.0
    """ASSUMED: from a heard notice (and its save) to the agent's exit."""

    @property
    def final(self) -> float:
        return self.save_s if self.final_s is None else self.final_s

    def __post_init__(self) -> None:
        if (min(self.setup_s, self.save_s, self.restore_s, self.final, self.exit_s, self.listen_s or 0.0) < 0
                or self.checkpoint_every_s <= 0):
            raise UsageError("setup, save, restore, final, listen and exit times must be >= 0 and the checkpoint "
                             "interval > 0")


@dataclass(frozen=True)
class Pace:
    """How one attempt goes: its setup (READY to stepping), steps per second of stepping, final stretch and
    first look at a notice (``Segments.final_s`` and ``listen_s``; None: the first attempt's)."""

    setup_s: float
    steps_per_s: float
    final_s: float | None = None
    listen_s: float | None = None

    def __post_init__(self) -> None:
        if min(self.setup_s, self.final_s or 0.0, self.listen_s or 0.0) < 0 or self.steps_per_s <= 0:
            raise UsageError(f"an attempt needs setup, final and listen times >= 0 and steps/s > 0, got "
                             f"{self.setup_s} s and {self.steps_per_s} steps/s")


@dataclass(frozen=True)
class AgentModel:
    """The agent by its measured segments: one attempt is setup, a restore when a checkpoint exists, then
    steps at ``steps_per_s`` with a periodic save every ``checkpoint_every_s`` of stepping, and a final save.
    On the notice it saves once more if the save fits in the notice."""

    total_steps: int
    steps_per_s: float
    """Steps per second of stepping (the agent's productive time), not of wall time."""
    segments: Segments = field(default_factory=Segments)
    eval_every_steps: int = 0
    """0: no evaluations (a run); a sweep's trials evaluate on the synthetic surface."""
    replacements: tuple[tuple[float, Pace], ...] = ()
    """Replacement attempts' (the second and later) paces where they differ from the first's (``segments``,
    ``steps_per_s``), each with its READY's offset from the first attempt's READY: a replacement takes one
    of those whose offset is within ``REPLACEMENT_WINDOW_S`` of the nearest to its own (empty: the first's).
    They differ when runs share a machine: the first attempts of a wave share it, and a replacement shares
    it with what is still running when it starts (a calibration measures them, ``tpuops.sim.calibrate``)."""

    slowdown: Mapping[str, float] = field(default_factory=dict)
    """An elastic run's sizes by accelerator: how many times longer a step takes there (the accumulation a smaller
    slice needs to keep the global batch); others step at ``steps_per_s``."""

    def sized(self, pace: Pace, accelerator: str) -> Pace:
        """``pace`` on a node of ``accelerator``: its steps ``slowdown`` times slower there."""
        factor = self.slowdown.get(accelerator, 1.0)
        return pace if factor == 1.0 else replace(pace, steps_per_s=pace.steps_per_s / factor)

    def pace(self, attempt: int, offset_s: float = 0.0, draw: float = 0.0) -> Pace:
        """Attempt ``attempt``'s (1 = the first) setup, speed, final stretch and first look at a notice, for
        a replacement READY ``offset_s`` after the first attempt's READY; ``draw`` in [0, 1) picks one of the
        replacements measured about then."""
        first = Pace(self.segments.setup_s, self.steps_per_s, self.segments.final, self.segments.listen_s)
        if attempt == 1 or not self.replacements:
            return first
        nearest = min(abs(offset - offset_s) for offset, _ in self.replacements)
        near = [pace for offset, pace in self.replacements if abs(offset - offset_s) <= nearest + REPLACEMENT_WINDOW_S]
        other = near[min(len(near) - 1, int(draw * len(near)))]
        return Pace(other.setup_s, other.steps_per_s, first.final_s if other.final_s is None else other.final_s,
                    first.listen_s if other.listen_s is None else other.listen_s)

    @property
    def length_s(self) -> float:
        """The job from READY to its end when nothing interrupts it: setup, stepping and its saves."""
        stepping = self.total_steps / self.steps_per_s
        periodic = max(0, math.ceil(stepping / self.segments.checkpoint_every_s) - 1)
        return self.segments.setup_s + stepping + periodic * self.segments.save_s + self.segments.final

    def __post_init__(self) -> None:
        if self.total_steps <= 0 or self.steps_per_s <= 0:
            raise UsageError(f"a simulated job needs steps > 0 and steps/s > 0, got {self.total_steps} steps at "
                             f"{self.steps_per_s} steps/s")
