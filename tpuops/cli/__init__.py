"""The ``tpuops`` command line.

Typer renders help through rich when it can, which costs more start-up time (rich's markdown
stack) than the whole command: plain help keeps ``tpuops --help`` and every command fast.
Our own tables and spinners still use rich, imported when a command prints one.
"""

import os

os.environ.setdefault("TYPER_USE_RICH", "0")
