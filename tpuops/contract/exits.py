"""How an agent process goes and ends: its phases, and the one mapping of exit class to exit code.

The control plane learns the outcome of a run from ``status.json`` (field ``exit_class``) and,
when it watches the process itself, from the exit code. Both carry the same information:

=============  =====  ===========================================================================
exit class     code   meaning and what the controller should do
=============  =====  ===========================================================================
succeeded      0      the run finished; the model (train) or the manifest (infer) is complete
crashed        1      the agent failed for a reason outside the user's code and data (store
                      I/O, TPU runtime, an agent bug): restart from the last checkpoint, bounded
(usage)        2      the command line itself was wrong (argparse); no status is written
user-error     3      the spec, the model code or the data is wrong, or the machine is not what
                      the spec asks for (no TPU, wrong TensorFlow): never retry, tear down
diverged       4      the loss or a metric became NaN or infinite; the message names the step and
                      the last checkpoint saved before it: never retry (the same seed diverges
                      again), tear down; the run failed, it did not succeed
preempted      143    SIGTERM or the metadata server's ``instance/preempted`` arrived; a
                      checkpoint was written at the last call boundary: recreate and resume
stopped        5      someone asked for the run to stop (``tpuops stop``, ``down`` of its node, the
                      dashboard: the run's ``stop.json``, which the agent reads from the store);
                      a checkpoint was written at the last call boundary: the run ends STOPPED,
                      neither a failure nor a preemption, and ``train --resume`` goes on from it
=============  =====  ===========================================================================

Python's own exit code for an uncaught exception is 1, so an agent that dies outside our
handlers still reads as "crashed". 143 is the shell's code for SIGTERM (128 + 15).

Whose fault a failure is, TensorFlow's errors included, is decided on the agent's side
(``tpuops.agent.blame``); the exceptions it decides by are here, since the run spec raises ``UserError`` too.

This module is shared with the control plane (``tpuops.runs`` reads ``status.json`` with these
enums), so it imports the standard library only. Both enums are ``str`` enums: a member equals the
string ``status.json`` holds.
"""

import enum
import re
import traceback
from typing import Optional

TRACEBACK_LINES = 60


class ValueEnum(str, enum.Enum):
    """A str enum whose members print as their JSON value, in f-strings too (Python 3.11 changed that).

    The one such base of tpuops: the control plane takes it from here (``tpuops.core.kinds``), since the
    agent can import nothing of the control plane."""

    def __str__(self) -> str:
        return str(self.value)


class Phase(ValueEnum):
    """What the agent is doing (``status.json`` field ``phase``); DONE exactly when an exit class is set."""

    STARTING = "starting"
    LOADING = "loading"
    TRAINING = "training"
    CHECKPOINTING = "checkpointing"
    EVALUATING = "evaluating"
    SAVING = "saving"
    PREDICTING = "predicting"
    DONE = "done"


class ExitClass(ValueEnum):
    """How one agent process exited; the value is what ``status.json`` says.

    Not how a run ended: a run's ending is ``Outcome`` (``tpuops/runs/outcome.py``), and a
    PREEMPTED exit ends no run (the run goes on from its checkpoint). The agent cannot import
    ``Outcome`` (it runs on Python 3.8 with nothing else from tpuops); ``OUTCOME_OF_EXIT`` there
    turns an exit into a run's ending.
    """

    SUCCEEDED = "succeeded"
    CRASHED = "crashed"
    USER_ERROR = "user-error"
    DIVERGED = "diverged"
    PREEMPTED = "preempted"
    STOPPED = "stopped"

    @property
    def code(self) -> int:
        return _CODES[self]

    @property
    def complete(self) -> bool:
        """The run's work is over (succeeded, user-error, diverged): nothing to resume. A stopped run is final but
        not complete: ``train --resume`` goes on from its checkpoint."""
        return self.final and self is not ExitClass.STOPPED

    @property
    def final(self) -> bool:
        """The run cannot go on after this exit (succeeded, user-error, diverged, stopped); the others are retried."""
        return self in (ExitClass.SUCCEEDED, ExitClass.USER_ERROR, ExitClass.DIVERGED, ExitClass.STOPPED)


_CODES = {
    ExitClass.SUCCEEDED: 0,
    ExitClass.CRASHED: 1,
    ExitClass.USER_ERROR: 3,
    ExitClass.DIVERGED: 4,
    ExitClass.PREEMPTED: 143,
    ExitClass.STOPPED: 5,
}


class UserError(Exception):
    """The run cannot succeed as specified: bad spec, model code, data or machine. Never retried."""


class PreemptedExit(Exception):
    """Raised by the loops after the preemption checkpoint is safe: unwinds to the exit path."""


class StoppedExit(PreemptedExit):
    """Raised instead when the notice was a stop someone asked for (the run's ``stop.json``): the checkpoint is as
    safe, but the run ends STOPPED, for good, where a preempted one is recovered."""


def interrupted(stopped: bool, reason: Optional[str], where: str) -> PreemptedExit:
    """What a loop raises once its checkpoint on a notice is safe: a stop's exit or a preemption's, saying ``where``."""
    if stopped:
        return StoppedExit(f"stopped ({reason}) {where}")
    return PreemptedExit(f"preempted ({reason}) {where}")


class DivergedExit(Exception):
    """Raised by the loops when the loss or a metric is NaN or infinite; the message names the step and
    the last checkpoint saved before it (a later one would hold the diverged weights: none is written)."""


def traceback_tail(exc: BaseException, lines: int = TRACEBACK_LINES) -> str:
    """The last ``lines`` lines of the formatted traceback: what ``status.json`` carries."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


# TF 2.9 opens graph errors with this line, then where the op was defined, then "Node: '...'",
# and only then the reason.
_TF_PREAMBLE = "Graph execution error:"
# An error raised while a tf.function was traced (autograph) opens with this line, then the frames
# of the user's and Keras' code, and ends with the original exception's "Type: message" line.
_TRACE_PREAMBLE = "in user code:"
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Warning)?: ")


def cause_line(exc: BaseException) -> str:
    """The one line of ``exc``'s message that says why (TF's preambles and frames left out)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if lines and lines[0] == _TF_PREAMBLE:
        nodes = [i for i, line in enumerate(lines) if line.startswith("Node: ")]
        after = lines[nodes[-1] + 1:] if nodes else lines[1:]
        lines = [line for line in after if not line.startswith("[[")] or lines
    elif lines and lines[0] == _TRACE_PREAMBLE:
        causes = [line for line in lines[1:] if _EXCEPTION_LINE.match(line) and not line.startswith("File ")]
        return causes[-1] if causes else " ".join(lines[1:])
    return lines[0] if lines else ""


def describe(exc: BaseException) -> str:
    """One line for the status message: the exception type and the line that says why.

    An error raised while tracing (``in user code:``) is told by the original exception's own
    line ("ValueError: Unknown loss function: ..."), which names its type already.
    """
    line = cause_line(exc)
    if str(exc).strip().startswith(_TRACE_PREAMBLE):
        return line
    return f"{type(exc).__name__}: {line}"

