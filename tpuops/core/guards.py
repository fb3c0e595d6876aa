"""Named safety guards that only a test may turn off.

Each guard protects one invariant that the fault swarm checks after every pass. The module that enforces
the invariant declares its guard next to the one line that enforces it (``EVIDENCE_END = Guard(...)``) and
asks ``EVIDENCE_END.on`` there. A guard-off test wraps a swarm in ``with guards.off("name"):`` and shows
that the swarm then finds the violation: the proof that the invariant's checker can fail at all.

Invariants: every guard is on unless a test turned it off; nothing in the package turns one off; a name
is declared once (a second declaration is a programming error, raised at import); ``off`` refuses a name
nobody declared, so a renamed guard cannot leave a guard-off test quietly testing nothing.

May import: the standard library only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

_declared: dict[str, Guard] = {}
_off: set[str] = set()


class Guard:
    """One named safety check. ``on`` is what the enforcing line asks; it costs a set lookup."""

    __slots__ = ("name", "protects")

    def __init__(self, name: str, protects: str) -> None:
        if name in _declared:
            raise ValueError(f"guard {name!r} is declared twice")
        self.name = name
        self.protects = protects
        _declared[name] = self

    @property
    def on(self) -> bool:
        return self.name not in _off

    def __repr__(self) -> str:
        return f"Guard({self.name!r}, on={self.on})"


def declared() -> dict[str, str]:
    """Every declared guard's name and what it protects (for the swarm's summary and its docs)."""
    return {name: guard.protects for name, guard in sorted(_declared.items())}


@contextmanager
def off(*names: str) -> Iterator[None]:
    """Turn the named guards off for the block (tests only); the ones already off stay off after it."""
    unknown = sorted(set(names) - set(_declared))
    if unknown:
        raise KeyError(f"no guard named {', '.join(unknown)}; declared: {', '.join(sorted(_declared))}")
    added = set(names) - _off
    _off.update(added)
    try:
        yield
    finally:
        _off.difference_update(added)
