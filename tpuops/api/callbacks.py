"""How the front door reports progress: a callback given one line of text, and the one that drops it.

``progress`` arguments of ``tpuops.api`` take a ``Say`` (controller events, uploads); the CLI prints the
lines and the dashboard shows them, and a caller that wants none passes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

Say = Callable[[str], None]


def _quiet(_text: str) -> None:
    return None
