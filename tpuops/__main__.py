"""The ``tpuops`` program (the console script and ``python -m tpuops``): the command line with the web app beside it.

The CLI (``tpuops.cli``) and the dashboard (``tpuops.dashboard``) both stand on the front door,
``tpuops.api``, and neither imports the other: this entry composes them, giving the CLI's
``dashboard`` command the server. The web stack is imported only when that command runs, so
``tpuops --help`` and every other command never pay for it.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tpuops.cli import dashboard as dashboard_command
from tpuops.cli import main as cli

if TYPE_CHECKING:
    from tpuops.config import Settings

app = cli.command_line()
"""The whole program: every command of ``tpuops.cli``, and ``tpuops dashboard``."""


def _serve_dashboard(settings: Settings, **options: Any) -> None:
    from tpuops.dashboard.serve import dashboard

    dashboard(settings, **options)


dashboard_command.register(app, _serve_dashboard)


def run(argv: Sequence[str] | None = None) -> int:
    """Run the program; return the exit code instead of raising (``tpuops.cli.main.run``)."""
    return cli.run(argv, program=app)


GC_THRESHOLDS = (200_000, 30, 30)
"""The cycle collector's pace for the program (mypy runs at the same): by default it looks every 700 new objects,
and a command creates a great many that live to its end (modules, models, 200 runs' documents), so ``tpuops
status`` spent a twentieth of its CPU time in collections that found next to nothing to free."""


def entry() -> None:
    gc.set_threshold(*GC_THRESHOLDS)
    sys.exit(run())


if __name__ == "__main__":
    entry()
