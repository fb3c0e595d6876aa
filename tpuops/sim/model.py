"""The agent of a simulated run by its measured segments (``tpuops/agent/timing.py`` measures them).

Durations are seconds of virtual time. A caller with an experiment's history passes its numbers in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tpuops.agent.interval import FIRST_SAVE_S
from tpuops.errors import UsageError


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

    @property
    def final(self) -> float:
        return self.save_s if self.final_s is None else self.final_s

    def __post_init__(self) -> None:
        if min(self.setup_s, self.save_s, self.restore_s, self.final) < 0 or self.checkpoint_every_s <= 0:
            raise UsageError("setup, save, restore and final times must be >= 0 and the checkpoint interval > 0")


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
