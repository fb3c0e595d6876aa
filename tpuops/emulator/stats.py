"""Counts of API requests by RPC name (``ListNodes``, ``GetOperation``...).

Benchmarks and tests read them through ``GET /_admin/stats`` to check how many calls a
tpuops command makes (one ListNodes per zone per reconcile pass, for instance). Every
request that reached a known RPC counts, including those failed by an injected fault.
"""

from __future__ import annotations

import threading
from collections import Counter


class RpcStats:
    """Thread-safe request counter."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def count(self, rpc: str) -> None:
        with self._lock:
            self._counts[rpc] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(sorted(self._counts.items()))

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()
