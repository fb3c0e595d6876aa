"""Planning before paying, as library calls: ``risk`` (preemption risk learned from the ledger).

Part of the front door (``tpuops.api`` re-exports every name here). Each call takes ``Settings``
and imports what it computes with lazily; the models (``tpuops.risk``) compute without I/O.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING

from tpuops.config import Settings

if TYPE_CHECKING:
    from tpuops.risk import Risk

UTC = timezone.utc  # datetime.UTC exists from Python 3.11 only


def risk(settings: Settings, *, now: datetime | None = None) -> list[Risk]:
    """``tpuops risk``: per (zone, accelerator, capacity) of the project's ledger, READY node-hours,
    preemptions, the rate with its 95 % interval, create -> READY latency and stockout episodes."""
    from tpuops.risk import learn
    from tpuops.session import open_ledger

    histories = open_ledger(settings).histories(settings.project)
    return learn(histories, now or datetime.now(UTC), settings.spot_preemptions_per_hour)
