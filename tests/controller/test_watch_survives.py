"""``tpuops watch`` outlives a pass that fails on a transient error, and ends on any other error.

A watch that exited because the store did not answer once (after its retries) would leave every node it
was recovering running and billed, unwatched; an error a retry cannot mend (credentials) must still end it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuops import api, runs
from tpuops.config import Settings
from tpuops.core.errors import PermissionDenied, TransientError
from tpuops.core.kinds import Cloud

pytestmark = pytest.mark.unit


def _settings(tmp_path: Path) -> Settings:
    return Settings(tpu_endpoint=Cloud.GCP, node_provider="memory", project="p", zones=["us-central1-a"],
                    home=tmp_path / "home", store=str(tmp_path / "store"))


def _failing_once(monkeypatch: pytest.MonkeyPatch, error: Exception) -> list[int]:
    """The run index's listing fails on the first pass, as a store not answering would; the count of calls."""
    real, calls = runs.active_index, []

    def listing(store: object) -> dict[str, int]:
        calls.append(1)
        if len(calls) == 1:
            raise error
        return real(store)

    monkeypatch.setattr(runs, "active_index", listing)
    return calls


def test_a_pass_failing_on_a_transient_error_is_said_and_the_watch_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _failing_once(monkeypatch, TransientError("the store did not answer (503)"))
    said: list[str] = []
    reported: list[int] = []
    made = api.watch(_settings(tmp_path), interval_s=30.0, passes=3, progress=said.append, wake=False,
                     sleep=lambda _s: None, on_pass=lambda done, _report: reported.append(done))
    assert made == 3 and len(calls) == 3 and reported == [2, 3]
    assert [line for line in said if "did not finish" in line] == [
        "pass 1 did not finish (the store did not answer (503)); the next one comes in 30 s"]


def test_an_error_no_retry_mends_ends_the_watch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _failing_once(monkeypatch, PermissionDenied("the credentials may not list objects (403)"))
    with pytest.raises(PermissionDenied):
        api.watch(_settings(tmp_path), interval_s=30.0, passes=3, wake=False, sleep=lambda _s: None)
    assert len(calls) == 1
