"""Whose fault a failure is: the agent's half of the exit classes (``tpuops.contract.exits``).

Whose fault a failure is (``classify``) is decided on structure: ``UserError`` is raised at the
boundaries where the user's model, code and data meet the agent (building the model, tracing the
training, evaluation and prediction functions over the data's signature, reading the dataset's
records), and TensorFlow's model/data errors are the user's wherever they arise. A
``DataLossError`` is the data's fault where the agent reads dataset records (a record whose CRC
does not match, a record cut short: the same file fails the same way on every attempt); anywhere
else (a checkpoint, the store) it stays a crash and is retried, since a store read can be torn by a
concurrent write and a corrupt checkpoint is skipped on the next attempt.

TensorFlow is imported inside the calls: the agent has it loaded by the time anything fails.
"""

import traceback
from pathlib import Path
from typing import Iterable

from tpuops.contract.exits import DivergedExit, ExitClass, PreemptedExit, StoppedExit, UserError


def classify(exc: BaseException, user_roots: Iterable[Path] = ()) -> ExitClass:
    """Decide whether ``exc`` is the user's fault (never retried) or a crash (retried).

    Besides ``UserError``, an exception counts as the user's when TensorFlow reports a
    model/data mismatch, or when any frame of its traceback lies in the user's code
    (``user_roots``: the experiments directory and the entry point module's directory).
    """
    import tensorflow as tf

    # Errors TensorFlow raises when the model and the data disagree (shapes, dtypes, bad records)
    # or the model does not fit the device: retrying the same spec fails the same way.
    user_tf_errors = (tf.errors.InvalidArgumentError, tf.errors.ResourceExhaustedError)
    if isinstance(exc, StoppedExit):
        return ExitClass.STOPPED
    if isinstance(exc, PreemptedExit):
        return ExitClass.PREEMPTED
    if isinstance(exc, DivergedExit):
        return ExitClass.DIVERGED
    if isinstance(exc, (UserError, *user_tf_errors)):
        return ExitClass.USER_ERROR
    roots = [root.resolve() for root in user_roots]
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        source = Path(frame.f_code.co_filename).resolve()
        if any(root == source or root in source.parents for root in roots):
            return ExitClass.USER_ERROR
    return ExitClass.CRASHED


def preemption_caused(exit_class: ExitClass, exc: BaseException, noticed: bool) -> bool:
    """Whether a failure is the preemption's, not the user's nor a crash: TensorFlow failed (not a check of ours)
    while the VM was being preempted (``noticed``). On a slice the preemption stops every worker's runtime at
    once; the single client's step or evaluation then fails on whatever it was doing (a lost worker reads as
    ``Socket closed``, ``Primary device is not remote``, an ``InvalidArgumentError`` that would otherwise
    blame the user), and the run must resume from its last checkpoint, not end."""
    import tensorflow as tf

    return (noticed and exit_class in (ExitClass.USER_ERROR, ExitClass.CRASHED)
            and isinstance(exc, tf.errors.OpError))
