"""``tpuops exec``: arguments reach a worker exactly as given, and each worker's exit status comes back.

Both ways of reaching workers (``RunsCommands``) are driven for real: the emulator's workers through the CLI, and
Cloud TPU's ``gcloud compute tpus tpu-vm ssh`` through the real Google Cloud CLI against the emulator. For gcloud
the only stand-ins are what the emulator does not serve: the Compute API's project (one GET, for ssh's user and
keys) and ``ssh`` itself, replaced on PATH by the worker's side of an ssh session (the arguments after ``--``
joined by spaces and handed to the login shell, as sshd does). A provider without the capability is refused
in one line, exit 2.
"""

from __future__ import annotations

import http.server
import json
import os
import shlex
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpuops.cli.main import run
from tpuops.core.kinds import Capacity
from tpuops.emulator.control import EmulatorInfo, start_background, stop
from tpuops.providers.base import wait_for
from tpuops.providers.cloud_tpu.adapter import TpuApi, ssh_argv
from tpuops.providers.commands import RunsCommands, WorkerRan, run_here
from tpuops.providers.memory import MemoryProvider
from tpuops.providers.nodes import NodeRequest

ZONE = "us-central1-a"
PROJECT = "tpuops-local"
# Arguments a shell would split, expand or run, each of which must arrive as one argument, unchanged.
NASTY = ["a; touch INJECTED", "$(touch INJECTED)", "`touch INJECTED`", "it's", '"quoted"', "two  spaces", "",
         "new\nline", "tab\there", "*", "~", "$HOME", "back\\slash", "-n", "ü ☃", "&&", "|", ">out"]
# Prints each argument it is given between < and >, one a line: what reached the worker, argument by argument.
ECHO_ARGS = ["python3", "-c", "import sys\nfor a in sys.argv[1:]: print('<' + a + '>')"]


@pytest.mark.unit
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")), min_size=1))
def test_the_gcloud_command_line_splits_back_into_exactly_the_arguments(argv: list[str]) -> None:
    command = ssh_argv(PROJECT, ZONE, "n", 3, argv)
    assert command[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"] and "--worker=3" in command
    [line] = [part.removeprefix("--command=") for part in command if part.startswith("--command=")]
    # gcloud splits --command on single spaces and ssh joins them again with one: the worker's shell gets `line`.
    assert " ".join(line.split(" ")) == line
    assert shlex.split(line) == argv


@pytest.mark.unit
def test_a_worker_killed_by_a_signal_reports_128_plus_it_and_the_worst_code_is_the_highest() -> None:
    from tpuops.api import Executed

    assert run_here(0, ["sh", "-c", "kill -KILL $$"], timeout_s=30).code == 137
    assert run_here(1, ["sh", "-c", "exit 7"], timeout_s=30) == WorkerRan(1, 7, "", "")
    assert run_here(0, ["printf", "a\\377b"], timeout_s=30).stdout == "a\ufffdb", "binary output is no traceback"
    ran = Executed("n", [WorkerRan(0, 0, "", ""), WorkerRan(1, 255, "", ""), WorkerRan(2, 7, "", "")])
    assert ran.exit_code == 255 and ran.to_json()["exit_code"] == 255
    assert Executed("n", [WorkerRan(0, 0, "", "")]).exit_code == 0


@pytest.mark.unit
def test_the_providers_say_whether_they_reach_workers() -> None:
    assert isinstance(TpuApi(PROJECT), RunsCommands)
    assert not isinstance(MemoryProvider("p"), RunsCommands)


def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: str) -> None:
    for key in [k for k in os.environ if k.startswith("TPUOPS_")]:
        monkeypatch.delenv(key)
    (tmp_path / "tpuops.toml").write_text(config + f'store = "{tmp_path / "store"}"\n')
    monkeypatch.setenv("TPUOPS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TPUOPS_CONFIG", str(tmp_path / "tpuops.toml"))


@pytest.mark.unit
def test_a_provider_that_cannot_reach_workers_is_refused_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _home(tmp_path, monkeypatch, f'node_provider = "memory"\nzones = ["{ZONE}"]\n')
    assert run(["exec", "n", "--", "true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "node provider 'memory' cannot reach its nodes' workers" in err[0]


@pytest.mark.unit
@pytest.mark.parametrize("argv", [["exec", "n", "--"], ["exec", "n", "--", ""], ["exec", "n", "--", " ", "x"]])
def test_no_program_is_bad_input(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    _home(tmp_path, monkeypatch, f'node_provider = "memory"\nzones = ["{ZONE}"]\n')
    assert run(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "give the program to run after '--'" in err[0]


# -- the emulator's workers, through the CLI -------------------------------------------------------------------


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorInfo]:
    info = start_background(tmp_path_factory.mktemp("emu"), boot_delay_s=0.1, grace_s=1.0, auth=False)
    yield info
    stop(info.state_dir)


@pytest.fixture(scope="module")
def slice_node(emulator: EmulatorInfo) -> str:
    """A READY v2-32 (4 workers) on the emulator."""
    api = TpuApi(PROJECT, endpoint=emulator.endpoint, poll_interval_s=0.05)
    request = NodeRequest(name="pod-x", accelerator="v2-32", runtime="tpu-vm-tf-2.9.1-pod", capacity=Capacity.SPOT)
    wait_for(api, api.create_node(ZONE, request), timeout_s=60)
    return "pod-x"


def _sandbox(info: EmulatorInfo, node: str, worker: int) -> Path:
    return info.state_dir / "nodes" / PROJECT / ZONE / (node if worker == 0 else f"{node}.w{worker}")


@pytest.fixture
def cli(emulator: EmulatorInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]):
    _home(tmp_path, monkeypatch, f'zones = ["{ZONE}"]\n')
    monkeypatch.setenv("TPUOPS_TPU_ENDPOINT", emulator.endpoint)
    monkeypatch.setenv("TPUOPS_POLL_INTERVAL_S", "0.05")

    def call(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = run(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return call


@pytest.mark.emulator
def test_exec_on_the_emulator_keeps_every_argument_and_returns_the_exit_status(
        cli, emulator: EmulatorInfo, slice_node: str) -> None:
    code, _, err = cli("exec", slice_node, "--", "sh", "-c", "exit 7")
    assert code == 7, err
    code, out, _ = cli("exec", slice_node, "--", "echo", "a; touch INJECTED")
    assert (code, out) == (0, "a; touch INJECTED\n")
    assert not (_sandbox(emulator, slice_node, 0) / "INJECTED").exists()
    code, out, err = cli("exec", slice_node, "--worker", "1", "--", *ECHO_ARGS, *NASTY)
    assert code == 0, err
    assert out == "".join(f"<{a}>\n" for a in NASTY)
    assert list(_sandbox(emulator, slice_node, 1).glob("INJECTED")) == []


@pytest.mark.emulator
def test_exec_on_every_worker_shows_each_code_and_exits_with_the_worst(cli, slice_node: str) -> None:
    fails = 'case "$PWD" in *.w2) exit 5;; *.w3) exit 3;; esac; echo fine'
    code, out, err = cli("exec", slice_node, "--worker", "all", "--", "sh", "-c", fails)
    assert code == 5
    assert out.splitlines() == ["[w0] fine", "[w1] fine"]
    assert err.strip().splitlines()[-1] == "exit codes: w0 0, w1 0, w2 5, w3 3"
    code, out, err = cli("exec", slice_node, "--worker", "all", "--json", "--", "sh", "-c", fails)
    assert code == 5
    shown = json.loads(out)
    assert shown["exit_code"] == 5 and [w["code"] for w in shown["workers"]] == [0, 0, 5, 3]


# -- Cloud TPU's gcloud ssh, against the emulator -------------------------------------------------------------


class _Project(http.server.BaseHTTPRequestHandler):
    """The Compute API's ``projects.get``, the one call gcloud's ssh makes outside the TPU API."""

    def do_GET(self) -> None:
        body = json.dumps({"kind": "compute#project", "name": PROJECT, "id": "1",
                           "commonInstanceMetadata": {"items": []}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


# The worker's side of an ssh session: sshd joins the arguments after the destination with spaces and hands
# them to the login shell, here in $WORKER_DIR. The destination (user@address) goes to $SSH_LOG.
WORKER_SSH = """#!/bin/bash
while (($#)) && [[ $1 != -- ]]; do destination=$1; shift; done
shift
echo "${destination#*@}" >> "$SSH_LOG"
cd "$WORKER_DIR"
exec bash -c "$*"
"""


@pytest.fixture
def gcloud(emulator: EmulatorInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """gcloud configured for the emulator, with the Compute project served and ssh played by the worker."""
    if shutil.which("gcloud") is None:
        pytest.skip("gcloud (Google Cloud CLI) is not on PATH")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Project)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(WORKER_SSH)
    (bin_dir / "ssh").chmod(0o755)
    (tmp_path / "cloudsdk").mkdir()
    for key, value in {
        "HOME": str(tmp_path), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SSH_LOG": str(tmp_path / "ssh.log"),
        "CLOUDSDK_CONFIG": str(tmp_path / "cloudsdk"), "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": f"http://127.0.0.1:{server.server_port}/compute/v1/",
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1", "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true",
        "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true", "WORKER_DIR": str(tmp_path / "worker"),
    }.items():
        monkeypatch.setenv(key, value)
    (tmp_path / "worker").mkdir()
    yield tmp_path
    server.shutdown()


@pytest.mark.emulator
@pytest.mark.slow
def test_gcloud_ssh_keeps_every_argument_and_returns_the_exit_status(
        gcloud: Path, emulator: EmulatorInfo, slice_node: str) -> None:
    provider = TpuApi(PROJECT, endpoint=emulator.endpoint)
    assert provider.run_on_worker(ZONE, slice_node, 2, ["sh", "-c", "exit 7"], timeout_s=120).code == 7
    ran = provider.run_on_worker(ZONE, slice_node, 2, ["echo", "a; touch INJECTED"], timeout_s=120)
    assert (ran.code, ran.stdout) == (0, "a; touch INJECTED\n"), ran.stderr
    ran = provider.run_on_worker(ZONE, slice_node, 1, [*ECHO_ARGS, *NASTY], timeout_s=120)
    assert (ran.code, ran.stdout) == (0, "".join(f"<{a}>\n" for a in NASTY)), ran.stderr
    addresses = (gcloud / "ssh.log").read_text().split()
    worker_of = {e["ipAddress"]: e["worker"] for e in _endpoints(emulator, slice_node)}
    assert [worker_of[a] for a in addresses] == [2, 2, 1], "each call reached the worker it named"
    assert list((gcloud / "worker").iterdir()) == [], "nothing ran but the commands given"


def _endpoints(info: EmulatorInfo, node: str) -> list[dict]:
    api = TpuApi(PROJECT, endpoint=info.endpoint)
    found = api.client.get_node(name=api.node_path(ZONE, node))
    return [{"worker": n, "ipAddress": e.ip_address} for n, e in enumerate(found.network_endpoints)]
