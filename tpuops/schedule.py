"""``tpuops schedule install|uninstall|status``: ``tpuops reconcile`` every few minutes, from cron or systemd.

Install writes ``<home>/schedule/pass.sh``, which runs one pass with this invocation's config,
home and working directory and records it (``last-pass.json``: the pass's JSON report;
``last-pass.meta.json``: start, end, exit code; ``reconcile.log``: its stderr), and then adds
a crontab line (or a ``tpuops-reconcile`` service and timer under ``~/.config/systemd/user``)
that runs it under ``flock -n``: a pass still running when the next is due makes the next one
skip, so two scheduled passes never overlap (two passes would be safe, thanks to the leases,
but wasteful). The crontab line carries a marker comment; install replaces it, uninstall
removes it, and lines of other programs are kept as they were.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuops.core.errors import TpuopsError, UsageError

MARKER = "# tpuops-schedule"
UNIT = "tpuops-reconcile"


@dataclass(frozen=True)
class Schedule:
    home: Path
    config: Path | None
    workdir: Path
    every_minutes: int = 5
    tpuops: str = ""

    @property
    def folder(self) -> Path:
        return self.home / "schedule"

    @property
    def script(self) -> Path:
        return self.folder / "pass.sh"

    @property
    def lock(self) -> Path:
        return self.folder / "lock"

    def command(self) -> str:
        return f"{shlex.quote(_flock())} -n {shlex.quote(str(self.lock))} {shlex.quote(str(self.script))}"

    def cron_line(self) -> str:
        return f"*/{self.every_minutes} * * * * {self.command()} {MARKER} {self.home}"


def _flock() -> str:
    found = shutil.which("flock")
    if not found:
        raise UsageError("flock is missing (Debian package util-linux): it keeps two scheduled passes apart")
    return found


def tpuops_executable() -> str:
    """The ``tpuops`` of this environment (so the schedule runs the same version)."""
    script = Path(sys.executable).parent / "tpuops"
    return str(script) if script.is_file() else shutil.which("tpuops") or f"{sys.executable} -m tpuops"


def render_script(schedule: Schedule) -> str:
    q = shlex.quote
    folder = schedule.folder
    env = [f"TPUOPS_HOME={q(str(schedule.home))}"]
    if schedule.config is not None:
        env.append(f"TPUOPS_CONFIG={q(str(schedule.config))}")
    tpuops = schedule.tpuops or tpuops_executable()
    return f"""#!/bin/sh
# Written by 'tpuops schedule install'; 'tpuops schedule uninstall' removes it. One reconcile pass.
cd {q(str(schedule.workdir))} || exit 1
export {' '.join(env)}
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
{tpuops} reconcile --json > {q(str(folder / 'last-pass.json.new'))} 2>> {q(str(folder / 'reconcile.log'))}
code=$?
mv {q(str(folder / 'last-pass.json.new'))} {q(str(folder / 'last-pass.json'))}
printf '{{"started": "%s", "finished": "%s", "exit_code": %d}}\\n' "$started" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  "$code" > {q(str(folder / 'last-pass.meta.json'))}
exit $code
"""


def write_script(schedule: Schedule) -> Path:
    schedule.folder.mkdir(parents=True, exist_ok=True)
    schedule.script.write_text(render_script(schedule))
    schedule.script.chmod(0o755)
    return schedule.script


def merge_crontab(existing: str, line: str | None, home: Path) -> str:
    """``existing`` without this home's tpuops line, plus ``line`` (None: just remove it)."""
    kept = [entry for entry in existing.splitlines() if not entry.endswith(f"{MARKER} {home}")]
    if line is not None:
        kept.append(line)
    return "".join(entry + "\n" for entry in kept)


def _crontab(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    if not shutil.which("crontab"):
        raise UsageError("crontab is missing (Debian package 'cron'); use --systemd, or run 'tpuops watch'")
    return subprocess.run(["crontab", *args], input=stdin, capture_output=True, text=True, check=False, timeout=30)


def _read_crontab() -> str:
    done = _crontab("-l")
    return done.stdout if done.returncode == 0 else ""  # "no crontab for user" is an empty one


def _write_crontab(text: str) -> None:
    done = _crontab("-", stdin=text)
    if done.returncode:
        raise TpuopsError(f"crontab refused the new table: {done.stderr.strip()}")


def _units(schedule: Schedule) -> dict[str, str]:
    return {
        f"{UNIT}.service": f"[Unit]\nDescription=tpuops reconcile pass ({schedule.home})\n\n"
                           f"[Service]\nType=oneshot\nExecStart={schedule.command()}\n",
        f"{UNIT}.timer": f"[Unit]\nDescription=tpuops reconcile every {schedule.every_minutes} minutes\n\n"
                         f"[Timer]\nOnCalendar=*:0/{schedule.every_minutes}\nPersistent=true\n\n"
                         f"[Install]\nWantedBy=timers.target\n",
    }


def _unit_dir() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "systemd" / "user"


def _systemctl(*args: str) -> None:
    try:
        done = subprocess.run(["systemctl", "--user", *args], capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        raise TpuopsError(f"systemctl --user {' '.join(args)}: {err} (use cron instead: drop --systemd)") from None
    if done.returncode:
        raise TpuopsError(f"systemctl --user {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")


def install(schedule: Schedule, *, systemd: bool = False, dry_run: bool = False) -> dict[str, Any]:
    """Write the pass script and the cron line (or systemd units); returns what was (or would be) installed."""
    if not 1 <= schedule.every_minutes <= 59:
        raise UsageError(f"--every {schedule.every_minutes} is not allowed: use 1 to 59 minutes")
    plan: dict[str, Any] = {"script": str(schedule.script), "script_text": render_script(schedule),
                            "lock": str(schedule.lock), "dry_run": dry_run}
    if systemd:
        plan["units"] = {str(_unit_dir() / name): text for name, text in _units(schedule).items()}
    else:
        plan["cron"] = schedule.cron_line()
    if systemd:
        _systemctl("show-environment")  # a user bus to talk to, checked before anything is written (dry run too)
    if dry_run:
        return plan
    if systemd:
        _install_units(schedule)
    else:
        write_script(schedule)
        _write_crontab(merge_crontab(_read_crontab(), schedule.cron_line(), schedule.home))
    return plan


def _install_units(schedule: Schedule) -> None:
    """Write the script and the units, and enable them; a failure part-way removes what was written.

    That is the files and the folders this install made (an empty ``schedule/`` or
    ``systemd/user/`` left behind would be half an install), never a folder that was there before.
    """
    made = [*_missing(schedule.folder), *_missing(_unit_dir())]
    written: list[Path] = []
    try:
        written.append(write_script(schedule))
        _unit_dir().mkdir(parents=True, exist_ok=True)
        for name, text in _units(schedule).items():
            written.append(_unit_dir() / name)
            written[-1].write_text(text)
        _systemctl("daemon-reload")
        _systemctl("enable", "--now", f"{UNIT}.timer")
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        for folder in sorted(made, key=lambda f: len(f.parts), reverse=True):  # the deepest first
            with contextlib.suppress(OSError):  # not empty: something else was put there meanwhile
                folder.rmdir()
        raise


def _missing(folder: Path) -> list[Path]:
    """``folder`` and those of its parents that do not exist yet (what ``mkdir(parents=True)`` would make)."""
    return [path for path in (folder, *folder.parents) if not path.exists()]


def uninstall(schedule: Schedule, *, systemd: bool = False) -> bool:
    """Remove the cron line (or the systemd units) and the script; True if something was installed."""
    found = False
    if systemd:
        for name in _units(schedule):
            path = _unit_dir() / name
            found = found or path.exists()
        if found:
            try:
                _systemctl("disable", "--now", f"{UNIT}.timer")
            finally:  # the files go even when no user bus answers, so status stops reporting them
                for name in _units(schedule):
                    (_unit_dir() / name).unlink(missing_ok=True)
            _systemctl("daemon-reload")
    elif shutil.which("crontab"):
        existing = _read_crontab()
        updated = merge_crontab(existing, None, schedule.home)
        found = updated != existing
        if found:
            _write_crontab(updated)
    schedule.script.unlink(missing_ok=True)
    return found


def status(schedule: Schedule) -> dict[str, Any]:
    """What is installed and what the last scheduled pass did."""
    cron = None
    if shutil.which("crontab"):
        cron = next((line for line in _read_crontab().splitlines() if line.endswith(f"{MARKER} {schedule.home}")),
                    None)
    timer = (_unit_dir() / f"{UNIT}.timer").is_file()
    out: dict[str, Any] = {"cron": cron, "systemd_timer": timer, "script": str(schedule.script)
                           if schedule.script.is_file() else None, "last_pass": None}
    meta = _json_object(schedule.folder / "last-pass.meta.json")
    if meta is not None:
        out["last_pass"] = meta
        data = _json_object(schedule.folder / "last-pass.json") or {}
        out["last_pass"].update(runs=data.get("runs"), actions=len(data.get("acted") or []),
                                errors=data.get("errors") or {}, sweeps=data.get("sweeps") or {})
    return out


def _json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when it is missing, torn (a pass killed mid-write) or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
