"""Node sandboxes: a directory and a process group per node, and the one way they end.

A READY node runs its ``startup-script`` with bash in a new session (so its process group
id is the bash pid) inside ``<state-dir>/nodes/<project>/<zone>/<node>/``, which is also its
HOME. Its temporary directory (``TMPDIR``) is ``tmp/`` in there, emptied at each boot, as a
VM's /tmp is its own and starts empty: the agent stages checkpoints and prefetches under it in a
folder named by the store path, and in the host's /tmp two emulators on one machine (concurrent
test runs, or one run and the leftovers of an earlier one) shared those folders for same-named runs.

What the script starts in the background stays in that group, as on a VM where the
agent outlives the startup script, so ending a node always means ending the whole group:
SIGTERM, a grace period that ends early once no live process is left, then SIGKILL.

Every group started is listed in ``<state-dir>/process_groups.json`` until it is seen
empty, so ``control.stop`` can still end them if the emulator itself was killed.

With a ``NodeNetwork`` (a ``gs://`` store) the script starts in a private mount namespace whose
/etc/hosts sends Google's storage and metadata names to the emulator (``netview``), with the
emulator's CA trusted; everything the script starts inherits both, as the whole VM would.

Group liveness is read from /proc (zombies do not count): a process that has exited but
not yet been reaped by its parent must not hold a grace period open.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tpuops.emulator.fsutil import read_json, write_json_atomic
from tpuops.emulator.vm.netview import NodeNetwork

log = logging.getLogger(__name__)

POLL_S = 0.05
KILL_CONFIRM_S = 2.0
STARTUP_SCRIPT = "startup-script"
NODE_TMP = "tmp"  # the node's TMPDIR, under its directory
GROUPS_FILE = "process_groups.json"
# Variables of the emulator's own environment that a VM would not have.
_DROPPED_ENV_PREFIXES = ("TPUOPS_", "GCE_METADATA_")
_DROPPED_ENV = frozenset({"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "STORAGE_EMULATOR_HOST",
                          "TPU_API_DISCOVERY_URL"})


@dataclass
class ScriptRun:
    """One run of a startup script.

    ``exit_code`` is set once bash has exited, in the shell's convention (128 + N when
    killed by signal N); ``group_gone`` then says whether nothing it started is left
    running (its group id must then not be signalled: it may be reused).
    """

    pgid: int
    started: float
    log_path: Path
    exit_code: int | None = None
    group_gone: bool = False

    @property
    def live_pgid(self) -> int | None:
        return None if self.group_gone else self.pgid


def process_groups() -> Iterator[tuple[int, int]]:
    """(pid, process group id) of every process that is not a zombie, read from /proc."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and fields[0] != b"Z":
            yield int(entry.name), int(fields[2])


def live_groups() -> set[int]:
    """Process group ids that have at least one process that is not a zombie."""
    return {pgid for _, pgid in process_groups()}


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


@dataclass
class _Termination:
    pgid: int
    term_deadline: float
    on_gone: Callable[[], None] | None
    killed_at: float | None = None


class Sandboxes:
    """Start startup scripts and end process groups, for every node of one emulator."""

    def __init__(self, state_dir: Path, image_python: str | None) -> None:
        self._state_dir = state_dir
        self._network: NodeNetwork | None = None
        self._discovery_url: str | None = None
        self._registry = state_dir / GROUPS_FILE
        self._lock = threading.Condition()
        self._groups: set[int] = set()
        self._pending: list[_Termination] = []
        self._closed = False
        self._path_prefix = self._image_path(image_python)
        self._reaper = threading.Thread(target=self._reap_loop, name="emulator-reaper", daemon=True)
        self._reaper.start()

    def _image_path(self, image_python: str | None) -> list[str]:
        """PATH entries that make ``python3`` (and ``python``) the VM image's interpreter.

        Wrapper scripts rather than symlinks: a virtual environment's interpreter finds its
        site-packages only when started by its own path.
        """
        if not image_python:
            return []
        interpreter = Path(image_python).absolute()
        shim_dir = self._state_dir / "image-bin"
        shim_dir.mkdir(parents=True, exist_ok=True)
        for name in ("python3", "python"):
            shim = shim_dir / name
            shim.write_text(f'#!/bin/sh\nexec "{interpreter}" "$@"\n')
            shim.chmod(0o755)
        return [str(shim_dir), str(interpreter.parent)]

    def use_api(self, endpoint: str) -> None:
        """Where later scripts' discovery-based clients load the Cloud TPU API from (``TPU_API_DISCOVERY_URL``).

        TensorFlow's TPU client reads that variable to build its ``tpu`` service; on a VM it is unset and
        Google's discovery service answers. Set once the emulator listens, before the first node boots.
        """
        self._discovery_url = f"{endpoint.rstrip('/')}/$discovery/rest?version={{apiVersion}}"

    def use_network(self, network: NodeNetwork) -> None:
        """Start every later script in ``network``'s view (a gs:// store): set before the first node boots."""
        self._network = network

    def directory(self, project: str, zone: str, node: str) -> Path:
        """Where node ``node`` keeps its files (created when its first script runs)."""
        return self._state_dir / "nodes" / project / zone / node

    def _environment(self, home: Path, metadata_host: str) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in _DROPPED_ENV and not key.startswith(_DROPPED_ENV_PREFIXES)
        }
        env.update(
            HOME=str(home),
            PWD=str(home),
            # google-auth and TensorFlow's GCS auth read GCE_METADATA_HOST; TensorFlow's TPU client and
            # google-auth's ping read GCE_METADATA_IP; oauth2client (the credentials of TensorFlow's TPU
            # client) reads GCE_METADATA_ROOT. On a VM all default to the same server.
            GCE_METADATA_HOST=metadata_host,
            GCE_METADATA_IP=metadata_host,
            GCE_METADATA_ROOT=metadata_host,
            TMPDIR=str(home / NODE_TMP),
            PATH=os.pathsep.join([*self._path_prefix, os.environ.get("PATH", os.defpath)]),
        )
        if self._discovery_url is not None:
            env["TPU_API_DISCOVERY_URL"] = self._discovery_url
        if self._network is not None:
            env.update(self._network.environment())
        return env

    def run_script(
        self,
        directory: Path,
        script: str,
        metadata_host: str,
        on_exit: Callable[[ScriptRun], None],
        *,
        name: str = STARTUP_SCRIPT,
    ) -> ScriptRun:
        """Start ``script`` with bash in its own session; ``on_exit`` runs when bash exits.

        Returns at once; output is appended to ``<name>.log`` in ``directory``. The startup script
        (``name`` STARTUP_SCRIPT) starts with an emptied TMPDIR, as a boot does; other services of the
        VM (the TPU runtime) start beside it in a group of their own.
        """
        directory.mkdir(parents=True, exist_ok=True)
        if name == STARTUP_SCRIPT:
            shutil.rmtree(directory / NODE_TMP, ignore_errors=True)  # a boot starts with an empty /tmp
        (directory / NODE_TMP).mkdir(exist_ok=True)
        script_path = directory / f".{name}"
        script_path.write_text(script)
        log_path = directory / f"{name}.log"
        with open(log_path, "ab") as out:
            command = ["bash", str(script_path)]
            proc = subprocess.Popen(
                self._network.wrap(command) if self._network is not None else command,
                cwd=directory,
                env=self._environment(directory, metadata_host),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        run = ScriptRun(pgid=proc.pid, started=time.time(), log_path=log_path)
        with self._lock:
            self._groups.add(run.pgid)
            self._save_registry()
        threading.Thread(
            target=self._wait_script, args=(proc, run, on_exit), name=f"script-{proc.pid}", daemon=True
        ).start()
        return run

    def _wait_script(self, proc: subprocess.Popen[bytes], run: ScriptRun, on_exit: Callable[[ScriptRun], None]) -> None:
        returncode = proc.wait()
        run.exit_code = returncode if returncode >= 0 else 128 - returncode
        with open(run.log_path, "a") as out:
            out.write(f"{run.log_path.stem} exit status {run.exit_code}\n")
        if run.pgid not in live_groups():
            run.group_gone = True
            with self._lock:
                self._groups.discard(run.pgid)
                self._save_registry()
        on_exit(run)

    def terminate(self, pgids: list[int], grace_s: float, on_gone: Callable[[], None] | None = None) -> None:
        """SIGTERM groups ``pgids`` (a node's, every worker's) now, SIGKILL each after ``grace_s`` unless it emptied.

        ``on_gone`` runs on the reaper thread once no group has a live process (at once, on the
        next poll, when ``pgids`` is empty or they already are). Returns immediately.
        """
        for pgid in pgids:
            signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        items = [_Termination(pgid=pgid, term_deadline=deadline, on_gone=None) for pgid in pgids]
        # The last item to finish runs ``on_gone``: a group-less one when there is nothing to wait for.
        items = items or [_Termination(pgid=0, term_deadline=deadline, on_gone=None)]
        remaining = [len(items)]

        def one_gone() -> None:
            remaining[0] -= 1
            if remaining[0] == 0 and on_gone is not None:
                on_gone()

        for item in items:
            item.on_gone = one_gone
        with self._lock:
            self._pending.extend(items)
            self._lock.notify()

    def _reap_loop(self) -> None:
        while True:
            with self._lock:
                while not self._closed and not self._pending:
                    self._lock.wait()
                if self._closed:
                    return
                items = list(self._pending)
            finished = self._reap_once(items)
            callbacks = []
            with self._lock:
                for item in finished:
                    self._pending.remove(item)
                    self._groups.discard(item.pgid)
                    if item.on_gone is not None:
                        callbacks.append(item.on_gone)
                if finished:
                    self._save_registry()
            for callback in callbacks:
                try:
                    callback()
                except Exception:
                    log.exception("termination callback failed")
            if len(finished) < len(items):
                time.sleep(POLL_S)

    @staticmethod
    def _reap_once(items: list[_Termination]) -> list[_Termination]:
        alive = live_groups()
        now = time.monotonic()
        finished = []
        for item in items:
            if not item.pgid or item.pgid not in alive:
                finished.append(item)
            elif item.killed_at is None and now >= item.term_deadline:
                signal_group(item.pgid, signal.SIGKILL)
                item.killed_at = now
            elif item.killed_at is not None and now - item.killed_at > KILL_CONFIRM_S:
                log.warning("process group %s survived SIGKILL (uninterruptible?); giving up on it", item.pgid)
                finished.append(item)
        return finished

    def _save_registry(self) -> None:
        write_json_atomic(self._registry, sorted(self._groups))

    def close(self, grace_s: float) -> None:
        """End every group this emulator started: SIGTERM, up to ``grace_s``, then SIGKILL."""
        with self._lock:
            groups = set(self._groups)
        deadline = time.monotonic() + grace_s
        for pgid in groups:
            signal_group(pgid, signal.SIGTERM)
        while groups & live_groups() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        kill_groups(groups)
        with self._lock:
            self._closed = True
            self._groups.clear()
            self._save_registry()
            self._lock.notify()


def kill_groups(groups: set[int]) -> None:
    """SIGKILL every live group in ``groups`` and wait (bounded) until they are gone."""
    survivors = groups & live_groups()
    for pgid in survivors:
        signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_CONFIRM_S
    while survivors and time.monotonic() < deadline:
        time.sleep(POLL_S)
        survivors &= live_groups()


def kill_registered_groups(state_dir: Path) -> bool:
    """End the groups a dead emulator left listed in its state dir; True if any was alive."""
    registry = state_dir / GROUPS_FILE
    groups = {int(pgid) for pgid in read_json(registry, [])}
    alive = groups & live_groups()
    kill_groups(alive)
    if groups:
        write_json_atomic(registry, [])
    return bool(alive)
