"""Elastic runs, the data plane: one global batch on any slice size, and resumes across sizes.

The agent's host presents 8 or 2 replicas (``TPUOPS_CPU_REPLICAS``: MirroredStrategy over logical
CPUs, a v2-8's cores and a quarter of them). With ``train.global_batch`` 64 and a per-replica batch
of 8, 8 replicas take a step at once and 2 replicas accumulate 4 micro-batches: the same examples
make the same updates, and only the order of the float sums differs.

The optimizer is SGD with momentum, whose update scales with the gradient: a gradient off by a
constant factor (a loss scaled wrongly over the micro-batches) shows, as it would not under Adam.

Tolerance (``RTOL``/``ATOL``): float32 rounds each addition by at most 2**-24 (6e-8) relative. A
step's gradient sums 64 per-example terms, in a tree of 8 x 8 on one side and 4 x (2 x 8) on the
other: re-associating n terms moves the sum by at most about n x 6e-8 = 4e-6 relative (typically
sqrt(n) x 6e-8 = 5e-7). The update is the learning rate times the momentum of those sums, so the
relative error carries into the weights, and 40 steps add it up at worst linearly: 40 x 4e-6 =
1.6e-4. So weights agree to rtol 2e-4; the absolute floor 1e-6 is for values near 0, where a
relative bound means nothing (the weights are O(0.1 .. 1)). A data position off by a single
example, or one update on another batch, moves the weights by the learning rate (5e-2) times a
gradient of O(0.1): well beyond it (the test checks that the weights do move that much).
"""

import json
from pathlib import Path
from typing import Any, Callable, Dict

import numpy as np
import pytest

from agentrun import CLASSES, FEATURES, AgentRun, final_tensors, run_agent

pytestmark = [pytest.mark.tf, pytest.mark.slow]

GLOBAL = 64
PER_REPLICA = 8
STEPS = 40
HALF = 20
RTOL, ATOL = 2e-4, 1e-6
HPARAMS = {"optimizer": "momentum", "learning_rate": 0.05, "momentum": 0.9, "hidden": 16, "features": FEATURES,
           "classes": CLASSES}


def _spec(make_spec: Callable[..., Path], run_id: str, steps: int = STEPS, entry_point: str = "testmodels:mlp",
          **train: Any) -> Path:
    return make_spec(run_id, entry_point=entry_point, hparams=HPARAMS, train=dict(
        {"per_replica_batch_size": PER_REPLICA, "global_batch": GLOBAL, "steps": steps, "steps_per_call": 5,
         "checkpoint_every_steps": 10}, **train))


def _run(spec: Path, replicas: int) -> AgentRun:
    return run_agent(spec, env={"TPUOPS_CPU_REPLICAS": str(replicas)})


def _weights(run: AgentRun) -> Dict[str, np.ndarray]:
    tensors = final_tensors(run.run_dir)
    assert any("optimizer" in name for name in tensors), "the optimizer slots must be compared too"
    return tensors


def _assert_close(left: Dict[str, np.ndarray], right: Dict[str, np.ndarray]) -> None:
    assert sorted(left) == sorted(right)
    for name in left:
        np.testing.assert_allclose(left[name], right[name], rtol=RTOL, atol=ATOL, err_msg=name)


@pytest.fixture(scope="module")
def on_eight(make_spec: Callable[..., Path]) -> AgentRun:
    """The whole run on 8 replicas: the global batch in one micro-batch."""
    run = _run(_spec(make_spec, "elastic-8"), 8)
    assert run.process.returncode == 0, run.output
    return run


def test_two_replicas_accumulating_four_micro_batches_train_what_eight_replicas_train(
        make_spec: Callable[..., Path], on_eight: AgentRun) -> None:
    on_two = _run(_spec(make_spec, "elastic-2"), 2)
    assert on_two.process.returncode == 0, on_two.output
    statuses = on_eight.status(), on_two.status()
    assert [(s["replicas"], s["accumulation"], s["global_batch"]) for s in statuses] == [(8, 1, GLOBAL), (2, 4, GLOBAL)]
    assert [s["examples_seen"] for s in statuses] == [STEPS * GLOBAL] * 2
    eight, two = _weights(on_eight), _weights(on_two)
    assert eight["data/examples_seen/.ATTRIBUTES/VARIABLE_VALUE"] == STEPS * GLOBAL
    _assert_close(two, eight)
    # The tolerance is not loose enough to hide an update: the run's weights moved far beyond it.
    first = final_tensors(on_eight.run_dir, step=20)
    moved = [name for name in eight if "kernel" in name and not np.allclose(first[name], eight[name], RTOL, ATOL)]
    assert moved, "the weights must change between step 20 and the end"


@pytest.mark.parametrize("first, then", [(8, 2), (2, 8)])
def test_a_checkpoint_resumes_on_another_slice_size_with_the_next_example(
        make_spec: Callable[..., Path], on_eight: AgentRun, first: int, then: int) -> None:
    run_id = f"elastic-{first}-then-{then}"
    started = _run(_spec(make_spec, run_id, steps=HALF), first)
    assert started.process.returncode == 0, started.output
    assert started.status()["examples_seen"] == HALF * GLOBAL
    resumed = _run(_spec(make_spec, run_id), then)  # the same run, its spec now asking for all the steps
    assert resumed.process.returncode == 0, resumed.output
    status = resumed.status()
    assert (status["resumed_from_step"], status["replicas"], status["examples_seen"]) == (HALF, then, STEPS * GLOBAL)
    _assert_close(_weights(resumed), _weights(on_eight))


def test_a_resume_that_would_change_the_global_batch_is_refused_in_one_line(
        make_spec: Callable[..., Path], on_eight: AgentRun) -> None:
    run_id = "elastic-refused"
    started = _run(_spec(make_spec, run_id, steps=HALF), 8)
    assert started.process.returncode == 0, started.output
    # Without train.global_batch the global batch is the slice's: 8 per replica x 2 replicas = 16, not 64.
    spec = _spec(make_spec, run_id)
    document = json.loads(spec.read_text())
    del document["train"]["global_batch"]
    spec.write_text(json.dumps(document))
    refused = _run(spec, 2)
    status = refused.status()
    assert (refused.process.returncode, status["exit_class"]) == (3, "user-error"), refused.output
    assert status["message"] == (
        f"checkpoint ckpt-{HALF} was trained with global batch {GLOBAL}, this attempt's is per_replica_batch_size "
        f"{PER_REPLICA} x 2 replicas = 16: a resume must keep the global batch (set train.global_batch: {GLOBAL} "
        "to accumulate on this slice)")
    assert "\n" not in status["message"]
    assert max(refused.checkpoint_steps()) == HALF, "a refused resume must not write a checkpoint"


def test_a_global_batch_the_slice_cannot_divide_is_refused_in_one_line(make_spec: Callable[..., Path]) -> None:
    refused = _run(_spec(make_spec, "elastic-indivisible"), 3)
    status = refused.status()
    assert (refused.process.returncode, status["exit_class"]) == (3, "user-error"), refused.output
    assert status["message"] == (
        f"train.global_batch {GLOBAL} cannot be split over this slice: a micro-batch is per_replica_batch_size "
        f"{PER_REPLICA} x 3 replicas = 24 examples, which must divide the global batch (use a multiple of 24)")
    assert not (refused.run_dir / "ckpt").exists() or not refused.checkpoint_steps()


def test_a_compiled_model_that_would_need_accumulation_is_refused_in_one_line(make_spec: Callable[..., Path]) -> None:
    refused = _run(_spec(make_spec, "elastic-compiled", entry_point="testmodels:compiled_mlp"), 2)
    status = refused.status()
    assert (refused.process.returncode, status["exit_class"]) == (3, "user-error"), refused.output
    assert status["message"].startswith("the model from testmodels:compiled_mlp is compiled: its own train_step")
    assert "cannot accumulate 4 micro-batches into train.global_batch 64 on 2 replicas" in status["message"]
    assert "\n" not in status["message"]


def test_batch_renormalization_that_would_need_accumulation_is_refused_in_one_line(
        make_spec: Callable[..., Path]) -> None:
    refused = _run(_spec(make_spec, "elastic-renorm", entry_point="testmodels:renormalized_mlp"), 2)
    status = refused.status()
    assert (refused.process.returncode, status["exit_class"]) == (3, "user-error"), refused.output
    assert status["message"] == (
        "the model from testmodels:renormalized_mlp uses batch renormalization (renorm=True in renormalized), "
        "which corrects every batch by the statistics it moves, so it cannot accumulate 4 micro-batches into one "
        "step; use renorm=False, or run on a slice that takes the global batch at once")
