"""The lease an action is made under, confirmed as each of its calls goes out.

A controller acts on a run only under the run's lease (``tpuops.store.lease``). It decides on a lease it knows to
be its own without asking the store, but between that decision and a call going out the lease may have been
taken over: from a damaged document while we believed it ours, or because our process stalled past its expiry
(a laptop that sleeps, a paused VM, a pass stalled inside a call: the swarm's ``controller.overrun``), and
another controller then acted. So an action's calls are made inside ``under``, handed the lease's ``confirm``,
and a provider asks ``check`` right before each try of a call that changes the cloud goes out (the Cloud TPU
adapter, every retry included; the simulated cloud, whose calls are its sends): the lease is renewed there (a
compare-and-swap on the generation we wrote: it fails if anyone wrote the lease since), and the call is not
sent (``LeaseLost``) unless that left it ours, and live. The caller takes ``LeaseLost`` as any failed call (a
create failed: the next pass decides again). Reads are never refused: they change nothing. The deadline is on
the lease's own clock (virtual in a simulation), handed in with it.

May import: the standard library and ``tpuops.core``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from tpuops.core.clock import Clock
from tpuops.core.errors import LeaseLost


@dataclass(frozen=True)
class _Under:
    confirm: Callable[[], float]
    """Renews the lease and says when it now runs out; ``LeaseLost`` when it is not ours any more."""
    clock: Clock
    what: str


_UNDER: ContextVar[_Under | None] = ContextVar("tpuops_acting_under", default=None)
"""Per thread (a pass's workers act on one run each): the lease of the action under way, if any."""


@contextmanager
def under(confirm: Callable[[], float], clock: Clock, what: str) -> Iterator[None]:
    """The calls that change the cloud made inside the block go out only under the lease ``confirm`` renews."""
    token = _UNDER.set(_Under(confirm, clock, what))
    try:
        yield
    finally:
        _UNDER.reset(token)


def check(call: str) -> None:
    """Right before ``call`` (one that changes the cloud) goes out: renew the lease it is made under, if any;
    ``LeaseLost`` when it is not ours, or ran out while it was being renewed."""
    held = _UNDER.get()
    if held is not None and held.clock() >= held.confirm():
        raise LeaseLost(f"{call} not sent: the lease on {held.what} ran out as it was renewed")
