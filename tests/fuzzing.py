"""The bad-input fuzzer: the CLI's argument space drawn from the Typer app itself, and one case's verdict.

Every leaf command of ``tpuops.__main__.app`` (the whole program) is found by walking its click tree, and every
parameter gets values from a strategy chosen by its declared type (enum choices plus near
misses, numbers at and beyond their edges, names and paths from the nasty corpus), so a new
command or flag is fuzzed without anyone listing it here. A case runs in-process (``run()``,
the real error boundary) inside a sandbox: a working directory, ``TPUOPS_HOME`` and a config
whose provider is ``local`` and whose endpoint is a port nothing listens on, so any command that
reaches for the Cloud TPU API meets an unreachable server and must say so fast.

``verdict`` returns what broke the promise of ``docs/cli.md`` ("Exit codes and streams"), or None:
a traceback, an exit code outside {0, 1, 2}, more than two stderr lines on a usage error, stdout
that is not strict JSON under ``--json``, a file left behind by a refused command, an emulator
left running (it is stopped, and the case fails), more than ``CASE_SECONDS`` of CPU time, more
than ``CASE_MEMORY_MB`` of memory grown during the case, or a hang (still running after
``HANG_SECONDS`` of wall time). The bounds are load-proof: CPU time is what the case itself
spent, however many other processes share the machine, and memory is measured from the case's
own start (the peak is reset for it), whatever tests ran before in the process; wall time only
catches a case that waits forever, with a margin no loaded machine eats. Its ``signature``
(the exception's type and innermost tpuops frame) is what the benchmark counts as a distinct crash.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import resource
import shutil
import signal
import socket
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, get_args, get_origin

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# quick: the unit lane's fixed-seed share (~15 s); long: ``make fuzz``.
settings.register_profile("quick", derandomize=True, max_examples=120, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("long", max_examples=2000, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
PROFILE = os.environ.get("TPUOPS_FUZZ_PROFILE", "quick")

CORPUS = Path(__file__).resolve().parent / "corpus"
REPO = Path(__file__).resolve().parents[1]
CASE_SECONDS = 10.0
CASE_MEMORY_MB = 500
HANG_SECONDS = 120.0

# Commands whose real run changes the machine outside the sandbox (the user's crontab or systemd
# units, a pip install, a server process left running): fuzzed only where a flag keeps them in it.
CONFINED = {("schedule", "install"): ["--dry-run"], ("tensorboard",): ["--no-serve"]}
UNFUZZED = {("schedule", "uninstall"): "edits the user's crontab",
            ("runtime", "install"): "builds a virtual environment with pip",
            ("emulator", "start"): "starts a server that outlives the case",
            ("dashboard",): "serves until interrupted (tests/dashboard/test_dashboard_app.py tests its bad input)"}
# Commands that follow forever by design: fuzzed with a bound that ends them.
BOUNDED = {("watch",): ["--passes", "2", "--interval", "0.1"]}

NASTY_TEXT = ["", " ", "-", "--", "x" * 300, "../../etc/passwd", "a/b", "UPPER", "with space", "é", "\x7f",
              "ftp://example.com/x", "gs://", "gs://bucket/../x", "http://127.0.0.1:1", "1e400", "-1", "nan",
              "team=alpha", "=x", "v9-8", "v3-8", "mars-central1-z", "us-central1-a", "spot", "$(reboot)",
              "name-ok", "a" * 64, "{}", "[]"]
NASTY_NUMBERS = ["0", "-1", "1", "0.5", "1e400", "-1e400", "1e300", "inf", "-inf", "nan", "NaN", "9" * 40,
                 "abc", "", "1_000", "0x10", "3600", "86400"]


@functools.cache
def _refusing() -> socket.socket:
    """A socket bound on 127.0.0.1 and never listening, held while the tests run: connecting to its
    port is refused, and no other server on the machine can take the port meanwhile (a port that was
    only free when looked at could be anyone's a moment later)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


def refusing_port() -> int:
    return int(_refusing().getsockname()[1])


@dataclass(frozen=True)
class Leaf:
    """One leaf command: its words and its parameters (as click declared them)."""

    words: tuple[str, ...]
    params: tuple[Any, ...]


def leaves() -> list[Leaf]:
    """Every leaf command of the app, found by walking the click tree the Typer app builds."""
    import typer.main
    from typer.core import TyperGroup

    from tpuops.__main__ import app

    found: list[Leaf] = []

    def walk(command: Any, words: tuple[str, ...]) -> None:
        if isinstance(command, TyperGroup):
            for name, sub in command.commands.items():
                walk(sub, (*words, name))
        else:
            found.append(Leaf(words, tuple(command.params)))

    walk(typer.main.get_command(app), ())
    return found


def corpus_files() -> list[Path]:
    return sorted(CORPUS.iterdir())


def _scalar_values(annotation: Any, choices: tuple[Any, ...] | None) -> st.SearchStrategy[str]:
    if choices:
        names = [c.value if isinstance(c, Enum) else str(c) for c in choices]
        near = [n[:-1] for n in names] + [n.upper() for n in names] + [n + "x" for n in names]
        return st.sampled_from(names + near)
    if annotation is bool:
        return st.sampled_from(["true", "false", "1", "yes"])
    if annotation in (int, float):
        drawn = st.floats(allow_nan=True, allow_infinity=True).map(repr) | st.integers().map(str)
        return st.sampled_from(NASTY_NUMBERS) | drawn
    if annotation is Path:  # relative: the sandbox's copies (Sandbox.make), so a write lands in the sandbox
        paths = [f"corpus/{p.name}" for p in corpus_files()] + [
            "experiments/digits_cnn.yaml", "sweeps/digits_lr.yaml", "missing/dir/x", ".", "out", "../outside"]
        return st.sampled_from(paths) | st.sampled_from(NASTY_TEXT)
    return st.sampled_from(NASTY_TEXT) | st.text(max_size=24)


def _inside(value: str) -> str:
    """No absolute path reaches a command: whatever it writes stays in the sandbox (cwd and HOME are in it)."""
    return "." + value if value.startswith(("/", "~")) else value


def _values(param: Any) -> st.SearchStrategy[str]:
    descriptor = param.type_descriptor
    annotation = descriptor.annotation
    if get_origin(annotation) is list:
        annotation = get_args(annotation)[0]
    return _scalar_values(annotation, descriptor.choices).map(_inside)


@st.composite
def argv_for(draw: st.DrawFn, leaf: Leaf) -> list[str]:
    """Arguments for ``leaf``: a random subset of its options with drawn values, and its positionals."""
    from typer.core import TyperOption

    argv = [*leaf.words, *CONFINED.get(leaf.words, [])]
    for param in leaf.params:
        if isinstance(param, TyperOption):
            if not draw(st.booleans()) and not param.required:
                continue
            if param.is_flag:
                argv.append(param.opts[0])
                continue
            for _ in range(draw(st.integers(1, 2)) if param.multiple else 1):
                argv += [param.opts[0], draw(_values(param))]
        elif param.required or draw(st.booleans()):
            for _ in range(draw(st.integers(1, 2)) if param.nargs == -1 else 1):
                value = draw(_values(param))
                argv.append(value if not value.startswith("-") else "./" + value)
    return [*argv, *BOUNDED.get(leaf.words, [])]  # last, so that the bound wins over a drawn value


def cli_cases() -> st.SearchStrategy[list[str]]:
    """Any fuzzable command with drawn arguments."""
    return st.sampled_from([leaf for leaf in leaves() if leaf.words not in UNFUZZED]).flatmap(argv_for)


@dataclass
class Sandbox:
    """A working directory, a home and a config pointing at nothing listening; what a case may change."""

    root: Path
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def make(cls, root: Path) -> Sandbox:
        (root / "work").mkdir(parents=True)
        (root / "home").mkdir()
        shutil.copytree(CORPUS, root / "work" / "corpus")
        for folder, name in (("experiments", "digits_cnn.yaml"), ("sweeps", "digits_lr.yaml")):
            (root / "work" / folder).mkdir()
            shutil.copy(REPO / folder / name, root / "work" / folder / name)
        config = root / "work" / "tpuops.toml"
        config.write_text(f'provider = "local"\ntpu_endpoint = "http://127.0.0.1:{refusing_port()}"\n'
                          f'api_deadline_s = 0.3\nstore = "{root / "store"}"\n')
        env = {"TPUOPS_HOME": str(root / "home"), "TPUOPS_CONFIG": str(config), "GOOGLE_CLOUD_PROJECT": "",
               "TPUOPS_TF_PYTHON": sys.executable, "HOME": str(root / "home"),
               "XDG_CONFIG_HOME": str(root / "home" / ".config")}
        return cls(root, env)

    def stop_server(self) -> bool:
        """Stop an emulator a case started in this sandbox's home (no command fuzzed may leave one); True if one ran."""
        from tpuops.emulator.control import stop

        state_dir = self.root / "home" / "emulator"
        return state_dir.is_dir() and stop(state_dir)

    def listing(self) -> set[str]:
        return {str(p.relative_to(self.root)) for p in self.root.rglob("*")}


@dataclass
class Outcome:
    argv: list[str]
    code: int | None
    stdout: str
    stderr: str
    seconds: float
    peak_mb: float
    cpu_seconds: float
    grown_mb: float
    crash: BaseException | None
    new_files: set[str]
    left_server: bool = False


class CaseTimeout(BaseException):
    """Raised into a case that runs longer than HANG_SECONDS (BaseException: no ``except Exception`` eats it)."""


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    def ring(_signum: int, _frame: Any) -> None:
        raise CaseTimeout(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _rss_mb(field: str) -> float | None:
    """``VmRSS`` or ``VmHWM`` (the peak) of this process from /proc, None where there is none."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return None


def reset_peak() -> float:
    """Start a new peak (Linux: ``clear_refs`` 5 sets VmHWM to VmRSS); this process's memory now, in MB."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
    return _rss_mb("VmRSS") or peak_mb()


def peak_mb() -> float:
    """The process's peak since ``reset_peak`` (its lifetime's, where /proc cannot say)."""
    return _rss_mb("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_case(sandbox: Sandbox, argv: list[str], *, stdin: str = "") -> Outcome:
    """Run ``tpuops ARGV`` in-process in ``sandbox`` with its streams captured, its time and memory bounded."""
    from typer.testing import CliRunner

    from tpuops.__main__ import run

    before = sandbox.listing()
    runner = CliRunner()
    code: int | None = None
    crash: BaseException | None = None
    cwd = os.getcwd()
    env = {k: None for k in os.environ if k.startswith("TPUOPS_")} | sandbox.env
    resident = reset_peak()
    started, cpu = time.monotonic(), time.process_time()
    with runner.isolation(input=stdin, env=env) as (out, err, _mixed):
        os.chdir(sandbox.root / "work")
        try:
            with _alarm(HANG_SECONDS):
                code = run(argv)
        except (Exception, CaseTimeout) as caught:
            crash = caught
        finally:
            os.chdir(cwd)
            sys.stdout.flush()
            sys.stderr.flush()
        stdout = out.getvalue().decode(errors="replace")
        stderr = err.getvalue().decode(errors="replace")
    seconds, cpu_seconds, peak = time.monotonic() - started, time.process_time() - cpu, peak_mb()
    return Outcome(argv, code, stdout, stderr, seconds, peak, cpu_seconds, peak - resident, crash,
                   sandbox.listing() - before, sandbox.stop_server())


def _strict_json(text: str) -> str | None:
    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    try:
        json.loads(text, parse_constant=refuse)
    except ValueError as err:
        return f"--json printed no strict JSON ({err}): {text[:200]!r}"
    return None


def verdict(outcome: Outcome) -> str | None:
    """What broke the CLI's promise in this case, or None."""
    if outcome.crash is not None:
        return f"raised {signature(outcome.crash)}"
    if outcome.left_server:
        return "left an emulator running"
    if "Traceback (most recent call last)" in outcome.stderr:
        return "printed a traceback"
    if outcome.code not in (0, 1, 2):
        return f"exit code {outcome.code} (expected 0, 1 or 2)"
    if outcome.cpu_seconds > CASE_SECONDS:
        return f"took {outcome.cpu_seconds:.1f} s of CPU (bound: {CASE_SECONDS:.0f} s)"
    if outcome.grown_mb > CASE_MEMORY_MB:
        return f"grew by {outcome.grown_mb:.0f} MB of memory (bound: {CASE_MEMORY_MB} MB)"
    lines = [line for line in outcome.stderr.splitlines() if line.strip()]
    if outcome.code == 2 and len(lines) > 2:
        return f"{len(lines)} stderr lines for a usage error: {lines[:3]}"
    left = set(outcome.new_files)
    if outcome.code == 2 and left:
        return f"refused, but left {sorted(left)[:3]}"
    if "--json" in outcome.argv and outcome.code == 0 and outcome.stdout.strip():
        return _strict_json(outcome.stdout)
    return None


def signature(crash: BaseException) -> str:
    """A crash's identity: exception type and the innermost frame inside tpuops (or the outermost else)."""
    frames = traceback.extract_tb(crash.__traceback__)
    ours = [f for f in frames if "/tpuops/" in f.filename] or frames[-1:]
    where = f"{Path(ours[-1].filename).name}:{ours[-1].name}" if ours else "?"
    return f"{type(crash).__name__} at {where}"
