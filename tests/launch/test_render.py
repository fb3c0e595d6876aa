"""The rendered startup script: shellcheck-clean, injection-proof, idempotent, and it really runs.

Each run is real bash in a temporary HOME, with the metadata server pointed at a closed port
on 127.0.0.1 (so worker 0) or at a tiny local one, and a stub ``python3`` on PATH that
reports a TensorFlow version and records ``-m pip`` calls: importing real TF here would cost
seconds per run, and the emulator end-to-end tests run the real thing. One test runs the real
interpreter against a fake installed TensorFlow to check the version is read without importing it.
"""

from __future__ import annotations

import http.server
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import jinja2
import pytest
from helpers import REPO

from tpuops.core.resources import agent_pins, pin_file_text
from tpuops.launch.render import STARTUP_TEMPLATE, StartupContext, render_startup_script, render_template

pytestmark = pytest.mark.unit

PIN_FILE = REPO / "templates" / "requirements-tf29.txt"

STUB_PYTHON = """#!/bin/bash
# Stands in for the VM's python3: for any call but '-m pip', which it records, prints the TF
# version and, when the check is given agent pins to look for, those it lacks (the startup
# script's check prints these two lines).
set -eu
state={state}
if [[ ${{1-}} == -m && ${{2-}} == pip ]]; then
  printf '%s\\n' "$@" > "$state/pip-args"
  shift 2
  while (($#)); do
    if [[ $1 == -r ]]; then cp "$2" "$state/pip-requirements"; fi
    shift
  done
  if [[ -f $state/version-after-pip ]]; then cp "$state/version-after-pip" "$state/version"; fi
  exit 0
fi
cat "$state/version"
if (($# > 2)) && [[ -f $state/missing ]]; then cat "$state/missing"; fi
"""


@dataclass
class Vm:
    """A fake VM: its HOME, the stub python's state folder and the environment the script runs with."""

    home: Path
    stub: Path
    env: dict[str, str]

    @property
    def state_dir(self) -> Path:
        return self.home / "tpuops"

    def marker(self) -> dict:
        return json.loads((self.state_dir / "boot.json").read_text())

    def run(self, ctx: StartupContext) -> subprocess.CompletedProcess[str]:
        script = self.home.parent / "startup.sh"
        script.write_text(render_startup_script(ctx))
        return subprocess.run(["bash", str(script)], env=self.env, capture_output=True, text=True,
                              timeout=60, check=False)


@pytest.fixture(scope="module")
def closed_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses connections: bound, never listening, held for the module."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture
def vm(tmp_path: Path, closed_port: int) -> Vm:
    home, stub, bin_dir = tmp_path / "home", tmp_path / "stub", tmp_path / "bin"
    for folder in (home, stub, bin_dir):
        folder.mkdir()
    (stub / "version").write_text("2.9.3\n")
    python = bin_dir / "python3"
    python.write_text(STUB_PYTHON.format(state=shlex.quote(str(stub))))
    python.chmod(0o755)
    env = {
        "HOME": str(home),
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
        "GCE_METADATA_HOST": f"127.0.0.1:{closed_port}",
        "LANG": "C.UTF-8",
    }
    return Vm(home=home, stub=stub, env=env)


def context(**changes: object) -> StartupContext:
    base = StartupContext(
        node_name="tpuops-n1",
        project="my-project",
        zone="us-central1-b",
        accelerator_type="v2-8",
        store_root="/srv/store",
        run_id="run-1",
        labels={"managed-by": "tpuops", "team": "ml"},
    )
    return replace(base, **changes)


def hostile_values(pwn: Path) -> dict[str, str]:
    """One payload per way out of a shell word; each would create its own file under ``pwn``."""
    return {
        "subst": f"$(touch {pwn}/subst)",
        "backticks": f"`touch {pwn}/backticks`",
        "single": f"'; touch {pwn}/single #",
        "double": f'"; touch {pwn}/double; "',
        "newline": f"x\ntouch {pwn}/newline\n",
        "brace": f"${{IFS}}$(touch {pwn}/brace)",
    }


def hostile_context(pwn: Path, job: list[str] | None) -> StartupContext:
    bad = hostile_values(pwn)
    return context(
        node_name=bad["subst"] + bad["newline"],
        project=bad["single"],
        zone=bad["double"],
        accelerator_type=bad["backticks"],
        run_id=bad["single"] + bad["double"] + bad["newline"],
        store_root=bad["brace"] + " ~/store",
        labels={bad["subst"]: bad["backticks"], "k": bad["newline"]},
        job=job,
    )


needs_shellcheck = pytest.mark.skipif(shutil.which("shellcheck") is None,
                                      reason="shellcheck is not installed (make tools)")


@needs_shellcheck
@pytest.mark.parametrize("kind", ["bare", "job", "hostile-bare", "hostile-job"])
def test_rendered_script_passes_shellcheck(kind: str, tmp_path: Path) -> None:
    job = ["python3", "-m", "tpuops.agent", "train", "--spec", "gs://b/runs/r/spec.json"]
    ctx = {
        "bare": context(),
        "job": context(job=job),
        "hostile-bare": hostile_context(tmp_path, None),
        "hostile-job": hostile_context(tmp_path, [*job, "$(touch pwned)", "'; rm -rf ~ #"]),
    }[kind]
    checked = subprocess.run(["shellcheck", "--shell=bash", "-"], input=render_startup_script(ctx),
                             capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout


def test_bare_node_writes_marker_and_log_and_exits_zero(vm: Vm) -> None:
    done = vm.run(context())

    assert done.returncode == 0, done.stdout + done.stderr
    marker = vm.marker()
    assert marker["node"] == "tpuops-n1"
    assert marker["worker"] == 0
    assert marker["tf_version"] == "2.9.3"
    assert marker["boot_count"] == 1
    assert marker["time"].endswith("Z")
    assert marker["context"]["run_id"] == "run-1"
    assert marker["context"]["labels"] == {"managed-by": "tpuops", "team": "ml"}
    assert not (vm.stub / "pip-args").exists(), "TF 2.9 was there: nothing to install"
    assert "assuming worker 0" in done.stdout, "stdout must carry the log for journalctl"
    assert "no job: done" in (vm.state_dir / "startup.log").read_text()


def test_second_run_is_idempotent_and_counts_boots(vm: Vm) -> None:
    ctx = context(job=["/bin/sh", "-c", "echo ran >> runs"])
    first, second = vm.run(ctx), vm.run(ctx)

    assert (first.returncode, second.returncode) == (0, 0), second.stdout + second.stderr
    assert vm.marker()["boot_count"] == 2
    assert (vm.state_dir / "job" / "runs").read_text() == "ran\nran\n"
    assert (vm.state_dir / "startup.log").read_text().count("boot ") >= 2


def test_job_argv_arrives_byte_exact(vm: Vm) -> None:
    ctx = context(job=["/bin/sh", "-c", 'printf %s "$1" > out', "x", "$(touch pwned)"])
    done = vm.run(ctx)

    assert done.returncode == 0, done.stdout + done.stderr
    job_dir = vm.state_dir / "job"
    assert (job_dir / "out").read_text() == "$(touch pwned)"
    assert not any(p.name == "pwned" for p in vm.home.parent.rglob("*"))


def test_job_exit_status_is_the_scripts(vm: Vm) -> None:
    done = vm.run(context(job=["/bin/sh", "-c", "exit 7"]))

    assert done.returncode == 7
    assert vm.marker()["boot_count"] == 1


def test_job_still_logs_after_the_group_gets_sigterm(vm: Vm) -> None:
    """Preemption SIGTERMs the whole process group: the log's tee must outlive it while the job saves."""
    on_term = 'trap "echo checkpointed after TERM; exit 0" TERM; touch ready; while :; do sleep 0.05; done'
    job = ["/bin/sh", "-c", on_term]
    script = vm.home.parent / "startup.sh"
    script.write_text(render_startup_script(context(job=job)))
    proc = subprocess.Popen(["bash", str(script)], env=vm.env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (vm.state_dir / "job" / "ready").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the job never started"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    assert proc.returncode == 0
    assert "checkpointed after TERM" in out
    assert "checkpointed after TERM" in (vm.state_dir / "startup.log").read_text()


def test_hostile_values_stay_literal_end_to_end(vm: Vm, tmp_path: Path) -> None:
    pwn = tmp_path / "pwn"
    pwn.mkdir()
    bad = hostile_values(pwn)
    dump_env = ('printf %s "$TPUOPS_RUN_ID" > run_id; printf %s "$TPUOPS_STORE_ROOT" > store; '
                'printf %s "$1" > arg')
    ctx = hostile_context(pwn, ["/bin/sh", "-c", dump_env, "x", *bad.values()])
    done = vm.run(ctx)

    assert done.returncode == 0, done.stdout + done.stderr
    assert list(pwn.iterdir()) == [], "a value was executed by the shell"
    marker = vm.marker()
    assert marker["node"] == ctx.node_name
    assert marker["context"]["project"] == ctx.project
    assert marker["context"]["labels"] == dict(ctx.labels)
    job_dir = vm.state_dir / "job"
    assert (job_dir / "run_id").read_text() == ctx.run_id
    assert (job_dir / "store").read_text() == ctx.store_root
    assert (job_dir / "arg").read_text() == bad["subst"]


def test_wrong_tensorflow_installs_the_pin_file(vm: Vm) -> None:
    (vm.stub / "version").write_text("2.11.0\n")
    (vm.stub / "version-after-pip").write_text("2.9.3\n")
    done = vm.run(context(job=["/bin/sh", "-c", "touch started"]))

    assert done.returncode == 0, done.stdout + done.stderr
    args = (vm.stub / "pip-args").read_text().split("\n")
    assert args[:3] == ["-m", "pip", "install"]
    assert "-r" in args
    assert (vm.stub / "pip-requirements").read_bytes() == PIN_FILE.read_bytes()
    assert context().pin_file.encode() == PIN_FILE.read_bytes()
    assert vm.marker()["tf_version"] == "2.9.3"
    assert (vm.state_dir / "job" / "started").exists()


def _installed(site: Path, name: str, version: str, top_level: str) -> None:
    """A distribution's metadata in ``site``, as pip leaves it."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "top_level.txt").write_text(f"{top_level}\n")


def test_reads_the_tf_version_from_metadata_without_importing_it(vm: Vm, tmp_path: Path) -> None:
    """A real interpreter, an installed "tensorflow-cpu" whose import would leave a trace, and the agent pins."""
    site = tmp_path / "site"
    (site / "tensorflow").mkdir(parents=True)
    (site / "tensorflow" / "__init__.py").write_text(
        f"open({str(tmp_path / 'imported')!r}, 'w').close()\n__version__ = '2.9.3'\n")
    _installed(site, "tensorflow-cpu", "2.9.3", "tensorflow")
    for pin in agent_pins(pin_file_text()):
        name, _, version = pin.partition("==")
        _installed(site, name, version, name)
    vm.env["PYTHONPATH"] = str(site)
    done = vm.run(context(python=sys.executable))

    assert done.returncode == 0, done.stdout + done.stderr
    assert vm.marker()["tf_version"] == "2.9.3"
    assert not (tmp_path / "imported").exists(), "the startup script imported TensorFlow"
    assert not (vm.stub / "pip-args").exists()


def test_an_image_with_tf29_gets_only_the_agent_pins_it_lacks(vm: Vm, tmp_path: Path) -> None:
    """The real check finds an agent pin at another version; pip installs just that one, never the TF pins."""
    pins = agent_pins(pin_file_text())
    assert pins, "the pin file has no agent pins: this test checks nothing"
    site = tmp_path / "site"
    _installed(site, "tensorflow", "2.9.1", "tensorflow")
    name, _, version = pins[0].partition("==")
    _installed(site, name, version + ".post1", name)
    for other in pins[1:]:
        _installed(site, other.partition("==")[0], other.partition("==")[2], other.partition("==")[0])
    python = tmp_path / "bin" / "python-real"  # the real interpreter, but pip only records its arguments
    python.write_text(f"#!/bin/bash\nif [[ ${{1-}} == -m && ${{2-}} == pip ]]; then\n"
                      f"  printf '%s\\n' \"$@\" > {shlex.quote(str(vm.stub))}/pip-args\n  exit 0\nfi\n"
                      f"exec {shlex.quote(sys.executable)} \"$@\"\n")
    python.chmod(0o755)
    vm.env["PYTHONPATH"] = str(site)
    done = vm.run(context(python=str(python), job=["/bin/sh", "-c", "touch started"],
                          needs_agent_pins=True))

    assert done.returncode == 0, done.stdout + done.stderr
    assert (vm.stub / "pip-args").read_text().splitlines() == ["-m", "pip", "install", "--quiet", pins[0]]
    assert vm.marker()["tf_version"] == "2.9.1"
    assert (vm.state_dir / "job" / "started").exists()


def test_a_failed_agent_pin_install_still_starts_the_job(vm: Vm) -> None:
    """The job then stops itself with a user error naming what is missing, and the node is deleted."""
    pins = agent_pins(pin_file_text())
    (vm.stub / "missing").write_text(" ".join(pins) + "\n")
    python = vm.home.parent / "bin" / "python3"
    python.write_text(python.read_text().replace("  exit 0\nfi", "  exit 1\nfi", 1))
    done = vm.run(context(job=["/bin/sh", "-c", "touch started"], needs_agent_pins=True))

    assert done.returncode == 0, done.stdout + done.stderr
    assert (vm.stub / "pip-args").read_text().splitlines() == ["-m", "pip", "install", "--quiet", *pins]
    assert f"pip install {' '.join(pins)} failed" in done.stdout
    assert (vm.state_dir / "job" / "started").exists()


def test_a_training_node_checks_no_agent_pin(vm: Vm) -> None:
    """No agent pins in its context: nothing to install even if the stub says orjson is missing."""
    (vm.stub / "missing").write_text(" ".join(agent_pins(pin_file_text())) + "\n")
    done = vm.run(context(job=["/bin/sh", "-c", "touch started"]))
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (vm.stub / "pip-args").exists()
    assert (vm.state_dir / "job" / "started").exists()


def test_agent_pins_are_the_last_section_of_the_pin_file() -> None:
    assert agent_pins(pin_file_text()) == ["orjson==3.10.15"]
    assert agent_pins("numpy<1.24\n") == []
    with pytest.raises(ValueError, match="name==version"):
        agent_pins("tensorflow-cpu==2.9.3\n# The agent's own packages: below\norjson>=3\n")


def test_gives_up_when_install_does_not_bring_tf29(vm: Vm) -> None:
    (vm.stub / "version").write_text("2.11.0\n")
    done = vm.run(context(job=["/bin/sh", "-c", "touch started"]))

    assert done.returncode == 1
    assert "giving up" in done.stdout
    assert (vm.stub / "pip-args").exists()
    assert not (vm.state_dir / "boot.json").exists()
    assert not (vm.state_dir / "job" / "started").exists()


class _Metadata(http.server.BaseHTTPRequestHandler):
    """Answers agent-worker-number like GCE's metadata server: only with the Metadata-Flavor header."""

    worker = "1"
    seen: list[tuple[str, str | None]]

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Metadata-Flavor")))
        if self.headers.get("Metadata-Flavor") != "Google":
            self.send_error(403)
            return
        if not self.path.endswith("/instance/attributes/agent-worker-number"):
            self.send_error(404)
            return
        body = self.worker.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def metadata_server() -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    seen: list[tuple[str, str | None]] = []
    handler = type("Handler", (_Metadata,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_only_worker_zero_starts_the_job(vm: Vm, metadata_server: tuple[str, list]) -> None:
    host, seen = metadata_server
    vm.env["GCE_METADATA_HOST"] = host
    done = vm.run(context(accelerator_type="v3-32", job=["/bin/sh", "-c", "touch started"]))

    assert done.returncode == 0, done.stdout + done.stderr
    assert seen == [("/computeMetadata/v1/instance/attributes/agent-worker-number", "Google"),
                    ("/computeMetadata/v1/instance/attributes/worker-network-endpoints", "Google")]
    assert vm.marker()["worker"] == 1
    assert not (vm.state_dir / "job" / "started").exists()


def test_missing_template_value_raises() -> None:
    with pytest.raises(jinja2.UndefinedError, match="zone"):
        render_template(STARTUP_TEMPLATE, {
            "node_name": "n", "project": "p", "accelerator_type": "v2-8", "run_id": "",
            "store_root": "/s", "python": "python3", "tf_version_prefix": "2.9", "pin_file": "", "agent_pins": [],
            "job": [], "worker_logs": "", "ship_log": "", "context": {},
        })


def test_none_is_never_quoted_into_the_script() -> None:
    values = {
        "node_name": "n", "project": "p", "zone": "z", "accelerator_type": "v2-8", "run_id": None,
        "store_root": "/s", "python": "python3", "tf_version_prefix": "2.9", "pin_file": "", "agent_pins": [],
        "job": [], "worker_logs": "", "ship_log": "", "context": {},
    }
    with pytest.raises(TypeError, match="None"):
        render_template(STARTUP_TEMPLATE, values)


def test_job_must_be_an_argv_list() -> None:
    with pytest.raises(TypeError, match="argv list"):
        context(job="python3 train.py")
