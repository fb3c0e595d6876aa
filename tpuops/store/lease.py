"""Leases in the store: only the holder acts on a run; a dead holder's lease expires.

A lease is ``leases/<name>`` holding ``{"holder", "expires"}``, taken and renewed with a
compare-and-swap on the object's generation, so two controllers racing for it cannot both win.

A holder remembers the leases it holds (generation and expiry): while one has more than half its
TTL left it is known to be ours without asking the store (nobody may take a live lease), and it
is renewed with one compare-and-swap on the generation we wrote. So a controller that keeps its
runs pays a store round trip per run once per half TTL, not on every pass. A ``tenure`` counts
the times a lease had to be taken rather than renewed: what a holder cached about the run while
it held the lease is only good for the same tenure.

A lease document that cannot be read (not JSON, not UTF-8, not a holder and an expiry: a torn write, a
hand edit) holds nobody: ``acquire`` takes it as it takes an expired one, with a compare-and-swap on the
damaged document's generation, so of two controllers that find it damaged only one wins; ``release``
leaves it (not known to be ours) for the next ``acquire`` to replace. The holder whose live lease a damage
overwrote takes it back the same way as its action's next call goes, when the run the action was decided on is
unchanged (``acting``'s ``unchanged``), so a damage does not hold up even its own run's action for a pass. So no
lease, however damaged, stops a pass or another run's recovery.

``known`` is enough to decide, never to act: a holder may believe for half a TTL that it holds a lease another
took over (from a damaged document), and a pass may stall past its lease's expiry between its decision and its
call (a sleeping laptop, a paused VM). So every action is made inside ``acting``: right before each of its
calls that changes the cloud goes out, the lease is renewed with a compare-and-swap on the generation we wrote
(it fails if anyone wrote the lease since), and the call is not sent unless that left it ours and live
(``tpuops.core.acting``). Two controllers never both act on a run (the swarm's ``nodes.one_controller_acts``:
every create and delete reaches the cloud while the run's lease names its sender). A run's memory is written with
its own compare-and-swap besides, so a pass that decided on a stale copy loses its write instead of corrupting it.

Time is the holder's clock (``clock``; a controller hands it its pass clock), so that in a simulation leases
expire in virtual time as they would in real time. Guards (``tpuops.core.guards``, turned off only by the fault
swarm's tests): ``lease.exclusive`` at the lines that refuse a live lease another holds and an action under a
lease lost (two controllers at once never both act on a run), ``lease.damage_holds_nobody`` at the line that reads
a damaged lease as nobody's.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tpuops.core import acting
from tpuops.core.errors import LeaseLost, NotFound, PreconditionFailed, TpuopsError
from tpuops.core.guards import Guard
from tpuops.store import Store

EXCLUSIVE = Guard("lease.exclusive", "two controllers at once never both act on a run: a live lease another holds "
                  "is not taken")
RELEASE_TRIES = 3
"""How many times ``release`` reads the lease again after a compare-and-swap that lost (the lease may still be ours)."""

DAMAGE_HOLDS_NOBODY = Guard("lease.damage_holds_nobody", "a damaged lease document holds nobody: it stops no pass "
                            "and no other run's recovery")


def _lease_of(data: bytes) -> tuple[str, float] | None:
    """The holder and expiry a lease document names; None when it is damaged (it then holds nobody)."""
    try:
        body = json.loads(data)
        return str(body["holder"]), float(body.get("expires", 0))
    except (ValueError, TypeError, KeyError, AttributeError):  # JSON/UTF-8 damage, or not a lease's shape
        if not DAMAGE_HOLDS_NOBODY.on:
            raise
        return None


def _document(holder: str, expires: float) -> bytes:
    """A lease document as ``_lease_of`` reads it: ``holder``'s until ``expires`` (0: dropped)."""
    return json.dumps({"holder": holder, "expires": expires}).encode()


def new_holder_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass
class _Held:
    generation: int
    expires: float
    tenure: int


class Leases:
    """Take, renew and drop leases for one holder."""

    def __init__(self, store: Store, holder: str, ttl_s: float, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.holder = holder
        self.ttl_s = ttl_s
        self.clock = clock
        """What ``now`` is when a call gives none: the holder's own clock (a controller's pass clock, virtual in a
        simulation, so that its leases expire in the time its passes keep)."""
        self._held: dict[str, _Held] = {}
        self._tenures = itertools.count(1)  # next() is atomic: a pass takes leases from a thread pool

    def known(self, name: str, now: float | None = None) -> bool:
        """Whether ``name`` is ours for a while yet (more than half its TTL left): no round trip needed."""
        held = self._held.get(name)
        return held is not None and held.expires - (self.clock() if now is None else now) > self.ttl_s / 2

    def acquire(self, name: str, now: float | None = None) -> bool:
        """Take or renew the lease on ``name``; False when another live holder has it."""
        now = self.clock() if now is None else now
        held = self._held.get(name)
        if self.known(name, now):
            return True  # a round trip per pass per run would be the pass's main cost
        if held is not None and held.expires > now and self._write(name, held.generation, now, held.tenure):
            return True
        key = f"leases/{name}"
        try:
            data, generation = self.store.read_versioned(key)
            current = _lease_of(data)
        except NotFound:
            generation, current = 0, None
        holder, expires = current if current is not None else (None, 0.0)
        if holder is not None and holder != self.holder and expires > now and EXCLUSIVE.on:
            self._held.pop(name, None)
            return False
        ours = holder == self.holder and expires > now and held is not None
        return self._write(name, generation, now, held.tenure if ours and held else next(self._tenures))

    @contextmanager
    def acting(self, name: str, unchanged: Callable[[], bool] | None = None) -> Iterator[None]:
        """Around an action on ``name`` (a create, a delete): each of its calls that changes the cloud goes out
        only once the lease is renewed, in the tenure the action was decided under (``tpuops.core.acting``).

        ``known`` asks the store nothing, so it cannot see that anyone wrote the lease since: another holder that
        took it over once it expired (our pass stalled past it), or that took it from a damaged document while we
        believed it ours. The renewal is one compare-and-swap on the generation we wrote last, which fails then:
        the call is not sent (``LeaseLost``), and the next pass takes the lease and decides afresh. An action is
        rare beside a pass, so this round trip is paid per call that changes the cloud, not per run and pass.

        ``unchanged``: whether what the action was decided on is still as it was (the run's memory at the generation
        this holder read or wrote): with it, a lease found damaged is repaired instead of lost (``_repaired``)."""
        with acting.under(lambda: self._confirm(name, unchanged), self.clock, name):
            yield

    def _confirm(self, name: str, unchanged: Callable[[], bool] | None = None) -> float:
        """Renew the lease we hold on ``name`` (``acting``); when it now runs out. ``LeaseLost`` when it is not ours
        any more, or the store did not answer (then we may not know our own generation: the next ``acquire`` asks)."""
        held, now = self._held.get(name), self.clock()
        try:
            if held is not None and (self._write(name, held.generation, now, held.tenure)
                                     or self._untouched(name, held, now, unchanged)):
                return now + self.ttl_s
        except TpuopsError as err:
            self._held.pop(name, None)
            raise LeaseLost(f"the lease on {name} could not be renewed ({err}): the call was not sent") from err
        if not EXCLUSIVE.on:
            return math.inf
        raise LeaseLost(f"the lease on {name} is not ours any more (another controller may act on it): the call "
                        "was not sent")

    def _untouched(self, name: str, held: _Held, now: float, unchanged: Callable[[], bool] | None) -> bool:
        """After a renewal's compare-and-swap lost: whether the document still is what we wrote, or what we were
        writing (a retried request whose first try landed is refused so), so that nobody else wrote it (another
        holder writes its own name, a garble damages it), or is ``_repaired``; then it is renewed on the generation
        it has (a compare-and-swap: of two holders that find it so, one wins)."""
        data, generation = self.store.read_versioned(f"leases/{name}")
        ours = {_document(self.holder, at) for at in (held.expires, now + self.ttl_s)}
        return (data in ours or self._repaired(data, held, now, unchanged)) and \
            self._write(name, generation, now, held.tenure)

    @staticmethod
    def _repaired(data: bytes, held: _Held, now: float, unchanged: Callable[[], bool] | None) -> bool:
        """Whether a damaged document may be taken back, in our tenure, by the holder whose lease it overwrote.

        Nobody may take a live lease, so while ours has not run out (``held.expires``) only a damage wrote it since
        we did; another holder could have taken it from that damage and acted, but then its own name would be there,
        unless a second damage came, and its decision would have moved the run's memory (``unchanged``, asked last: a
        store round trip, paid only when a lease is found damaged). Lost instead, the lease held up the action a
        pass: a user's stop recorded just before the damage took effect one pass late (the swarm's seed 2822)."""
        return (unchanged is not None and held.expires > now and DAMAGE_HOLDS_NOBODY.on and _lease_of(data) is None
                and unchanged())

    def _write(self, name: str, generation: int, now: float, tenure: int) -> bool:
        body = _document(self.holder, now + self.ttl_s)
        try:
            written = self.store.write_if_generation_match(f"leases/{name}", body, generation)
        except PreconditionFailed:
            self._held.pop(name, None)
            return False
        self._held[name] = _Held(written, now + self.ttl_s, tenure)
        return True

    def tenure(self, name: str) -> int | None:
        """Which uninterrupted holding of ``name`` this is (None: not held)."""
        held = self._held.get(name)
        return held.tenure if held is not None else None

    def release(self, name: str) -> None:
        """Drop the lease if we hold it (so a successor need not wait for it to expire).

        A compare-and-swap that loses is read again, up to ``RELEASE_TRIES`` times: a lease someone else took since
        is theirs and left, but one still ours is dropped. Given up at the first conflict, the lease of a
        controller that exits held its runs for a whole TTL, and a ``stop`` waited that long (the swarm's seed 9006:
        a cron pass's release met a conflict, and the watch honoured the stop 15 minutes later).
        """
        self._held.pop(name, None)
        key = f"leases/{name}"
        for _ in range(RELEASE_TRIES):
            try:
                data, generation = self.store.read_versioned(key)
            except NotFound:
                return
            current = _lease_of(data)
            if current is None or current[0] != self.holder:
                return
            expired = _document(self.holder, 0)
            try:
                self.store.write_if_generation_match(key, expired, generation)
            except PreconditionFailed:
                continue
            return
