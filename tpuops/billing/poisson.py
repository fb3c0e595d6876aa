"""The exact (Garwood) confidence interval of a Poisson rate, in pure Python.

k events in an exposure of T (hours, say): the rate's two-sided interval at confidence 1 - alpha
is [G(alpha/2; k) / T, G(1 - alpha/2; k + 1) / T], where G(p; a) is the p-quantile of the Gamma
distribution of shape a and scale 1 (and the lower end is 0 when k = 0). It holds its coverage
for any k, small counts included, which is what a ledger with a handful of preemptions has.

The Gamma quantile inverts the regularized lower incomplete gamma function P(a, x) by bisection;
P is the power series below x = a + 1 and the continued fraction (modified Lentz) above it, the
textbook split at which both converge fast. No scipy: the control plane does not depend on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

_EPS = 1e-15
_TINY = 1e-300
_MAX_TERMS = 10_000


def _lower_series(a: float, x: float) -> float:
    term = total = 1.0 / a
    shape = a
    for _ in range(_MAX_TERMS):
        shape += 1.0
        term *= x / shape
        total += term
        if abs(term) < abs(total) * _EPS:
            break
    return total * math.exp(-x + a * math.log(x) - math.lgamma(a))


def _upper_fraction(a: float, x: float) -> float:
    b = x + 1.0 - a
    c = 1.0 / _TINY
    d = 1.0 / b
    h = d
    for i in range(1, _MAX_TERMS):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = _TINY if abs(d) < _TINY else d
        c = b + an / c
        c = _TINY if abs(c) < _TINY else c
        d = 1.0 / d
        step = d * c
        h *= step
        if abs(step - 1.0) < _EPS:
            break
    return math.exp(-x + a * math.log(x) - math.lgamma(a)) * h


def gamma_cdf(a: float, x: float) -> float:
    """P(a, x): the probability that a Gamma(shape ``a``, scale 1) variable is at most ``x``."""
    if a <= 0:
        raise ValueError(f"gamma shape must be positive, got {a}")
    if x <= 0:
        return 0.0
    if x < a + 1.0:
        return _lower_series(a, x)
    return 1.0 - _upper_fraction(a, x)


def gamma_quantile(p: float, a: float) -> float:
    """The ``p``-quantile of Gamma(shape ``a``, scale 1), to about 1e-12 relative."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"a quantile needs 0 < p < 1, got {p}")
    low, high = 0.0, max(1.0, 2.0 * a)
    while gamma_cdf(a, high) < p:
        low, high = high, 2.0 * high
    for _ in range(200):
        middle = (low + high) / 2.0
        if gamma_cdf(a, middle) < p:
            low = middle
        else:
            high = middle
        if high - low <= 1e-12 * high:
            break
    return (low + high) / 2.0


@dataclass(frozen=True)
class RateInterval:
    """A Poisson rate per unit of exposure, with its exact two-sided interval."""

    events: int
    exposure: float
    rate: float
    low: float
    high: float
    confidence: float


def rate_interval(events: int, exposure: float, confidence: float = 0.95) -> RateInterval:
    """The rate ``events / exposure`` with its exact (Garwood) interval at ``confidence``.

    Raises:
        ValueError: a negative count, an exposure that is not positive, or a confidence outside (0, 1).
    """
    if events < 0:
        raise ValueError(f"an event count must not be negative, got {events}")
    if exposure <= 0:
        raise ValueError(f"a rate needs a positive exposure, got {exposure}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be within (0, 1), got {confidence}")
    tail = (1.0 - confidence) / 2.0
    low = 0.0 if events == 0 else gamma_quantile(tail, events) / exposure
    high = gamma_quantile(1.0 - tail, events + 1) / exposure
    return RateInterval(events, exposure, events / exposure, low, high, confidence)
