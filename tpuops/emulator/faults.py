"""Faults injected on demand: stockouts, error storms, latency, preemption, held deletes, queued and project states,
workers of slices.

Set through ``POST /_admin/faults`` (keys given replace those keys, the others stay) and
cleared with ``DELETE /_admin/faults``. Random draws use one RNG seeded by ``seed``, so a
test that sets a seed sees the same sequence of failures for the same sequence of calls.
``error_burst: N`` fails exactly the next N API calls, for tests that need no randomness.
Admin and metadata requests are never failed.

``kill_runtimes`` / ``never_boot_workers`` name workers of slices (``NODE/N``); each entry acts once.

``gcs_error_rate`` / ``gcs_latency_ms`` act on both Cloud Storage fronts (``gcs.front``): the one
emulated nodes reach as storage.googleapis.com and the control plane's: a failed request is, in
turns, a 503, a 429, or a connection reset before any response byte; the latency delays every response.
"""

from __future__ import annotations

import math
import random
import re
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
    # The Cloud Storage fronts (gcs.front, nodes' and control plane's): fraction failed, milliseconds added to each.
    gcs_error_rate: float = 0.0
    gcs_latency_ms: float = 0.0
    # Workers of slices, as "NODE/N": each entry is used up by the one event it causes. The TPU runtime of
    # worker N is killed (once the node is READY with that runtime running); worker N's next boot runs nothing.
    kill_runtimes: list[str] = field(default_factory=list)
    never_boot_workers: list[str] = field(default_factory=list)


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
        check_changes(changes)
        with self._lock:
            merged = FaultConfig(**{**asdict(self._config), **changes})
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

    def take_worker_fault(self, kind: str, node_id: str, worker: int) -> bool:
        """Whether fault list ``kind`` (``kill_runtimes``, ``never_boot_workers``) names ``node_id/worker``;
        the entry is removed, so each entry acts once."""
        entry = f"{node_id}/{worker}"
        with self._lock:
            entries = getattr(self._config, kind)
            if entry not in entries:
                return False
            entries.remove(entry)
            return True

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


# The numeric faults and their ranges, inclusive: what ``check_changes`` enforces for every caller.
LIMITS: dict[str, tuple[float, float]] = {
    "error_rate": (0.0, 1.0),
    "gcs_error_rate": (0.0, 1.0),
    "preempt_rate_per_s": (0.0, 100.0),
    "latency_s": (0.0, 60.0),
    "gcs_latency_ms": (0.0, 60_000.0),
    "error_burst": (0, 1_000_000),
    "seed": (0, 2**32 - 1),
}
_INTEGERS = ("error_burst", "seed", "error_code")
_LISTS = ("stockout_zones", "hold_deletes", "fail_queued_zones", "disabled_services", "denied_permissions",
          "missing_service_accounts")
_WORKER_LISTS = ("kill_runtimes", "never_boot_workers")
_WORKER_ENTRY = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?/\d{1,4}$")


def check_changes(changes: dict[str, Any]) -> None:
    """Refuse (``ApiError`` INVALID_ARGUMENT, one line) fault values of the wrong type or out of range.

    The one place the admin API's rules live: the emulator runs it on every ``POST /_admin/faults``,
    and ``AdminClient.set_faults`` runs it before sending, so the CLI, a Python caller and a raw
    HTTP request are refused alike. NaN, infinity and booleans are no numbers here (a NaN latency
    compares false with every bound and used to pass; an infinite one hung every API call).
    """
    known = {f.name for f in fields(FaultConfig)}
    unknown = set(changes) - known
    if unknown:
        raise ApiError("INVALID_ARGUMENT", f"Unknown fault keys {sorted(unknown)}; known: {sorted(known)}.")
    problems = [problem for key, value in changes.items() if (problem := _problem(key, value))]
    if problems:
        raise ApiError("INVALID_ARGUMENT", "; ".join(problems) + ".")


def _problem(key: str, value: Any) -> str | None:
    if key == "seed" and value is None:
        return None
    if key in _WORKER_LISTS:
        ok = isinstance(value, list) and all(isinstance(item, str) and _WORKER_ENTRY.match(item) for item in value)
        return None if ok else f"{key} must be a list of NODE/WORKER entries (e.g. my-slice/1)"
    if key in _LISTS:
        ok = isinstance(value, list) and all(isinstance(item, str) for item in value)
        return None if ok else f"{key} must be a list of strings"
    if key == "hold_queued":
        return None if isinstance(value, bool) else "hold_queued must be true or false"
    whole = key in _INTEGERS
    if (isinstance(value, bool) or not isinstance(value, int if whole else (int, float))
            or (isinstance(value, float) and not math.isfinite(value))):  # an int of any size is finite
        return f"{key} = {_shown(value)} is not {'a whole' if whole else 'a finite'} number"
    if key == "error_code":
        return None if value in INJECTABLE else f"error_code must be one of {sorted(INJECTABLE)}, not {value}"
    low, high = LIMITS[key]
    return None if low <= value <= high else f"{key} = {_shown(value)} is outside [{low:g}, {high:g}]"


def _shown(value: Any) -> str:
    """``value`` for a message: a huge integer by its size (its digits would not fit one line, nor ``repr``)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    return repr(value)
