"""How a run ended: the one run-ending vocabulary (``Outcome``) and the tables that map it.

Four vocabularies used to say how something ended. They name three different things, and only one
of them is the ending of a run:

- ``Outcome`` (here): how a run ended, decided once, by the controller (``controller/decide.py``)
  or by a sweep that stops a trial (``sweeps/advance.py``), through ``Memory.finish``, and kept in
  the run's memory. Every way a run ends is one member: the agent's final exit, crashes past the
  restarts, a refused create, the run's budget, and a sweep's pruner, ``sweep stop``, the sweep's
  budget and too many preemptions. The sweep vocabulary's ``"cancelled"`` was never written by
  anyone: it is gone.
- ``ExitClass`` (``tpuops/contract/exits.py``): how one agent *process* exited. It stays apart: it is
  shared with the agent (Python 3.8, nothing else from tpuops), it maps to process exit codes, and
  its PREEMPTED ends no run (the run goes on from its checkpoint). ``OUTCOME_OF_EXIT`` below turns
  an exit into a run's ending.
- ``CreateResult`` (``tpuops/core/create_result.py``): where one create *request* stands (running, ok,
  capacity, retry, failed). Only its FAILED ends the run, as ``Outcome.FAILED``.
- A sweep's own ending (completed, stopped, budget-exhausted, failed) is a sweep's, not a run's:
  ``SweepOutcome`` (``tpuops/sweeps/models.py``).

Every mapping of a run's ending is a table keyed by ``Outcome``, with an entry for each member
(tests check it): ``COUNTS_AS_FAILURE`` here, and the Optuna trial state a trial is told with
(``tpuops/sweeps/decide.py``, ``TRIAL_STATE``). ``Outcome`` is a str enum: a member equals the
string memory.json holds.
"""

from __future__ import annotations

from types import MappingProxyType

from tpuops.contract.exits import ExitClass
from tpuops.core.kinds import ValueEnum


class Outcome(ValueEnum):
    """How a finished run ended (``tpuops events``, ``runs``, a sweep's trial)."""

    SUCCEEDED = "succeeded"
    USER_ERROR = "user-error"
    CRASHED = "crashed"
    DIVERGED = "diverged"  # the loss or a metric became NaN or infinite: failed, never retried
    BUDGET_EXHAUSTED = "budget-exhausted"
    FAILED = "failed"  # a create request was refused (quota, permission, invalid)
    # A sweep ended the run (tpuops.sweeps): its pruner, 'sweep stop' or the sweep's budget, too many preemptions.
    PRUNED = "pruned"
    STOPPED = "stopped"  # also 'tpuops stop', 'down' of the run's node, the dashboard (tpuops.controller.stop)
    PREEMPTED_OUT = "preempted-out"

    @classmethod
    def of_exit(cls, exit_class: ExitClass) -> Outcome:
        """The outcome a final agent exit (succeeded, user-error, diverged) or the last crash gives the run."""
        return OUTCOME_OF_EXIT[exit_class]


OUTCOME_OF_EXIT = MappingProxyType({
    ExitClass.SUCCEEDED: Outcome.SUCCEEDED,
    ExitClass.USER_ERROR: Outcome.USER_ERROR,
    ExitClass.CRASHED: Outcome.CRASHED,
    ExitClass.DIVERGED: Outcome.DIVERGED,
    ExitClass.STOPPED: Outcome.STOPPED,  # the agent saw the run's stop request before a controller honoured it
})
"""The ending an agent's exit gives its run; PREEMPTED gives none (the run is recovered)."""

COUNTS_AS_FAILURE = MappingProxyType({
    Outcome.SUCCEEDED: False,
    Outcome.USER_ERROR: True,
    Outcome.CRASHED: True,
    Outcome.DIVERGED: False,
    Outcome.BUDGET_EXHAUSTED: False,
    Outcome.FAILED: True,
    Outcome.PRUNED: False,
    Outcome.STOPPED: False,
    Outcome.PREEMPTED_OUT: False,
})
"""Whether the ending is a failure of the run's code or request (a sweep's ``max_failures`` counts these);
the budget, preemptions and a sweep's own stops are not. Nor is a divergence: in a sweep it is what the
sampled hyperparameters did (a learning rate too high), a result of the search, not broken code; the run
itself still failed (it never counts as a success, its trial is told FAIL, and ``train`` exits 1)."""
