"""The commands around runs as library calls: ``init``, ``doctor``, ``schedule *``, ``emulator *``, ``runtime *``.

Part of the front door (``tpuops.api`` re-exports every name here): the config file, the readiness
checks, the timer that runs reconcile passes, the local Cloud TPU emulator and the local TF 2.9
runtime. Each call takes ``Settings`` (``init`` writes them) and imports what it drives lazily.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuops.config import Settings, held_back_lines
from tpuops.core.errors import UsageError
from tpuops.providers.commands import WorkerRan

if TYPE_CHECKING:
    from tpuops.doctor import Checkup
    from tpuops.emulator import AdminClient, EmulatorInfo
    from tpuops.schedule import Schedule
    from tpuops.tfenv.build import Built
    from tpuops.tfenv.locate import RuntimeReport


def init(path: Path, values: Mapping[str, Any], *, labels: str | None = None, force: bool = False) -> Settings:
    """``tpuops init``: validate ``values`` (and ``labels``, ``KEY=VALUE,...``) and write them to ``path``."""
    from tpuops.config import parse_labels, write_config
    from tpuops.providers.registry import RULES

    parsed = parse_labels(labels, "--label") if labels else None
    return write_config(path, {**values, "labels": parsed}, force=force, rules=RULES)


def load_settings(config_path: Path | None = None, environ: Mapping[str, str] | None = None, *, starts: bool = False,
                  warn: Callable[[str], None] | None = None) -> Settings:
    """The settings every call takes: ``tpuops.toml`` (``config_path``, else the nearest) and the environment,
    checked against the node providers' rules (the registered names, the configured provider's zones and
    accelerators), which ``tpuops.config`` itself does not know.

    A notify target with a malformed URL: refused (``UsageError``) by a call that ``starts`` new spending or uses
    a target; else held back, and ``warn`` gets one line per such target (``tpuops.config.load_settings``)."""
    from tpuops.config import load_settings as load
    from tpuops.providers.registry import RULES

    settings = load(config_path=config_path, environ=environ, rules=RULES, starts=starts)
    for line in held_back_lines(settings) if warn is not None else ():
        warn(line)
    return settings


def reachable_store(settings: Settings, warn: Callable[[str], None]) -> Settings:
    """``settings`` with a store this machine can serve (``tpuops.session.with_reachable_store``).

    Call it once after loading settings (the CLI does); ``warn`` gets the one line saying why the store changed.
    """
    from tpuops.session import with_reachable_store

    return with_reachable_store(settings, warn)


def doctor(settings: Settings) -> Checkup:
    """``tpuops doctor``: every readiness check (credentials, APIs, permissions, store, zones, runtimes, clock)."""
    from tpuops.doctor import Checkup, run_checks

    return Checkup(run_checks(settings))


def _schedule(settings: Settings, config: Path | None, every: int = 5) -> Schedule:
    """The schedule of this home, config file and working directory."""
    from tpuops.config import find_config_file
    from tpuops.schedule import Schedule

    found = config or find_config_file()
    return Schedule(home=settings.home, config=Path(found).resolve() if found else None, workdir=Path.cwd(),
                    every_minutes=every)


def schedule_install(settings: Settings, *, config: Path | None = None, every: int = 5, systemd: bool = False,
                     dry_run: bool = False) -> dict[str, Any]:
    """``tpuops schedule install``: a reconcile pass every ``every`` minutes with this config, never two at once."""
    from tpuops import schedule

    return schedule.install(_schedule(settings, config, every), systemd=systemd, dry_run=dry_run)


def schedule_uninstall(settings: Settings, *, config: Path | None = None, systemd: bool = False) -> bool:
    """``tpuops schedule uninstall``: remove this home's schedule (other crontab lines stay); whether one was there."""
    from tpuops import schedule

    return schedule.uninstall(_schedule(settings, config), systemd=systemd)


def schedule_status(settings: Settings, *, config: Path | None = None) -> dict[str, Any]:
    """``tpuops schedule status``: what is installed, and what the last scheduled pass did."""
    from tpuops import schedule

    return schedule.status(_schedule(settings, config))


@dataclass(frozen=True)
class EmulatorStarted:
    """The running emulator, and the Cloud Storage endpoint it serves a ``gs://`` store on (None: none)."""

    info: EmulatorInfo
    storage_endpoint: str | None


def emulator_start(settings: Settings, *, port: int = 0, boot_delay_s: float = 1.0, grace_s: float = 30.0,
                   auth: bool = True) -> EmulatorStarted:
    """``tpuops emulator start``: the running emulator of this home, else a new one in the background.

    With a ``gs://`` store it also serves that bucket to the emulated nodes as storage.googleapis.com;
    an emulator already running without it is refused (``UsageError``: stop it, then start).
    """
    from tpuops.emulator import start_background, status, storage_endpoint
    from tpuops.session import emulated_buckets, emulated_image_python, require_served

    info = status(settings.emulator_dir)
    if info is None:
        info = start_background(
            settings.emulator_dir, port, boot_delay_s=boot_delay_s, grace_s=grace_s,
            image_python=emulated_image_python(settings), auth=auth, gcs_buckets=emulated_buckets(settings))
    else:
        require_served(settings)
    return EmulatorStarted(info, storage_endpoint(settings.emulator_dir))


def emulator_stop(settings: Settings) -> bool:
    """``tpuops emulator stop``: stop it and every node process it started; whether it was running."""
    from tpuops.emulator import stop

    return stop(settings.emulator_dir)


def emulator_status(settings: Settings) -> EmulatorInfo | None:
    """``tpuops emulator status``: where the emulator of this home listens, or ``None``."""
    from tpuops.emulator import status

    return status(settings.emulator_dir)


def _admin(settings: Settings) -> AdminClient:
    from tpuops.emulator import AdminClient

    info = emulator_status(settings)
    if info is None:
        raise UsageError("the emulator is not running (start it with 'tpuops emulator start')")
    return AdminClient(info.endpoint)


def emulator_preempt(settings: Settings, node: str, *, zone: str | None = None,
                     grace_s: float | None = None) -> dict[str, Any]:
    """``tpuops emulator preempt NODE``: SIGTERM, grace period, SIGKILL, PREEMPTED; the node (v2 JSON)."""
    return _admin(settings).preempt(settings.project, zone or settings.zones[0], node, grace_s=grace_s)


def emulator_fault(settings: Settings, *, clear: bool = False, **faults: Any) -> dict[str, Any]:
    """``tpuops emulator fault``: set the faults given (``None`` leaves one as it is), or ``clear`` them all.

    Returns the faults in force. A value the emulator would refuse is refused before it is looked for.
    """
    from tpuops.emulator import check_faults

    changes = {key: value for key, value in faults.items() if value is not None}
    check_faults(changes)
    admin = _admin(settings)
    if clear:
        return admin.clear_faults()
    return admin.set_faults(**changes)


def emulator_billing(settings: Settings) -> list[dict[str, Any]]:
    """``tpuops emulator billing``: the billing truth, every READY interval of every node."""
    return _admin(settings).billing()


def runtime_status(settings: Settings) -> RuntimeReport:
    """``tpuops runtime status``: the search order, the runtime used and its TensorFlow."""
    from tpuops.tfenv.locate import report

    return report(settings)


def runtime_install(settings: Settings, *, path: Path | None = None, force: bool = False,
                    base_python: str | None = None, progress: Callable[[str], None] | None = None) -> Built:
    """``tpuops runtime install``: build the TF 2.9 runtime from the packaged pins (a no-op when built)."""
    from tpuops.tfenv.build import install
    from tpuops.tfenv.locate import home_runtime

    return install(path or home_runtime(settings), force=force, base_python=base_python,
                   progress=progress or (lambda _text: None))


@dataclass(frozen=True)
class NotifyTested:
    """``tpuops notify test``: per target, what happened (never its URL or password)."""

    targets: list[dict[str, str]]

    @property
    def exit_code(self) -> int:
        return 0 if all(t["result"] == "sent" for t in self.targets) else 1


def notify_test(settings: Settings) -> NotifyTested:
    """``tpuops notify test``: one test message to every ``[notify.targets]`` target (docs/notifications.md).

    Raises ``UsageError`` before sending anything when no target is configured, a secret cannot be read or an
    SMTP host does not answer.
    """
    import time

    from tpuops.notify.outbox import test_all

    results = test_all(settings.notify, settings.project, time.time())
    return NotifyTested([{"target": name, "kind": kind, "result": result} for name, kind, result in results])


@dataclass(frozen=True)
class Executed:
    """``tpuops exec``: what each worker gave back, in worker order, and the exit code of the whole."""

    node: str
    workers: list[WorkerRan]

    @property
    def exit_code(self) -> int:
        """The worst worker's code: the highest (a transport's own 255 above any command's), 0 when all are."""
        return max((ran.code for ran in self.workers), default=0)

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "exit_code": self.exit_code, "workers": [r.to_json() for r in self.workers]}


def exec_on(settings: Settings, node: str, command: list[str], *, worker: str = "0",
            timeout_s: float = 600.0) -> Executed:
    """``tpuops exec NODE --worker N|all -- CMD ARG...``: run the program ``CMD`` with its arguments, each exactly as
    given, on the node's workers one after the other, as ``gcloud compute tpus tpu-vm ssh --worker=W --command``
    would with the arguments quoted once for the worker's shell (so ``sh -c 'exit 7'`` exits 7 and ``echo 'a; b'``
    prints ``a; b``). How a worker is reached is the provider's capability (``RunsCommands``): on the local
    emulator a worker's own directory, HOME and metadata server; on Cloud TPU ``gcloud ... ssh``.

    Raises:
        UsageError: no command or an empty program name, ``worker`` is not one of the node's workers, no node of
            that name in view, or a provider that cannot reach its workers (one line each).
        PreconditionFailed: the node is not READY (nothing runs on it).
    """
    from tpuops.core.errors import PreconditionFailed
    from tpuops.core.naming import check_node_name
    from tpuops.providers.nodes import NodeState
    from tpuops.session import fleet, worker_commands

    if not command or not command[0].strip():
        raise UsageError("give the program to run after '--', e.g. tpuops exec NODE --worker all -- uptime "
                         "(a shell line: -- sh -c 'cd /tmp && ls')")
    check_node_name(node)  # the client library refuses a name that is not one with a ValueError
    nodes = fleet(settings)
    reach = worker_commands(settings, nodes.provider)  # a provider without the capability: refused before asking
    found = nodes.locate(node)
    if not found:
        raise UsageError(f"no node {node!r} in {', '.join(settings.zones)} ('tpuops status' lists them)")
    target = found[0]
    workers = slice_workers(settings, target.accelerator, worker, f"node {node}")
    if target.state is not NodeState.READY:
        raise PreconditionFailed(f"node {node} is {target.state.value}: nothing runs on it")
    return Executed(node, [reach.run_on_worker(target.zone, node, number, command, timeout_s=timeout_s)
                           for number in workers])


def slice_workers(settings: Settings, accelerator: str | Sequence[str], worker: str, what: str) -> list[int]:
    """The workers ``--worker`` names on a node of ``accelerator``: ``all``, or one number below its host count,
    as the configured provider's offers shape it (also for a node not READY yet, whose workers are not listed).
    An elastic run's sizes (a sequence) are checked against the size with the most hosts, whichever attempt ran
    on it: its log holds every worker any of its slices had.

    Raises:
        UsageError: one line naming the hosts ``what`` has and the values that would be right.
    """
    from tpuops.providers.offers import hosts_of
    from tpuops.providers.registry import offers_of

    offers = offers_of(settings.node_provider)
    sizes = [accelerator] if isinstance(accelerator, str) else list(dict.fromkeys(accelerator))
    hosts_by_size = {size: hosts_of(offers, size) for size in sizes}
    hosts = max(hosts_by_size.values())
    if worker == "all":
        return list(range(hosts))
    if not (worker.isascii() and worker.isdigit()) or int(worker) >= hosts:
        choices = "0 or all" if hosts == 1 else f"0-{hosts - 1} or all"
        shapes = " or ".join(f"{size} with {count} host{'s' if count > 1 else ''}"
                             for size, count in hosts_by_size.items())
        runs_on = f"is a {shapes}" if len(sizes) == 1 else f"runs on a {shapes}"
        raise UsageError(f"--worker {worker}: {what} {runs_on}; give {choices}")
    return [int(worker)]
