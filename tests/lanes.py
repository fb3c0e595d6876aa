"""Test lanes: every collected test carries a lane marker, or collection fails.

Its hook is imported by ``tests/conftest.py`` and ``tests/agent/conftest.py`` (``tests/`` is on
pytest's ``pythonpath``), so every pytest run of the repository checks it, including the agent's
tests under ``.venv-tf29``, and a new test cannot forget its lane. Lanes: ``unit`` (pure, fast,
no server, no TensorFlow; ``make unit``), ``emulator`` (starts a server of its own), ``tf`` (runs
TensorFlow 2.9); ``slow`` comes on top. ``unit`` excludes the other two, so ``-m unit`` never
starts a server. Runs on Python 3.8 too.
"""

from __future__ import annotations

import pytest

LANES = ("unit", "emulator", "tf")

LOCAL_AND_GCS = [pytest.param("local", marks=pytest.mark.unit), pytest.param("gcs", marks=pytest.mark.emulator)]
"""Params of a store fixture: the local store is a unit test, fake-gcs-server an emulator test."""


def _problem(item: pytest.Item) -> str | None:
    lanes = [lane for lane in LANES if item.get_closest_marker(lane) is not None]
    if not lanes:
        return f"{item.nodeid}: no lane marker (add pytestmark = pytest.mark.unit, .emulator or .tf)"
    if "unit" in lanes and len(lanes) > 1:
        return f"{item.nodeid}: marked unit and {' and '.join(lanes[1:])} (a unit test starts no server and no TF)"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    problems = [problem for problem in map(_problem, items) if problem]
    if problems:
        raise pytest.UsageError("tests without a lane:\n  " + "\n  ".join(problems))
