"""Controller leases (``leases/<name>`` in the store, compare-and-swap on generation), on every store.

Time is passed explicitly (``now``), so expiry is tested without waiting.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from lanes import LOCAL_AND_GCS

from tpuops.core import acting
from tpuops.core.errors import LeaseLost
from tpuops.store import LocalStore, Store, gcs_client
from tpuops.store.gcs import GcsStore
from tpuops.store.lease import Leases

TTL = 60.0
T0 = 1_800_000_000.0


@pytest.fixture(params=LOCAL_AND_GCS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    server = request.getfixturevalue("fake_gcs")
    bucket = request.getfixturevalue("gcs_bucket")
    return GcsStore(bucket, "root", client=gcs_client(server.endpoint), deadline_s=10)


def holder(store: Store, name: str) -> Leases:
    return Leases(store, name, ttl_s=TTL)


def owner(store: Store, name: str = "run-1") -> str:
    return json.loads(store.read_bytes(f"leases/{name}"))["holder"]


def race(contenders: list[Leases], now: float) -> list[bool]:
    """Every contender calls ``acquire`` at the same moment (a barrier); who got it."""
    barrier = threading.Barrier(len(contenders))
    results: list[bool | None] = [None] * len(contenders)

    def contend(index: int, leases: Leases) -> None:
        barrier.wait(timeout=30)
        results[index] = leases.acquire("run-1", now=now)

    threads = [threading.Thread(target=contend, args=(i, c)) for i, c in enumerate(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert all(r is not None for r in results)
    return [bool(r) for r in results]


DAMAGED = {"truncated": b'{"holder": "old", "expi', "not-utf8": b"\xff\xfe\x00garbage", "not-a-lease": b"[1, 2]",
           "no-holder": b'{"expires": 9999999999}', "bad-expiry": b'{"holder": "old", "expires": "soon"}'}
"""Lease documents that cannot be read (a torn write, a hand edit): each holds nobody."""


@pytest.mark.parametrize("before", ["absent", "expired", *(f"damaged-{kind}" for kind in DAMAGED)])
def test_of_holders_racing_for_one_lease_exactly_one_wins(store: Store, before: str) -> None:
    if before == "expired":
        assert holder(store, "old").acquire("run-1", now=T0 - 2 * TTL)
    if before.startswith("damaged-"):
        store.write_bytes("leases/run-1", DAMAGED[before.removeprefix("damaged-")])
    contenders = [holder(store, f"controller-{i}") for i in range(4)]
    won = race(contenders, now=T0)
    assert won.count(True) == 1
    winner = contenders[won.index(True)]
    assert owner(store) == winner.holder
    losers = [c for c in contenders if c is not winner]
    assert not any(c.acquire("run-1", now=T0 + 1) for c in losers)


def test_a_lease_expires_after_its_ttl(store: Store) -> None:
    a, b = holder(store, "a"), holder(store, "b")
    assert a.acquire("run-1", now=T0)
    assert not b.acquire("run-1", now=T0 + TTL - 1)
    assert b.acquire("run-1", now=T0 + TTL + 1)
    assert owner(store) == "b"
    assert not a.acquire("run-1", now=T0 + TTL + 2)


def test_release_lets_another_holder_take_it_at_once(store: Store) -> None:
    a, b = holder(store, "a"), holder(store, "b")
    assert a.acquire("run-1", now=T0)
    assert not b.acquire("run-1", now=T0 + 1)
    a.release("run-1")
    assert b.acquire("run-1", now=T0 + 1)
    assert owner(store) == "b"


def test_release_by_another_holder_or_of_an_absent_lease_changes_nothing(store: Store) -> None:
    a, b = holder(store, "a"), holder(store, "b")
    b.release("run-1")
    assert not store.exists("leases/run-1")
    assert a.acquire("run-1", now=T0)
    b.release("run-1")
    assert not b.acquire("run-1", now=T0 + 1)
    assert owner(store) == "a"


class _Renewed(LocalStore):
    """A local store where, once, the lease's holder renews it (another of its threads) between a release's read and
    its compare-and-swap (once ``renewed`` is set False): a real conflict, which the release loses."""

    renewed = True

    def write_if_generation_match(self, key: str, data: bytes, generation: int) -> int:
        if not self.renewed:
            self.renewed = True
            self.write_bytes(key, self.read_bytes(key))
        return super().write_if_generation_match(key, data, generation)


@pytest.mark.unit
def test_a_release_that_loses_its_compare_and_swap_reads_again_and_still_drops_a_lease_that_is_ours(
        tmp_path: Path) -> None:
    store = _Renewed(tmp_path / "store")
    a, b = holder(store, "a"), holder(store, "b")
    assert a.acquire("run-1", now=T0)
    store.renewed = False
    a.release("run-1")  # given up at the conflict, the lease held the run a whole TTL (the swarm's seed 9006)
    assert store.renewed
    assert b.acquire("run-1", now=T0 + 1)
    assert owner(store) == "b"


@pytest.mark.parametrize("kind", DAMAGED)
def test_a_damaged_lease_is_left_by_release_and_replaced_by_the_next_acquire(store: Store, kind: str) -> None:
    store.write_bytes("leases/run-1", DAMAGED[kind])
    holder(store, "a").release("run-1")
    assert store.read_bytes("leases/run-1") == DAMAGED[kind]
    assert holder(store, "b").acquire("run-1", now=T0)
    assert owner(store) == "b"


def test_the_holder_renews_its_own_lease(store: Store) -> None:
    a, b = holder(store, "a"), holder(store, "b")
    assert a.acquire("run-1", now=T0)
    generation = store.generation_of("leases/run-1")
    assert a.acquire("run-1", now=T0 + TTL - 1)  # renewed before it ran out
    assert store.generation_of("leases/run-1") != generation
    assert not b.acquire("run-1", now=T0 + TTL + 1)  # the first term is over, the renewal is not
    assert b.acquire("run-1", now=T0 + 2 * TTL)


def test_leases_of_different_runs_are_independent(store: Store) -> None:
    a, b = holder(store, "a"), holder(store, "b")
    assert a.acquire("run-1", now=T0)
    assert b.acquire("run-2", now=T0)
    assert not a.acquire("run-2", now=T0) and not b.acquire("run-1", now=T0)


class Clock:
    """A holder's clock that a test moves (a pass that stalls)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_each_call_of_an_action_renews_the_lease_before_it_goes(store: Store) -> None:
    clock = Clock(T0)
    a = Leases(store, "a", ttl_s=TTL, clock=clock)
    assert a.acquire("run-1")
    generation = store.generation_of("leases/run-1")
    clock.now = T0 + TTL / 4  # still known: no round trip to decide
    assert a.known("run-1")
    with a.acting("run-1"):
        assert store.generation_of("leases/run-1") == generation  # nothing asked until a call goes
        acting.check("DeleteNode")  # sent
    assert store.generation_of("leases/run-1") != generation  # renewed (a compare-and-swap) as the call went
    assert not holder(store, "b").acquire("run-1", now=T0 + TTL + 1)  # the renewal runs from the call
    assert holder(store, "b").acquire("run-1", now=T0 + TTL / 4 + TTL + 1)
    acting.check("DeleteNode")  # outside an action: nothing to renew, nothing refused


@pytest.mark.parametrize("kind", list(DAMAGED)[:2])
def test_a_lease_taken_from_a_damaged_document_is_not_acted_on_by_the_holder_that_believed_it_its_own(
        store: Store, kind: str) -> None:
    """The swarm's seed 1381: a garbled lease, taken by a cron while the watch still knew it its own."""
    a = Leases(store, "a", ttl_s=TTL, clock=Clock(T0))
    assert a.acquire("run-1")
    store.write_bytes("leases/run-1", DAMAGED[kind])
    b = Leases(store, "b", ttl_s=TTL, clock=Clock(T0 + 1))
    assert b.acquire("run-1")
    assert a.known("run-1")  # what a's passes decide with: no round trip
    with a.acting("run-1"), pytest.raises(LeaseLost, match="not ours any more"):
        acting.check("DeleteNode")
    assert owner(store) == "b"
    with b.acting("run-1"):
        acting.check("DeleteNode")


@pytest.mark.parametrize("kind", list(DAMAGED)[:2])
def test_a_live_lease_a_damage_overwrote_is_taken_back_by_its_holder_only_while_its_run_is_unchanged(
        store: Store, kind: str) -> None:
    """The swarm's seed 2822: a user's stop, then a garbled lease, before the watch's pass: its delete was refused
    (the lease "not ours any more"), and the stop took effect a pass late. Nobody else wrote the lease: it is ours."""
    clock = Clock(T0)
    a = Leases(store, "a", ttl_s=TTL, clock=clock)
    assert a.acquire("run-1") and a.acquire("run-2") and a.acquire("run-3")
    for run in ("run-1", "run-2", "run-3"):
        store.write_bytes(f"leases/{run}", DAMAGED[kind])
    tenure = a.tenure("run-1")
    with a.acting("run-1", lambda: True):
        acting.check("DeleteNode")  # sent: taken back, in the same tenure
    assert owner(store, "run-1") == "a" and a.tenure("run-1") == tenure
    assert not holder(store, "b").acquire("run-1", now=T0 + 1)
    with a.acting("run-2", lambda: False), pytest.raises(LeaseLost):  # its memory moved: someone else decided
        acting.check("DeleteNode")
    with a.acting("run-3"), pytest.raises(LeaseLost):  # nothing to tell whether it moved
        acting.check("DeleteNode")
    assert store.read_bytes("leases/run-2") == store.read_bytes("leases/run-3") == DAMAGED[kind]
    assert a.acquire("run-4")
    clock.now = T0 + TTL + 1  # ours ran out: anyone may have taken it, then a damage hidden their name
    store.write_bytes("leases/run-4", DAMAGED[kind])
    with a.acting("run-4", lambda: True), pytest.raises(LeaseLost):
        acting.check("DeleteNode")


def test_a_call_of_a_pass_stalled_past_its_lease_goes_only_if_nobody_took_the_lease_meanwhile(store: Store) -> None:
    """The swarm's seed 217: the watch's pass stalled in its delete past its lease, a cron took the run over and
    acted; the stalled delete must not follow. Had nobody written the lease meanwhile, nobody acted: it may go."""
    clock = Clock(T0)
    a = Leases(store, "a", ttl_s=TTL, clock=clock)
    assert a.acquire("run-1") and a.acquire("run-2")
    with a.acting("run-1"):
        clock.now = T0 + TTL + 5  # stalled before the call went out
        assert holder(store, "b").acquire("run-1", now=clock.now)
        with pytest.raises(LeaseLost):
            acting.check("DeleteNode")
    with a.acting("run-2"):
        acting.check("DeleteNode")  # run-2's lease ran out too, but nobody wrote it: still ours, renewed
    assert owner(store, "run-2") == "a"
    assert not holder(store, "c").acquire("run-2", now=clock.now + 1)


def test_a_call_is_not_sent_when_the_store_cannot_renew_its_lease(store: Store) -> None:
    clock = Clock(T0)
    a = Leases(store, "a", ttl_s=TTL, clock=clock)
    assert a.acquire("run-1")
    store.delete("leases/run-1")  # (a lost lease, as a store that answers nothing would leave us unsure)
    with a.acting("run-1"), pytest.raises(LeaseLost):
        acting.check("CreateNode")
    assert a.acquire("run-1")  # the next pass takes it afresh


def test_a_renewal_refused_by_a_document_still_ours_renews_it(store: Store) -> None:
    """A conditional write retried after its first try landed is refused (412); the document is then ours still."""
    a = Leases(store, "a", ttl_s=TTL, clock=Clock(T0))
    assert a.acquire("run-1")
    store.write_bytes("leases/run-1", store.read_bytes("leases/run-1"))  # the same bytes, a new generation
    with a.acting("run-1"):
        acting.check("CreateNode")
    assert owner(store) == "a"
