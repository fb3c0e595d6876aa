"""How values people type and read are parsed and printed: byte sizes, dollars, sweep parameters, JSON.

Sizes as people write them: ``100MB`` (10^8), ``1GiB`` (2^30), ``512k``, ``4096``. Pure functions
of the standard library and ``tpuops.core.errors``, so that the library and the CLI print one way.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from tpuops.core.errors import UsageError

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes in ``text``. Decimal units (KB, MB, GB, TB, and bare K/M/G/T) are powers of 1000;
    binary units (KiB, MiB, GiB, TiB) powers of 1024. Case does not matter.

    Raises:
        UsageError: not a positive size.
    """
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise UsageError(f"{text!r} is not a size (expected e.g. '100MB', '1GiB' or a number of bytes)")
    size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise UsageError(f"{text!r}: a size must be positive")
    return size


def format_size(size: int) -> str:
    """A short human-readable size with decimal units (``1.5 GB``), matching how ``parse_size`` reads them."""
    units = ("B", "KB", "MB", "GB", "TB")
    value, index = float(size), 0
    while value >= 1000 and index < len(units) - 1:
        value /= 1000
        index += 1
    return f"{size} B" if index == 0 else f"{value:.1f} {units[index]}"


def format_amount(value: float) -> str:
    """A non-negative amount (dollars, hours) to read: two decimals, or two significant digits below
    0.01, so that a small amount that is not zero never prints as ``0.00``."""
    return f"{value:,.2f}" if value >= 0.01 or value == 0 else f"{value:.2g}"


def format_seconds(value: float, digits: int = 1) -> str:
    """A figure with ``digits`` decimals, never ``-0.0``: a difference of sums that lands a hair below zero
    (the goodput split's unaccounted seconds) reads as 0, not as a negative nobody can explain."""
    text = f"{value:.{digits}f}"
    return text.lstrip("-") if float(text) == 0 else text


def format_utc(epoch_s: float) -> str:
    """A moment as UTC wall time to the second (``2026-12-05 19:36:31``): how tables show when something happened."""
    from datetime import datetime

    from tpuops.core.clock import UTC

    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M:%S")


def format_usd(value: float) -> str:
    """Dollars as people read them: cents, or two significant digits below a cent (a short spot run)."""
    return f"${format_amount(value)}"


def format_params(params: Mapping[str, Any]) -> str:
    """A trial's parameters on one line, sorted by name: ``lr=0.001, units=64``."""
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(params.items()))


NON_FINITE = "non_finite"
"""The key under which an object printed as JSON lists its keys whose values were NaN or infinite (``strict_json``)."""


def strict_json(value: Any) -> Any:
    """``value`` (parsed JSON: dicts, lists, scalars) made printable as strict JSON, whatever a run reported.

    JSON has no NaN or infinity, and a diverged run's metrics hold them: each becomes ``null``, and
    the object holding it (directly, or in a list under one of its keys) lists those keys, sorted,
    under ``NON_FINITE``, so that a null that was a NaN is told from one that was never there.
    Other values are returned as they are (not copied unless they hold a non-finite number).
    """
    return _strict(value)[0]


def _strict(value: Any) -> tuple[Any, bool]:
    """(the strict form of ``value``, whether it held a non-finite number that its parent object must name)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None, True
    if isinstance(value, dict):
        cleaned, named = {}, []
        for key, item in value.items():
            cleaned[key], found = _strict(item)
            if found:
                named.append(str(key))
        if named:
            cleaned[NON_FINITE] = sorted(named)
        return cleaned, False
    if isinstance(value, list | tuple):
        parts = [_strict(item) for item in value]
        return [part for part, _ in parts], any(found for _, found in parts)
    return value, False
