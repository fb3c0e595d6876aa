"""The ``tpuops`` command line.

Typer renders help through rich when it can, which costs more start-up time (rich's markdown
stack) than the whole command: plain help keeps ``tpuops --help`` and every command fast.
Our own tables and spinners still use rich, imported when a command prints one.

May import: Typer, rich, and from tpuops only the front door (``tpuops.api``), the settings it is
called with (``tpuops.config``) and the shared vocabulary (``tpuops.core``: errors, formats, enums, names).
A command is a flag parser over one ``tpuops.api`` call and a renderer of its result; anything it would
need from further down belongs in the front door. Nothing else in tpuops imports it but ``tpuops/__main__.py``.
"""

import os

os.environ.setdefault("TYPER_USE_RICH", "0")
