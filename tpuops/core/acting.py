"""The deadline of an action under way: a create or delete decided under a lease goes out only while it lasts.

A controller acts on a run only under the run's lease (``tpuops.store.lease``), confirmed right before it acts
(``Leases.acting``). But a process can stall between that check and the moment its call goes out, for longer
than the lease lasts (a laptop that sleeps, a paused VM, a pass stalled inside a call: the swarm's
``controller.overrun``); another controller then takes the expired lease over and acts, and the stale call
would land after it: two controllers acting on one run. So the check hands the lease's expiry to the calls
made inside it (``until``), and a provider asks ``check`` right before each try of a call that changes the
cloud goes out (the Cloud TPU adapter, every retry included; the simulated cloud, whose calls are its sends):
past the deadline the call is not sent (``LeaseLost``), and the next pass takes the lease and decides again.
Reads are never refused: they change nothing. The deadline is on the lease's own clock (virtual in a
simulation), handed in with it.

May import: the standard library and ``tpuops.core``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from tpuops.core.clock import Clock
from tpuops.core.errors import LeaseLost


@dataclass
class _Deadline:
    at: float
    clock: Clock
    what: str
    refused: LeaseLost | None = None


_UNTIL: ContextVar[_Deadline | None] = ContextVar("tpuops_acting_until", default=None)
"""Per thread (a pass's workers act on one run each): the deadline of the calls under way, if any."""


@contextmanager
def until(deadline: float, clock: Clock, what: str) -> Iterator[None]:
    """The calls that change the cloud made inside the block go out only before ``deadline`` on ``clock``.

    A refused call raises ``LeaseLost`` where it was made, and again as the block ends if the caller took it for
    any failed call (a failed create is news for the run's memory; this one is not: nothing was sent)."""
    token = _UNTIL.set(held := _Deadline(deadline, clock, what))
    try:
        yield
    finally:
        _UNTIL.reset(token)
    if held.refused is not None:
        raise held.refused


def check(call: str) -> None:
    """Right before ``call`` (one that changes the cloud) goes out: ``LeaseLost`` once past the deadline."""
    held = _UNTIL.get()
    if held is not None and held.clock() >= held.at:
        held.refused = LeaseLost(f"{call} not sent: the lease on {held.what} it was decided under ran out first "
                                 "(the process stalled); the next pass decides again")
        raise held.refused
