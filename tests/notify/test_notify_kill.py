"""A reconcile pass SIGKILLed while its notice is in the receiver's hands: the next pass sends it, once more only.

Real processes on the emulator: ``tpuops reconcile`` as a subprocess drives a run whose node runs a startup
script that exits at once (the agent's final status is written by the test). The receiver holds the
notice's request, read in full, so the test kills the pass at a known line: after the decision and its
write-ahead (the memory in the store already holds the notice, pending) and before the pass saw an answer.
The next pass that takes the run's lease (the killed one's expires after ``lease_ttl_s``) sends it again,
with the same idempotency key: the one duplicate docs/notifications.md allows. After that, no pass sends
anything. No secret (the webhook URL's path) is in any file the test produced or in any output.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import LIVE, cli_env, declare_run, poll, write_status
from receivers import SECRET_PATH, HttpReceiver, files_holding, http_receiver, target_toml

from tpuops import runs
from tpuops.config import load_settings
from tpuops.core.notices import State
from tpuops.emulator import control
from tpuops.store import open_store

pytestmark = pytest.mark.emulator

ZONE = "us-central1-b"
RUN = "run-kill"
QUICK_SCRIPT = "#!/bin/bash\nexit 0\n"
DONE = {**LIVE, "phase": "done", "exit_class": "succeeded", "step": 1000}


@pytest.fixture
def work(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str], HttpReceiver]]:
    info = control.start_background(tmp_path / "home" / "emulator", boot_delay_s=0.2, grace_s=2.0, timeout_s=30.0)
    try:
        with http_receiver() as hook:
            env = cli_env(tmp_path, info, f'zones = ["{ZONE}"]\nlease_ttl_s = 2.0\n'
                          + target_toml("hook", kind="webhook", url_env="HOOK_URL"))
            yield tmp_path, {**env, "HOOK_URL": hook.url}, hook
    finally:
        control.stop(info.state_dir)


def test_a_pass_killed_after_deciding_sends_once_more_on_the_next_pass_and_never_again(
        work: tuple[Path, dict[str, str], HttpReceiver]) -> None:
    root, env, hook = work
    settings = load_settings(config_path=Path(env["TPUOPS_CONFIG"]), environ=env)
    store = open_store(settings.store_root)
    declare_run(settings, store, RUN, ZONE, metadata={"startup-script": QUICK_SCRIPT}, experiment="kill")
    outputs: list[str] = []

    def reconcile() -> None:
        done = subprocess.run([sys.executable, "-m", "tpuops", "reconcile", "--no-wake"], env=env, cwd=root,
                              capture_output=True, text=True, timeout=300, check=False)
        outputs.extend((done.stdout, done.stderr))
        assert done.returncode == 0, done.stderr

    def memory() -> runs.Memory:
        return runs.load_memory(store, RUN)[0]

    poll(lambda: reconcile() or memory().ready_since is not None, "the run's node is READY", timeout_s=240)
    write_status(store, RUN, DONE)

    hook.hold()
    killed = subprocess.Popen([sys.executable, "-m", "tpuops", "reconcile", "--no-wake"], env=env, cwd=root,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    poll(hook.got_held.is_set, "the notice reaches the receiver, which holds it", timeout_s=240)
    written = memory().notices  # the write-ahead: decided and in the store before any answer
    assert [(n.kind.value, [d.state for d in n.deliveries]) for n in written] == [("succeeded", [State.PENDING])]
    killed.send_signal(signal.SIGKILL)
    outputs.extend(killed.communicate(timeout=60))
    assert killed.returncode == -signal.SIGKILL
    hook.release.set()

    poll(lambda: reconcile() or hook.delivered, "the next pass that takes the lease sends it", timeout_s=240)
    for _ in range(2):
        reconcile()
    assert len(hook.delivered) == 1
    assert [got.key for got in hook.held] == [got.key for got in hook.delivered] == [written[0].key]
    assert hook.delivered[0].body["idempotency_key"] == written[0].key
    assert [d.state for d in memory().notices[0].deliveries] == [State.SENT]
    assert runs.active_run_ids(store) == []
    assert files_holding(root, SECRET_PATH) == []
    assert not any(SECRET_PATH in text for text in outputs)
