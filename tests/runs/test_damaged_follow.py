"""``tpuops train --follow`` past a garbled ``status.json`` (issue 30, item 7): the CLI, the emulator, real TF 2.9.

Before, the first pass that read a status the agent (or a user's script) had garbled made ``train --follow`` exit
2, and the run was left with no controller although the agent rewrote the file within seconds. Now a pass says
so, reads it again at the next one, and the follow goes on to the run's end. The test garbles the file until the
CLI has said it read it damaged (the agent keeps rewriting it), then asserts how the run ended.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import TfWorld, poll, small_digits, tf_world

from tpuops.emulator.control import AdminClient

pytestmark = [pytest.mark.emulator, pytest.mark.tf, pytest.mark.slow]

RUN = "garbled"
STEPS = 3000  # about 15 s of training with its evaluations and checkpoints: the garbling is read long before the end


world = tf_world("follow", lambda text: {"small.yaml": small_digits(text, steps=STEPS)}, grace_s=5.0,
                 scope="function")


def test_a_garbled_status_during_train_follow_is_read_again_and_the_run_succeeds(
        world: TfWorld) -> None:
    work, info = world.work, world.info
    config = work / "tpuops.toml"
    config.write_text('zones = ["us-central1-a"]\n')
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TPUOPS_")}, "TPUOPS_HOME": str(work / "home"),
           "TPUOPS_CONFIG": str(config), "TPUOPS_TPU_ENDPOINT": info.endpoint, "TPUOPS_POLL_INTERVAL_S": "0.2"}
    follow = subprocess.Popen([sys.executable, "-m", "tpuops", "train", "experiments/small.yaml", "--name", RUN,
                               "--follow"], cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    said: list[str] = []
    assert follow.stderr is not None
    reader = threading.Thread(target=lambda: said.extend(iter(follow.stderr.readline, "")), daemon=True)
    reader.start()
    status = work / "home" / "store" / "runs" / RUN / "status.json"
    try:
        poll(lambda: follow.poll() is not None or '"phase":"training"' in _text(status).replace(" ", ""),
             "the agent to train", timeout_s=300)

        def garbled_and_seen() -> bool:
            if follow.poll() is not None:
                return True
            status.write_bytes(b'{"phase": "train')  # as a write cut short, or a user's script, leaves it
            return any("status.json is damaged" in line for line in said)

        poll(garbled_and_seen, "a pass to read the garbled status", timeout_s=120, interval_s=0.1)
        assert follow.poll() is None, "".join(said)
        follow.wait(timeout=600)
    finally:
        if follow.poll() is None:
            follow.kill()
    reader.join(timeout=10)
    err = "".join(said)
    assert follow.returncode == 0, err
    assert f"{RUN}: succeeded at step {STEPS}" in err
    assert [n for n in AdminClient(info.endpoint).nodes() if n.get("name", "").endswith(f"/{RUN}")] == []


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except (FileNotFoundError, UnicodeDecodeError):
        return ""
