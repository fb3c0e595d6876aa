"""An elastic run end to end: ``tpuops train`` of ``accelerator: [v2-32, v2-8]`` on the emulator, real TF 2.9.

The emulator's catalog offers v2-32 only in us-central1-a and v2-8 only in us-central1-b (FACTS.md), so a
stockout of us-central1-a stocks out the larger size everywhere and leaves the smaller one. The run starts on
v2-8; once it has saved a checkpoint there it is preempted and recovers on v2-8 (v2-32 still out), then the
stockout ends, the run's next probe finds v2-32 and the run moves up through a checkpoint; once it has saved a
checkpoint on v2-32 it is preempted again, recovers on v2-32, finishes there, and leaves no node (neither its own
nor a probe's). The first test asserts the control plane's behaviour (sizes, events, counters, nodes, the ledger
against the emulator's billing) and that the agent kept the one global batch on both sizes (on v2-8's one
emulated replica four times the micro-batches a step of v2-32's four takes).

The second compares what the elastic run trained with what the same experiment trains on v2-32 alone (same
seed, same data, no fault): the final checkpoint (``runs/<run>/ckpt/ckpt-<steps>`` in the run's store folder:
every weight, Adam's slots and step, the data position; the SavedModel in ``model/`` is made from the same
weights) and the evaluation losses at every evaluated step (status ``evals``).

The model is smooth (``SMOOTH``: tanh, no ReLU, no max-pool). The digits CNN is not, and does not compare: a
ReLU whose input is within rounding of 0, or a max-pool window whose two largest values are, takes its
subgradient by the rounding; measured on the agent alone (1 against 4 replicas, same batches), the CNN's
weights agree to 1e-7 for 46 steps, then at step 47 its convolutions' gradients jump by 1e-4 while its dense
layers' stay within an ulp (a kink flipped, the same examples and updates), and the runs follow two equally
valid paths from there (0.15 apart after 600 steps). No bound from the sum order holds across a flip; for
the smooth model one does, and it is what is asserted.

Tolerance (``RTOL``, ``ATOL``), from the sum order alone: a step's gradient is the sum of 32 micro-batch
gradients of 8 records each (global batch 256), added one after another on v2-8's one replica and as 4
replicas' sums of 8 on v2-32; a micro-batch's own gradient is computed by the same kernels on the same 8
records on both (op determinism is on), so only the re-association of 32 float32 terms differs: at most 31
roundings of u = 2**-24, 1.8e-6 of the terms' magnitude. Adam's update m / (sqrt(v) + eps) does not depend on
the gradient's scale, so its relative error is at most about twice that, 4e-6 of a step no larger than about
the learning rate (3e-3): 1.2e-8 a weight a step, 1.4e-5 over 1,200 steps added linearly (``ATOL`` 2e-5);
each stored weight may also round differently once a step, 1,200 x 6e-8 = 7.2e-5 of it (``RTOL`` 1e-4).
Feeding back through the next gradients does not grow it on a smooth loss at this learning rate (measured on
the agent alone, 1 against 4 replicas: 3e-7 at most after 600 steps). An evaluation loss (about 0.05) moves
by the eval gradient times the weights' gap: with that gradient's L1 norm O(1), by at most 2e-5, 4e-4 of it
(``EVAL_RTOL`` 5e-4; measured 3e-7). One update on a wrong batch moves the weights by about the learning
rate, 3e-3: 150 times ``ATOL``, so a data position off by one micro-batch, a second update per step or a
gradient scaled by the accumulation would fail it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    COMPARE_CHECKPOINTS,
    TF_PYTHON,
    cli_env,
    digits_project,
    poll,
    run_dir,
    run_status,
    small_digits,
    start_cli,
    start_tf_emulator,
)

from tpuops.billing.cost import catalog_for, node_cost
from tpuops.billing.ledger import Ledger
from tpuops.config import Settings
from tpuops.core.clock import UTC
from tpuops.emulator.control import AdminClient, EmulatorInfo, stop

pytestmark = [pytest.mark.emulator, pytest.mark.tf, pytest.mark.slow]

PROJECT, BIG_ZONE, SMALL_ZONE = "tpuops-local", "us-central1-a", "us-central1-b"
STEPS = 1200  # v2-8 trains the smooth model ~15 times faster than v2-32: room for the seconds a move takes
EVERY = 400
RUN, REFERENCE = "elastic", "reference"
RTOL, ATOL, EVAL_RTOL = 1e-4, 2e-5, 5e-4
# A preemption's grace: the notice's save must land in it for the test's story (a notice before each PREEMPTED).
# The emulated v2-32's four workers share two cores with the other lane's tests: the call in flight and the save
# took more than 20 s in a loaded CI run. The grace ends once the node's processes have (the emulator), so a
# long one costs nothing when the agent is quick.
GRACE_S = 90.0
SMOOTH = """
import tensorflow as tf


def digits_tanh(hparams):
    \"\"\"8x8 digits through one tanh layer: differentiable everywhere, unlike the CNN's ReLUs and max-pool.\"\"\"
    return tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(8, 8, 1)),
        tf.keras.layers.Rescaling(1 / 16),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(int(hparams.get("dense", 64)), activation="tanh"),
        tf.keras.layers.Dense(10, activation="softmax", dtype="float32"),
    ])
"""
CONFIG = 'zones = ["us-central1-a", "us-central1-b"]\nstockout_backoff_s = 1\n'


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, EmulatorInfo]]:
    work = tmp_path_factory.mktemp("elastic")
    text = small_digits(digits_project(work), steps=STEPS).replace(
        "target:\n  metric: accuracy\n  at_least: 0.95\n", "").replace("eval:\n  every_steps: 20\n",
                                                                        f"eval:\n  every_steps: {EVERY}\n")
    (work / "experiments" / "smooth.py").write_text(SMOOTH)
    (work / "experiments" / "elastic.yaml").write_text(
        text.replace("per_replica: 32", "per_replica: 8")
        .replace("model: models:digits_cnn", "model: smooth:digits_tanh")
        .replace("accelerator: v3-8", "accelerator: [v2-32, v2-8]\nelastic:\n  probe_every: 2s"))
    info = start_tf_emulator(work / "home" / "emulator", grace_s=20.0)
    yield work, info
    stop(info.state_dir)


def _events(work: Path, run: str) -> list[dict]:
    path = run_dir(work, run) / "memory.json"
    return json.loads(path.read_text())["events"] if path.exists() else []


def _while_running(proc: subprocess.Popen[str], check: Callable[[], bool], what: str) -> None:
    """Poll ``check`` until it holds, failing with the CLI's stderr if the run's ``train`` ends first (or, if the
    check fails, ending the CLI: a fixture's failure leaves no process behind)."""
    try:
        poll(lambda: check() or proc.poll() is not None, what, timeout_s=600)
    except BaseException:
        proc.kill()
        raise
    assert proc.poll() is None, proc.communicate()[1][-3000:]


def _finished(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The ``train --json`` result of a run that must succeed."""
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out)


@dataclass
class Elastic:
    """What the elastic run's test saw on the way, for the assertions after its end."""

    result: dict[str, Any]
    saved: int  # the first checkpoint on v2-8, when the first preemption came
    small: dict[str, Any]  # the status on v2-8 when the stockout ended
    big: dict[str, Any]  # the status on v2-32, when the second preemption came
    env: dict[str, str]


@pytest.fixture(scope="module")
def elastic(world: tuple[Path, EmulatorInfo]) -> Elastic:
    """The elastic run driven through its story (module docstring): started under a stockout of v2-32, preempted
    on v2-8, moved up when the stockout ends, preempted on v2-32, finished."""
    work, info = world
    admin = AdminClient(info.endpoint)
    admin.set_faults(stockout_zones=[BIG_ZONE])
    env = cli_env(work, info, CONFIG)
    proc = start_cli(work, info, "train", "experiments/elastic.yaml", "--name", RUN, "--json", env=env)
    _while_running(proc, lambda: (run_status(work, RUN).get("last_checkpoint_step") or 0) >= 20,
                   "a checkpoint on the smaller size")
    kinds = [event["kind"] for event in _events(work, RUN)]
    assert "size-down" in kinds and "moved-up" not in kinds, kinds
    saved = run_status(work, RUN)["last_checkpoint_step"]
    admin.preempt(PROJECT, SMALL_ZONE, RUN, grace_s=GRACE_S)  # preempted on the smaller size: recreated there

    def trained_again() -> bool:
        status = run_status(work, RUN)
        return status.get("attempt") == 2 and status["step"] > (status.get("resumed_from_step") or 0)

    _while_running(proc, trained_again, "the run training again on v2-8 after its preemption")
    small = run_status(work, RUN)
    admin.set_faults(stockout_zones=[])  # the larger size returns

    def saved_on_the_larger_size() -> bool:
        status = run_status(work, RUN)
        resumed = status.get("resumed_from_step")
        return status.get("replicas") == 4 and resumed is not None and (status["last_checkpoint_step"] or 0) > resumed

    _while_running(proc, saved_on_the_larger_size, "a checkpoint on v2-32 after the move")
    big = run_status(work, RUN)
    admin.preempt(PROJECT, BIG_ZONE, RUN, grace_s=GRACE_S)  # preempted again on the larger size: recreated there
    return Elastic(_finished(proc), saved, small, big, env)


def test_a_run_starts_small_when_the_large_size_is_out_moves_up_when_it_returns_and_survives_preemptions(
    world: tuple[Path, EmulatorInfo], elastic: Elastic,
) -> None:
    work, info = world
    admin = AdminClient(info.endpoint)
    assert (elastic.result["exit_class"], elastic.result["step"], elastic.result["preemptions"]) == (
        "succeeded", STEPS, 2)
    events = _events(work, RUN)
    kinds = [event["kind"] for event in events]
    assert kinds.count("moved-up") == 1 and kinds.count("preempted") == 2 and "crash" not in kinds, kinds
    first = kinds.index("preempted")
    assert first < kinds.index("moved-up") < kinds.index("preempted", first + 1), kinds
    memory = json.loads((run_dir(work, RUN) / "memory.json").read_text())
    assert (memory["moves"], memory["preemptions"], memory["crashes"], memory["size"]) == (1, 2, 0, 0)
    notices = [event["message"].split(" on ", 1)[1] for event in events if event["kind"] == "notice"]
    assert notices == ["a preemption notice", "the notice of a planned move to a larger size",
                       "a preemption notice"], notices  # what each save was for, the last one read before PREEMPTED
    sizes = [event["message"].split(":")[0].split(" of ")[1] for event in events if event["kind"] == "create"]
    # the first node and its recovery on v2-8 (after creates of v2-32 the stockout refused); then the move and
    # the second recovery on v2-32
    assert sizes.count(f"v2-8 in {SMALL_ZONE}") == 2 and sizes[-3:] == [
        f"v2-8 in {SMALL_ZONE}", f"v2-32 in {BIG_ZONE}", f"v2-32 in {BIG_ZONE}"], sizes
    small, big, status = elastic.small, elastic.big, run_status(work, RUN)
    # the global batch frozen for v2-32, kept on v2-8's one emulated replica by accumulating micro-batches
    assert small["replicas"] == 1 and small["accumulation"] > 1, small
    assert small["examples_seen"] == small["step"] * small["global_batch"], small
    # moved mid-run from a save on the second v2-8, saved on v2-32, resumed there from a save at or after it
    assert elastic.saved < small["step"] <= big["resumed_from_step"] < big["last_checkpoint_step"], (small, big)
    assert big["last_checkpoint_step"] <= status["resumed_from_step"] < STEPS, status
    assert status["attempt"] == 4 and status["attempts"][-1]["productive_s"] > 0, status["attempts"]
    assert status["global_batch"] == small["global_batch"] and status["replicas"] == 4, status
    assert status["examples_seen"] == STEPS * status["global_batch"], status
    # the same micro-batch per replica on both sizes: 4 times the replicas, a quarter of the micro-batches
    assert status["accumulation"] * status["replicas"] == small["accumulation"] * small["replicas"], status

    billed = [interval for interval in admin.billing() if interval["node"].endswith(f"/nodes/{RUN}")]
    assert {interval["accelerator_type"] for interval in billed} == {"v2-8", "v2-32"}, billed
    poll(lambda: not [n for n in admin.nodes() if f"/nodes/{RUN}" in n.get("name", "")],
         "no node of the run or of its probes left", timeout_s=120)
    settings = Settings()
    catalog, now = catalog_for(settings), datetime.now(UTC)
    ledger = Ledger(work / "home" / "ledger.sqlite")
    ours = sum(node_cost(history, catalog, now).usd for history in ledger.histories(PROJECT, run_id=RUN))
    truth = sum(interval["billed_seconds"] / 3600 * catalog.price_per_hour(
        interval["accelerator_type"], interval["capacity"], interval["zone"])
        for interval in admin.billing()  # its probes' READY is the run's own cost, in the ledger as in the cloud
        if interval["node"].endswith((f"/nodes/{RUN}", f"/nodes/{RUN}-up")))
    assert truth > 0 and abs(ours - truth) <= 0.01 * truth, (ours, truth)
    shown = subprocess.run([sys.executable, "-m", "tpuops", "events", RUN], cwd=work, env=elastic.env,
                           capture_output=True, text=True, timeout=120, check=False)
    assert "of v2-8 in" in shown.stdout and "moved-up" in shown.stdout, shown.stdout + shown.stderr


def _evals(work: Path, run: str) -> dict[int, float]:
    """The run's evaluation losses by step (a step evaluated again after a resume keeps its last)."""
    return {entry["step"]: entry["metrics"]["loss"] for entry in run_status(work, run)["evals"]}


def test_the_elastic_run_trains_what_the_same_experiment_trains_on_the_larger_size_alone(
    world: tuple[Path, EmulatorInfo], elastic: Elastic,
) -> None:
    work, info = world
    proc = start_cli(work, info, "train", "experiments/elastic.yaml", "--name", REFERENCE, "--json",
                     env=cli_env(work, info, CONFIG))
    reference = _finished(proc)
    assert (reference["exit_class"], reference["step"], reference["preemptions"]) == ("succeeded", STEPS, 0)
    creates = [event["message"] for event in _events(work, REFERENCE) if event["kind"] == "create"]
    assert len(creates) == 1 and f"of v2-32 in {BIG_ZONE}" in creates[0], creates
    assert run_status(work, REFERENCE)["accumulation"] == elastic.big["accumulation"]

    prefixes = [str(run_dir(work, run) / "ckpt" / f"ckpt-{STEPS}") for run in (RUN, REFERENCE)]
    compared = subprocess.run([str(TF_PYTHON), "-c", COMPARE_CHECKPOINTS, *prefixes, str(RTOL), str(ATOL)],
                              capture_output=True, text=True, timeout=300, check=False)
    print(compared.stdout)  # how far apart they are, for the record
    assert compared.returncode == 0, compared.stdout + compared.stderr
    ours, theirs = _evals(work, RUN), _evals(work, REFERENCE)
    assert sorted(ours) == sorted(theirs) == list(range(EVERY, STEPS + 1, EVERY)), (ours, theirs)
    assert all(abs(ours[step] - theirs[step]) <= EVAL_RTOL * abs(theirs[step]) for step in ours), (ours, theirs)
    # the tolerance is not loose enough to hide training: the loss moved far beyond it from the first evaluation
    assert abs(theirs[STEPS] - theirs[EVERY]) > 100 * EVAL_RTOL * abs(theirs[STEPS]), theirs
