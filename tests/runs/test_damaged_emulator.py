"""A garbled ``memory.json`` from the command line, over the emulator (issue 30, item 6).

Before, ``status``, ``runs``, ``runs --json``, ``events`` and ``train --resume`` all exited 2 for every run as
long as one run's memory was garbled, and the dashboard's Nodes page answered 400: the user could not even see
the node that was billing. Now the damaged run is shown so, every other run and node stays visible, the commands
about that one run say what is wrong in one line with exit 1, and ``runs forget`` deletes its billing node.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import poll
from starlette.testclient import TestClient

from tests.dashboard.test_dashboard_orphans import make_node
from tests.runs.test_runs import declare
from tpuops import runs
from tpuops.cli.main import run
from tpuops.config import load_settings
from tpuops.core.naming import labels_for
from tpuops.dashboard.app import Dashboard
from tpuops.dashboard.auth import COOKIE
from tpuops.dashboard.source import bound_source
from tpuops.session import connect, store

pytestmark = pytest.mark.emulator

ZONE = "us-central1-a"
TOKEN = "t0ken-for-damage"


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = run(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_garbled_memory_leaves_every_command_working_and_forget_deletes_the_billing_node(
        tmp_path: Path, emulator: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "tpuops.toml"
    config.write_text(f'provider = "local"\nproject = "proj-test"\nzones = ["{ZONE}"]\n'
                      f'store = "{tmp_path / "store"}"\ntpu_endpoint = "{emulator.endpoint}"\n'
                      'poll_interval_s = 0.05\napi_deadline_s = 20\n')
    monkeypatch.setenv("TPUOPS_CONFIG", str(config))
    monkeypatch.setenv("TPUOPS_HOME", str(tmp_path / "home"))
    settings = load_settings(config_path=config)
    root = store(settings)
    declare(root, "whole")
    declare(root, "broken")
    make_node(settings, "broken", labels_for(run_id="broken"))
    root.write_bytes(runs.memory_key("broken"), b'{"phase": "act')

    code, out, err = cli(capsys, "runs")
    assert code == 0, err
    assert "whole" in out and "damaged" in out and "broken: damaged:" in err and "tpuops runs repair broken" in err
    code, out, err = cli(capsys, "runs", "--json")
    assert code == 0, err
    shown = {row["run_id"]: row for row in json.loads(out)["runs"]}
    assert shown["broken"]["phase"] == "damaged" and "memory.json is damaged" in shown["broken"]["damaged"]
    assert shown["whole"]["damaged"] is None
    code, out, err = cli(capsys, "status", "--json")
    assert code == 0, err
    status = json.loads(out)
    assert [node["name"] for node in status["nodes"]] == ["broken"], "the billing node is in view"
    assert {row["run_id"]: row["phase"] for row in status["runs"]} == {"whole": "pending", "broken": "damaged"}

    for args in (("events", "broken"), ("train", "--resume", "broken")):
        code, out, err = cli(capsys, *args)
        assert code == 1, (args, err)
        errors = [line for line in err.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and "memory.json is damaged" in errors[0] and "Traceback" not in err
    assert cli(capsys, "events", "whole")[0] == 0

    page = TestClient(Dashboard(bound_source(settings), token=TOKEN, read_only=True, refresh_s=0.05).asgi(),
                      base_url="http://127.0.0.1")
    page.cookies.set(COOKIE, TOKEN)
    nodes = page.get("/nodes")
    assert nodes.status_code == 200 and "damaged" in nodes.text
    assert page.get("/data/nodes").json()[0]["damaged"].startswith("damaged: ")

    root.write_bytes(runs.status_key("whole"), b"\xff")
    code, out, err = cli(capsys, "runs", "repair", "whole", "--dry-run", "--json")
    assert code == 0 and json.loads(out)["done"] == [] and list(json.loads(out)["damaged"]) == ["status.json"]
    code, out, err = cli(capsys, "runs", "repair", "whole")
    assert code == 0 and "done: status.json set aside as status.json.damaged" in err
    assert cli(capsys, "runs", "repair", "whole")[2].strip() == "run whole is not damaged: nothing to repair"

    code, out, err = cli(capsys, "runs", "forget", "broken", "--dry-run", "--json")
    assert code == 0, err
    planned = json.loads(out)
    assert planned["forgotten"] is False and planned["node"]["name"] == "broken"
    assert [node.name for node in connect(settings).list_nodes(ZONE)] == ["broken"], "a dry run deletes nothing"
    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    code, out, err = cli(capsys, "runs", "forget", "broken")
    assert code == 0 and "delete node broken in us-central1-a (READY) of damaged run broken? [y/N]" in err
    assert "nothing done" in err and "broken" in runs.all_run_ids(root), "declined: nothing deleted or removed"
    code, out, err = cli(capsys, "runs", "forget", "broken", "--yes", "--json")
    assert code == 0, err
    assert json.loads(out)["forgotten"] is True
    poll(lambda: connect(settings).list_nodes(ZONE) == [], "the damaged run's node to be gone", timeout_s=30)
    code, out, _ = cli(capsys, "runs", "--json")
    assert [row["run_id"] for row in json.loads(out)["runs"]] == ["whole"]
