"""How values people type and read are parsed and printed: byte sizes, dollars, sweep parameters.

Sizes as people write them: ``100MB`` (10^8), ``1GiB`` (2^30), ``512k``, ``4096``. Pure functions
of the standard library and ``tpuops.errors``, so that the library and the CLI print one way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tpuops.errors import UsageError

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


def format_usd(value: float) -> str:
    """Dollars as people read them: cents, or two significant digits below a cent (a short spot run)."""
    return f"${format_amount(value)}"


def format_params(params: Mapping[str, Any]) -> str:
    """A trial's parameters on one line, sorted by name: ``lr=0.001, units=64``."""
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(params.items()))
