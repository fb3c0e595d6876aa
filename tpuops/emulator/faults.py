"""Faults injected on demand: stockouts, error storms, latency, preemption, held deletes, queued and project states.

Set through ``POST /_admin/faults`` (keys given replace those keys, the others stay) and
cleared with ``DELETE /_admin/faults``. Random draws use one RNG seeded by ``seed``, so a
test that sets a seed sees the same sequence of failures for the same sequence of calls.
``error_burst: N`` fails exactly the next N API calls, for tests that need no randomness.
Admin and metadata requests are never failed.

``gcs_error_rate`` / ``gcs_latency_ms`` act on both Cloud Storage fronts (``gcsfront``): the one
emulated nodes reach as storage.googleapis.com and the control plane's: a failed request is, in
turns, a 503, a 429, or a connection reset before any response byte; the latency delays every response.
"""

from __future__ import annotations

import math
import random
import threading
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from tpuops.emulator.apierror import ApiError

# HTTP status an injected error may carry -> its status name.
INJECTABLE = {429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}
# What a failed Cloud Storage request turns into, in turns: an HTTP status, or a reset connection.
GCS_FAILURES = ("503", "429", "reset")


@dataclass
class FaultConfig:
    """The faults in force; the defaults inject nothing."""

    stockout_zones: list[str] = field(default_factory=list)
    error_rate: float = 0.0
    error_code: int = 503
    error_burst: int = 0
    latency_s: float = 0.0
    preempt_rate_per_s: float = 0.0
    seed: int | None = None
    # Deletes of these nodes (ids) stay DELETING until the id leaves the list: a delete as slow as chosen.
    hold_deletes: list[str] = field(default_factory=list)
    # Queued resources: stay ACCEPTED (never provisioned), or fail in these zones (FAILED).
    hold_queued: bool = False
    fail_queued_zones: list[str] = field(default_factory=list)
    # Project-level answers (see ``services``): what is off, denied or missing.
    disabled_services: list[str] = field(default_factory=list)
    denied_permissions: list[str] = field(default_factory=list)
    missing_service_accounts: list[str] = field(default_factory=list)
    # The Cloud Storage fronts (gcsfront, nodes' and control plane's): fraction failed, milliseconds added to each.
    gcs_error_rate: float = 0.0
    gcs_latency_ms: float = 0.0


class Faults:
    """The fault configuration and its RNG. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._config = FaultConfig()
        self._rng = random.Random()
        self.injected_errors = 0
        self.injected_storage_faults = 0

    def update(self, changes: dict[str, Any]) -> FaultConfig:
        """Apply ``changes`` (a subset of ``FaultConfig``'s fields) and return the result.

        Raises:
            ApiError: INVALID_ARGUMENT for an unknown key or a value out of range.
        """
        known = {f.name for f in fields(FaultConfig)}
        unknown = set(changes) - known
        if unknown:
            raise ApiError("INVALID_ARGUMENT", f"Unknown fault keys {sorted(unknown)}; known: {sorted(known)}.")
        with self._lock:
            merged = FaultConfig(**{**asdict(self._config), **changes})
            _check(merged)
            self._config = merged
            if "seed" in changes:
                self._rng.seed(merged.seed)
            return merged

    def clear(self) -> None:
        with self._lock:
            self._config = FaultConfig()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return asdict(self._config)

    def latency_s(self) -> float:
        with self._lock:
            return self._config.latency_s

    def stockout(self, zone: str) -> bool:
        with self._lock:
            return zone in self._config.stockout_zones

    def holds_delete(self, node_id: str) -> bool:
        with self._lock:
            return node_id in self._config.hold_deletes

    def queued_outcome(self, zone: str) -> str | None:
        """``hold`` (stay ACCEPTED), ``fail`` (FAILED) or None (provision as usual)."""
        with self._lock:
            if zone in self._config.fail_queued_zones:
                return "fail"
            return "hold" if self._config.hold_queued else None

    def injected_error(self) -> ApiError | None:
        """The error to answer this API call with, if one is due."""
        with self._lock:
            config = self._config
            if config.error_burst > 0:
                config.error_burst -= 1
            elif not (config.error_rate > 0 and self._rng.random() < config.error_rate):
                return None
            self.injected_errors += 1
            status = INJECTABLE[config.error_code]
        return ApiError(status, f"Injected fault: the service is unavailable ({config.error_code}).")

    def storage_fault(self) -> tuple[float, str | None]:
        """For one Cloud Storage request: seconds to delay it, and the failure due (``GCS_FAILURES``) or None."""
        with self._lock:
            config = self._config
            failure = None
            if config.gcs_error_rate > 0 and self._rng.random() < config.gcs_error_rate:
                failure = GCS_FAILURES[self.injected_storage_faults % len(GCS_FAILURES)]
                self.injected_storage_faults += 1
            return config.gcs_latency_ms / 1000.0, failure

    def preemption_draws(self, count: int, interval_s: float) -> list[bool]:
        """For ``count`` preemptible nodes over ``interval_s``, which ones get preempted."""
        with self._lock:
            rate = self._config.preempt_rate_per_s
            if rate <= 0 or count == 0:
                return [False] * count
            chance = 1.0 - math.exp(-rate * interval_s)
            return [self._rng.random() < chance for _ in range(count)]


def _check(config: FaultConfig) -> None:
    problems = []
    if not 0.0 <= config.error_rate <= 1.0:
        problems.append("error_rate must be within [0, 1]")
    if config.error_code not in INJECTABLE:
        problems.append(f"error_code must be one of {sorted(INJECTABLE)}")
    if not 0.0 <= config.gcs_error_rate <= 1.0:
        problems.append("gcs_error_rate must be within [0, 1]")
    if config.error_burst < 0 or config.latency_s < 0 or config.preempt_rate_per_s < 0 or config.gcs_latency_ms < 0:
        problems.append("error_burst, latency_s, preempt_rate_per_s and gcs_latency_ms must not be negative")
    for name in ("stockout_zones", "hold_deletes", "fail_queued_zones", "disabled_services", "denied_permissions",
                 "missing_service_accounts"):
        if not isinstance(getattr(config, name), list):
            problems.append(f"{name} must be a list of strings")
    if problems:
        raise ApiError("INVALID_ARGUMENT", "; ".join(problems) + ".")
