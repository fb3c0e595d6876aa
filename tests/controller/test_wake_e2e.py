"""The wake-up end to end: a preempted agent's marker brings ``tpuops watch`` back long before its next pass.

The run is the digits CNN made small, launched with ``train --detach``; ``api.watch`` runs in a
thread with a one-hour interval, so a recovery within the test's deadline can only come from the
wake marker the real agent (TF 2.9) writes after its save on the notice. No timing is asserted:
what the marker causes (the replacement, the run's end) is.
"""

from __future__ import annotations

import pytest
from helpers import TfWorld, poll, tf_world, watching

from tpuops import runs
from tpuops.runs import layout

pytestmark = [pytest.mark.emulator, pytest.mark.tf, pytest.mark.slow]

PROJECT = "tpuops-local"
ZONE = "us-central1-a"


def _wake(source: str) -> dict[str, str]:
    for old, new in (("name: digits-cnn", "name: wake"), ("steps: 600", "steps: 1000"),
                     ("every_steps: 100", "every_steps: 500")):
        assert old in source, old
        source = source.replace(old, new)
    return {"wake.yaml": source}


world = tf_world("wake", _wake, config=f'zones = ["{ZONE}"]\n')


def test_watch_wakes_on_the_marker_and_recovers_before_its_next_pass(world: TfWorld) -> None:
    run = "woken"
    done = world.tpuops("train", str(world.work / "experiments" / "wake.yaml"), "--name", run, "--detach", "--json")
    assert done.returncode == 0, done.stderr
    with watching(world.settings, 3600.0) as failure:
        status = poll(lambda: (s := runs.read_status(world.store, run)) and s.step >= 60 and s.exit_class is None
                      and s, "the agent training past step 60", timeout_s=150, interval_s=0.1)
        world.admin.preempt(PROJECT, ZONE, run, grace_s=60.0)  # the agent saves long before, even under load
        marker = poll(lambda: world.store.exists(layout.wake_key(run)) or runs.load_memory(world.store, run)[0]
                      .preemptions, "the wake marker (or the recovery it caused)", timeout_s=60)
        assert marker
        final = poll(lambda: (s := runs.read_status(world.store, run)) and s.exit_class == "succeeded" and s,
                     "the second attempt's success", timeout_s=240, interval_s=0.2)
        assert not failure, failure
    assert final.step == 1000 and final.attempt == 2
    assert final.resumed_from_step is not None and final.resumed_from_step >= status.step, "resumed from the notice"
    memory = runs.load_memory(world.store, run)[0]
    assert memory.preemptions == 1 and memory.attempts == 2, memory.events
    notice = next(e for e in memory.events if e["kind"] == "notice")
    create = [e for e in memory.events if e["kind"] == "create"][1]
    assert create["at"] >= notice["at"], "the replacement came after the agent's notice"
    assert not world.store.list(layout.WAKE), "the controller deletes the marker it hurried for"
    logs = "".join(world.store.read_bytes(o.key).decode() for o in world.store.list(layout.logs_prefix(run)))
    assert "wake marker written" in logs
