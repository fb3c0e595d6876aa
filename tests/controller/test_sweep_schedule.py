"""``tpuops schedule``: the pass script runs a real reconcile pass under a lock; cron lines are merged."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import poll

from tpuops.schedule import MARKER, Schedule, merge_crontab, render_script, write_script

pytestmark = pytest.mark.emulator


@pytest.fixture
def home(tmp_path: Path, emulator: Any) -> Iterator[tuple[Path, Path, dict[str, str]]]:
    config = tmp_path / "tpuops.toml"
    config.write_text(f'tpu_endpoint = "{emulator.endpoint}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUOPS_")}
    env.update(TPUOPS_HOME=str(tmp_path / "home"), TPUOPS_CONFIG=str(config))
    yield tmp_path / "home", config, env


def test_crontab_lines_of_other_programs_and_homes_are_kept() -> None:
    mine = Schedule(home=Path("/h/a"), config=None, workdir=Path("/w"))
    other = f"*/5 * * * * something {MARKER} /h/b"
    existing = f"MAILTO=x\n0 * * * * backup.sh\n{other}\n*/9 * * * * old {MARKER} /h/a\n"
    merged = merge_crontab(existing, mine.cron_line(), mine.home)
    assert merged.splitlines() == ["MAILTO=x", "0 * * * * backup.sh", other, mine.cron_line()]
    assert merge_crontab(merged, mine.cron_line(), mine.home) == merged  # installing twice changes nothing
    assert merge_crontab(merged, None, mine.home).splitlines() == ["MAILTO=x", "0 * * * * backup.sh", other]


def test_the_pass_script_runs_a_reconcile_pass_with_this_config_and_records_it(home: tuple[Path, Path, dict[str, str]],
                                                                               tmp_path: Path) -> None:
    folder, config, env = home
    schedule = Schedule(home=folder, config=config, workdir=tmp_path, tpuops=f"{sys.executable} -m tpuops")
    script = write_script(schedule)
    assert os.access(script, os.X_OK) and f"TPUOPS_CONFIG={config}" in render_script(schedule)
    bare = {k: v for k, v in env.items() if not k.startswith("TPUOPS_")}  # cron's environment: nothing of ours
    done = subprocess.run(["sh", "-c", schedule.command()], env=bare, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr + (folder / "schedule" / "reconcile.log").read_text()
    meta = json.loads((folder / "schedule" / "last-pass.meta.json").read_text())
    assert meta["exit_code"] == 0 and meta["started"] <= meta["finished"]
    assert json.loads((folder / "schedule" / "last-pass.json").read_text())["runs"] == 0
    status = subprocess.run([sys.executable, "-m", "tpuops", "schedule", "status", "--json"], env=env,
                            capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["last_pass"]["exit_code"] == 0


def test_a_pass_still_running_makes_the_next_one_skip(home: tuple[Path, Path, dict[str, str]], tmp_path: Path) -> None:
    folder, config, env = home
    schedule = Schedule(home=folder, config=config, workdir=tmp_path, tpuops=f"{sys.executable} -m tpuops")
    write_script(schedule)
    holder = subprocess.Popen(["flock", str(schedule.lock), "sleep", "30"])  # a long pass holding the lock
    try:
        poll(lambda: subprocess.run(["flock", "-n", str(schedule.lock), "true"], check=False).returncode == 1,
             "the long pass to hold the lock")
        done = subprocess.run(["sh", "-c", schedule.command()], env=env, capture_output=True, text=True, timeout=60,
                              check=False)
        assert done.returncode == 1  # flock -n: the lock is taken, nothing ran
        assert not (folder / "schedule" / "last-pass.meta.json").exists()
    finally:
        holder.kill()
        holder.wait(10)


def test_install_status_uninstall_with_the_real_crontab(home: tuple[Path, Path, dict[str, str]],
                                                        tmp_path: Path) -> None:
    if shutil.which("crontab") is None:
        pytest.skip("crontab is not installed (make test installs the Debian package 'cron')")
    _, _, env = home
    saved = subprocess.run(["crontab", "-l"], capture_output=True, text=True, check=False)

    def tpuops(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tpuops", "schedule", *args], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60, check=False)

    try:
        installed = tpuops("install", "--every", "7", "--json")
        assert installed.returncode == 0, installed.stderr
        line = json.loads(installed.stdout)["cron"]
        assert line.startswith("*/7 * * * * ") and "flock -n" in line
        listed = subprocess.run(["crontab", "-l"], capture_output=True, text=True, check=True).stdout
        assert listed.count(MARKER) - saved.stdout.count(MARKER) == 1 and line in listed
        assert json.loads(tpuops("status", "--json").stdout)["cron"] == line
        assert json.loads(tpuops("uninstall", "--json").stdout) == {"removed": True}
        assert line not in subprocess.run(["crontab", "-l"], capture_output=True, text=True, check=False).stdout
        assert tpuops("install", "--every", "0").returncode == 2
    finally:
        if saved.returncode == 0:
            subprocess.run(["crontab", "-"], input=saved.stdout, text=True, check=True)
        else:
            subprocess.run(["crontab", "-r"], capture_output=True, check=False)


@pytest.mark.parametrize("torn", ['{"exit_code": 0, "star', "[1, 2]", '"done"'])
def test_status_survives_a_torn_or_foreign_last_pass_record(tmp_path: Path, torn: str) -> None:
    from tpuops.schedule import status

    schedule = Schedule(home=tmp_path / "home", config=None, workdir=tmp_path, every_minutes=5)
    schedule.folder.mkdir(parents=True)
    (schedule.folder / "last-pass.meta.json").write_text(torn)
    (schedule.folder / "last-pass.json").write_text(torn)
    assert status(schedule)["last_pass"] is None
    (schedule.folder / "last-pass.meta.json").write_text('{"exit_code": 0}')
    assert status(schedule)["last_pass"] == {"exit_code": 0, "runs": None, "actions": 0, "errors": {}, "sweeps": {}}
