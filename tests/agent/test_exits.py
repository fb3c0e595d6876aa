"""Exit classes: whose fault a failure is decides whether the controller retries."""

from pathlib import Path

import pytest
import tensorflow as tf
from tpuops.agent.blame import classify, preemption_caused
from tpuops.contract.exits import (
    DivergedExit,
    ExitClass,
    PreemptedExit,
    UserError,
    describe,
    traceback_tail,
)

pytestmark = pytest.mark.tf


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_codes_are_distinct_per_class() -> None:
    codes = {member: member.code for member in ExitClass}
    assert codes[ExitClass.SUCCEEDED] == 0 and codes[ExitClass.PREEMPTED] == 143
    assert codes[ExitClass.DIVERGED] == 4 and ExitClass.DIVERGED.final
    assert len(set(codes.values())) == len(codes)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (UserError("bad spec"), ExitClass.USER_ERROR),
        (tf.errors.InvalidArgumentError(None, None, "shapes differ"), ExitClass.USER_ERROR),
        (PreemptedExit("sigterm"), ExitClass.PREEMPTED),
        (DivergedExit("loss NaN at step 41"), ExitClass.DIVERGED),
        (RuntimeError("store unreachable"), ExitClass.CRASHED),
    ],
)
def test_classify_by_type(exc: BaseException, expected: ExitClass) -> None:
    assert classify(_raised(exc)) is expected


LOST_WORKER = tf.errors.InvalidArgumentError(None, None, "Primary device is not remote")


@pytest.mark.parametrize(
    ("exc", "noticed", "caused"),
    [
        (LOST_WORKER, True, True),  # a slice's runtimes stopped by the preemption under an evaluation
        (tf.errors.UnavailableError(None, None, "Socket closed"), True, True),
        (LOST_WORKER, False, False),  # without a notice it is what it says
        (UserError("seed out of range"), True, False),  # our own checks stay the user's
        (RuntimeError("store unreachable"), True, False),  # not TensorFlow's: a crash, retried as one
        (DivergedExit("loss NaN at step 41"), True, False),
    ],
)
def test_a_tensorflow_failure_during_a_preemption_notice_is_the_preemptions(
        exc: BaseException, noticed: bool, caused: bool) -> None:
    assert preemption_caused(classify(_raised(exc)), exc, noticed) is caused


def test_an_exception_raised_in_user_code_is_a_user_error(tmp_path: Path) -> None:
    source = tmp_path / "usermod.py"
    source.write_text("def boom():\n    raise KeyError('user bug')\n")
    namespace: dict = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    caught = _raised_from(namespace["boom"])
    assert classify(caught, [tmp_path]) is ExitClass.USER_ERROR
    assert classify(caught, [tmp_path / "elsewhere"]) is ExitClass.CRASHED
    assert "KeyError: 'user bug'" in traceback_tail(caught)


def _raised_from(function) -> BaseException:  # type: ignore[no-untyped-def]
    try:
        function()
    except BaseException as caught:
        return caught
    raise AssertionError("did not raise")


def test_an_error_raised_while_tracing_is_described_by_its_cause_not_by_in_user_code() -> None:
    model = tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(4,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="no_such_loss")
    step = tf.function(model.train_step)
    caught = _raised_from(lambda: step((tf.zeros([3, 4]), tf.zeros([3], tf.int64))))
    assert str(caught).startswith("in user code:")  # what TF 2.9 says first
    line = describe(caught)
    assert line.startswith("ValueError: Unknown loss function: no_such_loss.") and "\n" not in line

