"""An elastic run end to end: ``tpuops train`` of ``accelerator: [v2-32, v2-8]`` on the emulator, real TF 2.9.

The emulator's catalog offers v2-32 only in us-central1-a and v2-8 only in us-central1-b (FACTS.md), so a
stockout of us-central1-a stocks out the larger size everywhere and leaves the smaller one. The run starts on
v2-8; once it has saved a checkpoint there it is preempted and recovers on v2-8 (v2-32 still out), then the
stockout ends, the run's next probe finds v2-32 and the run moves
up through a checkpoint, finishes there, and leaves no node (neither its own nor a probe's). What is asserted is
the control plane's behaviour (sizes, events, counters, nodes, the ledger against the emulator's billing) and
that the agent kept the one global batch on both sizes (on v2-8's one emulated replica four times the
micro-batches a step of v2-32's four); the weights' equality across sizes is the agent lane's
(``tests/agent/test_elastic.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from helpers import cli_env, digits_project, poll, run_dir, run_status, small_digits, start_cli, start_tf_emulator

from tpuops.billing.cost import catalog_for, node_cost
from tpuops.billing.ledger import Ledger
from tpuops.config import Settings
from tpuops.core.clock import UTC
from tpuops.emulator.control import AdminClient, EmulatorInfo, stop

pytestmark = [pytest.mark.emulator, pytest.mark.tf, pytest.mark.slow]

BIG_ZONE, SMALL_ZONE = "us-central1-a", "us-central1-b"
STEPS = 3000
RUN = "elastic"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, EmulatorInfo]]:
    work = tmp_path_factory.mktemp("elastic")
    text = small_digits(digits_project(work), steps=STEPS).replace(
        "target:\n  metric: accuracy\n  at_least: 0.95\n", "").replace("eval:\n  every_steps: 20\n",
                                                                        "eval:\n  every_steps: 1500\n")
    (work / "experiments" / "elastic.yaml").write_text(
        text.replace("per_replica: 32", "per_replica: 8")
        .replace("accelerator: v3-8", "accelerator: [v2-32, v2-8]\nelastic:\n  probe_every: 2s"))
    info = start_tf_emulator(work / "home" / "emulator", grace_s=20.0)
    yield work, info
    stop(info.state_dir)


def _events(work: Path, run: str) -> list[dict]:
    path = run_dir(work, run) / "memory.json"
    return json.loads(path.read_text())["events"] if path.exists() else []


def test_a_run_starts_small_when_the_large_size_is_out_and_moves_up_when_it_returns(
    world: tuple[Path, EmulatorInfo],
) -> None:
    work, info = world
    admin = AdminClient(info.endpoint)
    admin.set_faults(stockout_zones=[BIG_ZONE])
    env = cli_env(work, info, 'zones = ["us-central1-a", "us-central1-b"]\nstockout_backoff_s = 1\n')
    proc = start_cli(work, info, "train", "experiments/elastic.yaml", "--name", RUN, "--json", env=env)
    poll(lambda: (run_status(work, RUN).get("last_checkpoint_step") or 0) >= 20 or proc.poll() is not None,
         "a checkpoint on the smaller size", timeout_s=600)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    kinds = [event["kind"] for event in _events(work, RUN)]
    assert "size-down" in kinds and "moved-up" not in kinds, kinds
    saved = run_status(work, RUN)["last_checkpoint_step"]
    admin.preempt("tpuops-local", SMALL_ZONE, RUN, grace_s=20.0)  # preempted on the smaller size: recreated there

    def trained_again() -> bool:
        status = run_status(work, RUN)
        return status.get("attempt") == 2 and status["step"] > (status.get("resumed_from_step") or 0) + 20

    poll(lambda: trained_again() or proc.poll() is not None, "the run training again on v2-8 after its preemption",
         timeout_s=600)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    small = run_status(work, RUN)
    trained = small["step"]
    # the global batch frozen for v2-32, kept on v2-8's one emulated replica by accumulating micro-batches
    assert small["replicas"] == 1 and small["accumulation"] > 1, small
    assert small["examples_seen"] == small["step"] * small["global_batch"], small
    admin.set_faults(stockout_zones=[])  # the larger size returns

    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out)
    assert (result["exit_class"], result["step"], result["preemptions"]) == ("succeeded", STEPS, 1)
    events = _events(work, RUN)
    kinds = [event["kind"] for event in events]
    assert kinds.count("moved-up") == 1 and kinds.count("preempted") == 1 and "crash" not in kinds, kinds
    assert kinds.index("preempted") < kinds.index("moved-up"), kinds
    memory = json.loads((run_dir(work, RUN) / "memory.json").read_text())
    assert (memory["moves"], memory["preemptions"], memory["crashes"], memory["size"]) == (1, 1, 0, 0)
    creates = [event["message"] for event in events if event["kind"] == "create"]
    assert sum(" of v2-8 in us-central1-b" in message for message in creates) == 2, creates  # first, recovery
    assert creates[-1].split(":")[0].endswith(f"of v2-32 in {BIG_ZONE}"), creates
    status = run_status(work, RUN)
    assert saved < trained <= status["resumed_from_step"] < STEPS, status  # moved mid-run, saved on the 2nd v2-8
    assert status["attempts"][-1]["productive_s"] > 0, status["attempts"]  # and trained on v2-32
    assert status["global_batch"] == small["global_batch"] and status["replicas"] == 4, status
    # the same micro-batch per replica on both sizes: 4 times the replicas, a quarter of the micro-batches
    assert status["accumulation"] * status["replicas"] == small["accumulation"] * small["replicas"], status

    billed = admin.billing()
    sizes = {interval["accelerator_type"] for interval in billed if interval["node"].endswith(f"/nodes/{RUN}")}
    assert sizes == {"v2-8", "v2-32"}, billed
    poll(lambda: not [n for n in admin.nodes() if f"/nodes/{RUN}" in n.get("name", "")],
         "no node of the run or of its probes left", timeout_s=120)

    settings = Settings()
    catalog, now = catalog_for(settings), datetime.now(UTC)
    ledger = Ledger(work / "home" / "ledger.sqlite")
    ours = sum(node_cost(history, catalog, now).usd for history in ledger.histories("tpuops-local", run_id=RUN))
    truth = sum(interval["billed_seconds"] / 3600 * catalog.price_per_hour(
        interval["accelerator_type"], interval["capacity"], interval["zone"])
        for interval in admin.billing() if interval["node"].endswith(f"/nodes/{RUN}"))
    assert truth > 0 and abs(ours - truth) <= 0.01 * truth, (ours, truth)
    shown = subprocess.run([sys.executable, "-m", "tpuops", "events", RUN], cwd=work, env=env, capture_output=True,
                           text=True, timeout=120, check=False)
    assert "of v2-8 in" in shown.stdout and "moved-up" in shown.stdout, shown.stdout + shown.stderr
