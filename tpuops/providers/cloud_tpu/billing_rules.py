"""Cloud TPU's billing rules that both the cost tracker and the local emulator apply: one definition.

Google's rule (docs/cloud-tpu.md): "You are not charged for TPUs if they are preempted in the
first minute after you create them", and TPU Spot VMs share the preemptible pricing model. The
minute is measured from the node's create, not from its first READY second, so a node that spends
its first minute CREATING and is preempted right after it turns READY is billed in full.

Both sides measure the same two moments: the create (the emulator's node createTime; the ledger's
``created_at``, written by ``Fleet`` just before it sends the create request, or the API's
createTime for a node first seen in a listing) and the moment the node left READY for PREEMPTED
(the emulator's end of the billing interval; the ledger's PREEMPTED transition). Times are epoch
seconds so that the emulator (floats from ``time.time``) and the ledger (datetimes) call it alike.

Standard library only, no other tpuops import: the emulator (``tpuops/emulator/``, standard library
only) imports it, and Cloud TPU's offers (``offers``) hand it to ``tpuops.billing.cost`` through the registry.
"""

from __future__ import annotations

FREE_PREEMPTION_WINDOW_S = 60.0
"""A spot or preemptible node preempted less than this long after its create is not billed."""

PREEMPTIBLE_CAPACITIES = frozenset({"spot", "preemptible"})
"""Capacities (their wire names) that share the preemptible pricing model, first-minute rule included."""


def preemption_is_free(capacity: str, created_s: float, preempted_s: float) -> bool:
    """Whether a node of ``capacity`` created at ``created_s`` and preempted at ``preempted_s`` costs nothing."""
    return capacity in PREEMPTIBLE_CAPACITIES and preempted_s - created_s < FREE_PREEMPTION_WINDOW_S


def billed_seconds(capacity: str, created_s: float, start_s: float, end_s: float, *, preempted: bool) -> float:
    """The seconds billed for one READY interval from ``start_s`` to ``end_s``: all of them, or none when it
    ended in a preemption that the first-minute rule makes free. An interval still open is billed up to now
    (``end_s``): it has not been preempted, so nothing of it is free yet."""
    if preempted and preemption_is_free(capacity, created_s, end_s):
        return 0.0
    return max(0.0, end_s - start_s)
