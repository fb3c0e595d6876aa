"""status.json and the log chunks: whole files, in write order, across attempts, none written over."""

import json
import logging
import time
from datetime import datetime
from pathlib import Path

import pytest
from tpuops.agent.logs import ChunkedLogHandler
from tpuops.agent.runtime import check_tensorflow
from tpuops.agent.status import Previous, Status, Ticker
from tpuops.contract.exits import ExitClass, UserError
from tpuops.contract.status import FIELDS

pytestmark = pytest.mark.tf


def test_status_is_rewritten_whole_and_finished_once(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    assert Previous(str(path)).attempt == 0
    status = Status(str(path), "r1", "train", attempt=Previous(str(path)).attempt + 1)
    status.update(step=5, total_steps=10)
    assert not path.exists(), "progress waits for the heartbeat"
    status.set_phase("training")
    assert json.loads(path.read_text())["step"] == 5
    assert json.loads(path.read_text())["ended"] is None, "only a finished agent dates its end"
    status.finish(ExitClass.USER_ERROR, "bad data", "Traceback ...")
    final = json.loads(path.read_text())
    assert (final["phase"], final["exit_class"], final["exit_code"]) == ("done", "user-error", 3)
    assert final["traceback"] == "Traceback ..." and final["heartbeat"].endswith("+00:00")
    ended = datetime.fromisoformat(final["ended"])  # what the control plane dates the node's self-delete by
    assert ended.tzinfo is not None and ended >= datetime.fromisoformat(final["started"])
    assert Previous(str(path)).attempt == 1
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"], "no temporary file is left behind"
    with pytest.raises(KeyError):
        status.update(stpe=1)


def test_the_agent_writes_the_contracts_fields_with_the_contracts_types(tmp_path: Path) -> None:
    """The writer's half of the status contract.

    tests/contract/test_contract.py holds the reader to the same FIELDS."""
    path = tmp_path / "status.json"
    status = Status(str(path), "r1", "train", attempt=1)
    status.update(step=5, total_steps=10, examples_per_sec=12.5, replicas=8, device="CPU", deterministic=True)
    status.add_eval(5, {"loss": 0.5})
    status.finish(ExitClass.SUCCEEDED)
    written = json.loads(path.read_text())
    assert list(written) == sorted(FIELDS), "every field of the contract, and no other"
    wrong = {name: value for name, value in written.items() if type(value) not in FIELDS[name]}
    assert not wrong, f"fields whose JSON type the contract does not allow: {wrong}"


def test_overlapping_attempts_never_write_over_each_others_chunks(tmp_path: Path) -> None:
    """Attempt 2 starts while attempt 1 has shipped nothing yet (its last lines go out as it ends): both logs stay,
    in write order. Numbering by listing gave both the same first name, and one log replaced the other."""
    logger = logging.getLogger("tpuops.agent.test-chunks")
    logger.setLevel(logging.INFO)
    first = ChunkedLogHandler(str(tmp_path / "logs"))
    logger.addHandler(first)
    logger.info("attempt 1 line 1")
    logger.removeHandler(first)
    second = ChunkedLogHandler(str(tmp_path / "logs"))
    logger.addHandler(second)
    logger.info("attempt 2 line 1")
    second.flush()
    first.flush()  # attempt 1's last ship, after attempt 2's first
    logger.info("attempt 2 line 2")
    second.flush()
    second.flush()  # nothing new: no empty chunk
    logger.removeHandler(second)
    chunks = sorted((tmp_path / "logs").iterdir())
    assert [p.read_text().split(" INFO ")[1].strip() for p in chunks] == [
        "attempt 1 line 1", "attempt 2 line 1", "attempt 2 line 2"]
    assert all(p.name.endswith(".log") and p.name > "199999.log" for p in chunks), "after the old 0NNNNN.log"


def test_a_failed_ship_keeps_its_lines_for_the_next(tmp_path: Path) -> None:
    logger = logging.getLogger("tpuops.agent.test-chunks-fail")
    logger.setLevel(logging.INFO)
    handler = ChunkedLogHandler(str(tmp_path / "logs"))
    logger.addHandler(handler)
    logger.info("line 1")
    (tmp_path / "logs").rmdir()
    (tmp_path / "logs").write_text("")  # a file where the folder was: the write fails
    with pytest.raises(Exception):  # noqa: B017 - whatever the store raises, the lines must stay
        handler.flush()
    (tmp_path / "logs").unlink()
    (tmp_path / "logs").mkdir()
    logger.info("line 2")
    handler.flush()
    logger.removeHandler(handler)
    [chunk] = (tmp_path / "logs").iterdir()
    assert [line.split(" INFO ")[1] for line in chunk.read_text().splitlines()] == ["line 1", "line 2"]


def test_a_ticker_ticks_at_once_when_asked_and_once_more_on_stop() -> None:
    ticks: list[int] = []
    ticker = Ticker(3600.0, [lambda: ticks.append(1)])
    ticker.start()
    ticker.now()  # what a stop or preemption notice does: the hour-long interval is not waited for
    deadline = time.monotonic() + 30
    while ticks != [1] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ticks == [1], "the tick asked for"
    ticker.stop()
    assert ticks == [1, 1]


@pytest.mark.parametrize("version", ["2.10.0", "2.90.1", "2.8.4"])
def test_only_tensorflow_2_9_is_accepted(version: str) -> None:
    check_tensorflow("2.9.3")
    with pytest.raises(UserError, match=r"needs TensorFlow 2\.9\.x, found " + version):
        check_tensorflow(version)


def test_evals_accumulate_and_a_resumed_attempt_replaces_the_later_ones(tmp_path: Path) -> None:
    path = str(tmp_path / "status.json")
    first = Status(path, "r1", "train", attempt=1)
    for step in (100, 200, 300):
        first.add_eval(step, {"loss": 1.0 / step})
    first.write()
    assert Previous(path).evals == [{"step": s, "metrics": {"loss": 1.0 / s}} for s in (100, 200, 300)]
    second = Status(path, "r1", "train", attempt=2, evals=Previous(path).evals)
    second.add_eval(200, {"loss": 0.5})  # resumed from step 150: the evaluations at 200 and 300 are redone
    second.write()
    assert [(e["step"], e["metrics"]["loss"]) for e in Previous(path).evals] == [(100, 0.01), (200, 0.5)]
