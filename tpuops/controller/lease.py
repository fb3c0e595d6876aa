"""Leases in the store: only the holder acts on a run; a dead holder's lease expires.

A lease is ``leases/<name>`` holding ``{"holder", "expires"}``, taken and renewed with a
compare-and-swap on the object's generation, so two controllers racing for it cannot both win.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid

from tpuops.errors import NotFound, PreconditionFailed
from tpuops.store import Store


def new_holder_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class Leases:
    """Take, renew and drop leases for one holder."""

    def __init__(self, store: Store, holder: str, ttl_s: float) -> None:
        self.store = store
        self.holder = holder
        self.ttl_s = ttl_s

    def acquire(self, name: str, now: float | None = None) -> bool:
        """Take or renew the lease on ``name``; False when another live holder has it."""
        now = time.time() if now is None else now
        key = f"leases/{name}"
        try:
            data, generation = self.store.read_versioned(key)
            current = json.loads(data)
        except NotFound:
            generation, current = 0, None
        expires = float(current.get("expires", 0)) if current else 0.0
        if current and current.get("holder") != self.holder and expires > now:
            return False
        if current and current.get("holder") == self.holder and expires - now > self.ttl_s / 2:
            return True  # ours for a while yet: a write per pass per run would be the pass's main cost
        body = json.dumps({"holder": self.holder, "expires": now + self.ttl_s}).encode()
        try:
            self.store.write_if_generation_match(key, body, generation)
        except PreconditionFailed:
            return False
        return True

    def release(self, name: str) -> None:
        """Drop the lease if we hold it (so a successor need not wait for it to expire)."""
        key = f"leases/{name}"
        try:
            data, generation = self.store.read_versioned(key)
        except NotFound:
            return
        if json.loads(data).get("holder") == self.holder:
            expired = json.dumps({"holder": self.holder, "expires": 0}).encode()
            try:
                self.store.write_if_generation_match(key, expired, generation)
            except PreconditionFailed:
                return
