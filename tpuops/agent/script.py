"""Script mode: ``train`` runs the user's own program (``spec.script.command``) unchanged.

The agent does not touch the TPU here (the script initialises it; two processes cannot share
it): it starts the command in ``experiments_dir`` with the environment below, ships every line
the program prints to the run's log, keeps ``status.json`` beating, forwards the preemption
notice (the metadata flag as well as SIGTERM) to the program as SIGTERM, and turns the exit
code into the run's exit class.

Environment, besides what the VM gives (``python``/``python3`` as the command's program is the
agent's own interpreter, the one with TensorFlow 2.9):

===============================  ==========================================================
TPU_NAME                         "local" unless set: ``TPUClusterResolver(tpu=...)`` on a TPU VM
TPUOPS_RUN_ID, TPUOPS_ATTEMPT    the run and this attempt's number (1, 2, ...)
TPUOPS_RUN_DIR                   ``<store>/runs/<run>`` (gs:// on GCP, a plain path locally:
                                 use ``tf.io.gfile``)
TPUOPS_CHECKPOINT_DIR            ``<run>/ckpt``; TPUOPS_TENSORBOARD_DIR ``<run>/tb``;
                                 TPUOPS_MODEL_DIR ``<run>/model``
TPUOPS_DATA_<NAME>               the dataset's TFRecord files (its patterns expanded, sorted),
                                 comma-separated (NAME: TRAIN, EVAL; "" when there is none)
TPUOPS_DATA_<NAME>_PATTERN       one glob pattern matching exactly those files, for
                                 ``tf.io.gfile.glob`` / ``Dataset.list_files`` (as Vertex AI's
                                 AIP_TRAINING_DATA_URI is used; ``inputs.one_pattern``); when
                                 no single pattern does (files in several folders), the spec's
                                 patterns comma-separated ("" when there is none)
TPUOPS_DATA_<NAME>_FEATURES      its feature schema as JSON: name -> {dtype, shape, encoding}
TPUOPS_LABEL                     the label feature's name ("" when there is none)
TPUOPS_ALLOW_CPU                 "1" when the run may fall back to the CPU, else "0"
TPUOPS_HPARAMS, TPUOPS_SEED      the run's hparams as JSON; its seed
TPUOPS_CHECKPOINT_EVERY_STEPS, TPUOPS_CHECKPOINT_EVERY_SECONDS, TPUOPS_KEEP_CHECKPOINTS
                                 the schedule the helper callback follows
TPUOPS_REPORT_FILE               a local file the helper's status reporter writes; the agent
                                 merges it into status.json (step, metrics, evals, checkpoint)
===============================  ==========================================================

``PYTHONPATH`` starts with the helper module's directory (``userlib``: ``import tpuops_helper``)
and ``experiments_dir``. With ``hparams_as_flags`` every hparam is appended as ``--name=value``.

Outcome: exit 0 succeeded (also after a preemption notice: the work is done); exit 2
user-error (a usage error: never retried); any other code after a preemption notice
preempted; anything else (an exception, a signal) crashed, which the controller retries per
max_restarts. A run whose reported metrics (the helper's ``StatusReporter``) show a NaN or an
infinity diverged, whatever the code: the program is killed as soon as a report shows one
(SIGKILL: the helper must not checkpoint the diverged weights), and the message names the
reported step and the last checkpoint the program reported. Without the reporter the agent
cannot see a divergence. Progress: ``status.step`` is the reporter's step;
a script without the reporter advances ``step`` by one per line it prints, so that hang
detection sees a script that prints as alive and a silent, stuck one as hung.
"""

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

import tensorflow as tf

from tpuops.agent.inputs import list_files, one_pattern
from tpuops.agent.paths import RunPaths
from tpuops.agent.preemption import PreemptionNotice
from tpuops.agent.status import Status
from tpuops.contract.exits import DivergedExit, UserError, interrupted
from tpuops.contract.runspec import DatasetSpec, RunSpec, ScriptSpec

log = logging.getLogger(__name__)

USERLIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "userlib")
USAGE_EXIT = 2
POLL_SECONDS = 0.2
# A preempted VM gets about 30 s: leave the program most of it to checkpoint, then kill it.
PREEMPTION_GRACE_SECONDS = 25.0
_PYTHONS = ("python", "python3")


class ScriptFailed(RuntimeError):
    """The program ended with a code that is not success, usage error or preemption: a crash."""


def _features(dataset: DatasetSpec) -> str:
    return json.dumps(
        {
            name: {"dtype": f.dtype, "shape": list(f.shape), "encoding": f.encoding}
            for name, f in sorted(dataset.features.items())
        },
        sort_keys=True,
    )


def _flag(name: str, value: Any) -> str:
    return f"--{name}={value if isinstance(value, str) else json.dumps(value)}"


def command(spec: RunSpec, script: ScriptSpec) -> List[str]:
    """The argv to run: the command, the agent's interpreter for python, hparams as flags if asked."""
    argv = list(script.command)
    if argv[0] in _PYTHONS:
        argv[0] = sys.executable
    if script.hparams_as_flags:
        argv += [_flag(name, value) for name, value in sorted(spec.hparams.items())]
    return argv


def environment(spec: RunSpec, script: ScriptSpec, paths: RunPaths, attempt: int, report: str) -> Dict[str, str]:
    """The program's environment: the agent's, plus the variables in the module docstring."""
    env = dict(os.environ)
    env.setdefault("TPU_NAME", "local")
    features = _features(spec.dataset)
    for name, patterns in (("TRAIN", spec.dataset.train), ("EVAL", spec.dataset.eval)):
        files = list_files(patterns, f"dataset.{name.lower()}")
        env[f"TPUOPS_DATA_{name}"] = ",".join(files)
        env[f"TPUOPS_DATA_{name}_PATTERN"] = one_pattern(files) or ",".join(patterns)
        env[f"TPUOPS_DATA_{name}_FEATURES"] = features
    path = [USERLIB, os.path.abspath(spec.experiments_dir or "."), env.get("PYTHONPATH", "")]
    env.update(
        {
            "PYTHONPATH": os.pathsep.join(p for p in path if p),
            "PYTHONUNBUFFERED": "1",
            "TPUOPS_RUN_ID": spec.run_id,
            "TPUOPS_ATTEMPT": str(attempt),
            "TPUOPS_RUN_DIR": paths.run_dir,
            "TPUOPS_CHECKPOINT_DIR": paths.ckpt,
            "TPUOPS_TENSORBOARD_DIR": paths.tb,
            "TPUOPS_MODEL_DIR": paths.model,
            "TPUOPS_LABEL": spec.dataset.label or "",
            "TPUOPS_ALLOW_CPU": "1" if spec.allow_cpu_fallback else "0",
            "TPUOPS_HPARAMS": json.dumps(spec.hparams, sort_keys=True),
            "TPUOPS_SEED": str(spec.seed),
            "TPUOPS_CHECKPOINT_EVERY_STEPS": str(script.checkpoint_every_steps),
            "TPUOPS_CHECKPOINT_EVERY_SECONDS": str(script.checkpoint_every_seconds),
            "TPUOPS_KEEP_CHECKPOINTS": str(script.keep_checkpoints),
            "TPUOPS_HEARTBEAT_SECONDS": str(spec.heartbeat_seconds),
            "TPUOPS_REPORT_FILE": report,
        }
    )
    return env


class _Output(threading.Thread):
    """Copies the program's output to the run's log, line by line, counting lines."""

    def __init__(self, stream: Any) -> None:
        super().__init__(name="tpuops-script-output", daemon=True)
        self._stream = stream
        self.lines = 0

    def run(self) -> None:
        for raw in iter(self._stream.readline, b""):
            log.info("| %s", raw.decode("utf-8", "replace").rstrip("\n"))
            self.lines += 1


class _Reports:
    """Merges the helper's report file into status.json when it changes."""

    def __init__(self, path: str, status: Status) -> None:
        self._path = path
        self._status = status
        self._mtime: Optional[float] = None
        self._saved: Optional[int] = None
        self._resumed: Optional[int] = None
        self.seen = False

    def merge(self) -> None:
        try:
            mtime = os.stat(self._path).st_mtime
            if mtime == self._mtime:
                return
            with open(self._path) as src:
                report = json.load(src)
        except (OSError, ValueError):  # not written yet, or replaced under us: next poll
            return
        self._mtime, self.seen = mtime, True
        resumed = report.get("resumed_from_step")
        if isinstance(resumed, int) and resumed != self._resumed:  # the script restored a checkpoint
            self._status.resumed(resumed)
            self._resumed = resumed
        fields = {key: report[key] for key in ("step", "last_checkpoint_step") if key in report}
        if report.get("total_steps"):
            fields["total_steps"] = report["total_steps"]
        # A new checkpoint is news for the controller (as in the built-in loop): written at once.
        saved = fields.get("last_checkpoint_step")
        self._status.update(write=saved is not None and saved != self._saved, **fields)
        self._saved = saved if saved is not None else self._saved
        for group, values in (report.get("metrics") or {}).items():
            self._status.set_metrics(group, values)
        for entry in report.get("evals") or []:
            self._status.add_eval(entry["step"], entry["metrics"])


def _check_program(argv: List[str], cwd: str) -> None:
    if (
        argv[0] == sys.executable
        and len(argv) > 1
        and argv[1].endswith(".py")
        and not os.path.isfile(os.path.join(cwd, argv[1]))
    ):
        raise UserError(f"script.command: {argv[1]} is not in the bundle's experiments directory")


def run(spec: RunSpec, status: Status, notice: PreemptionNotice, paths: RunPaths, attempt: int) -> None:
    """Run the script to its end; raises for every outcome but success (see the module docstring)."""
    script = spec.script
    assert script is not None
    cwd = os.path.abspath(spec.experiments_dir or ".")
    argv = command(spec, script)
    _check_program(argv, cwd)
    tf.io.gfile.makedirs(paths.ckpt)
    status.update(total_steps=script.total_steps, device=None)
    with tempfile.TemporaryDirectory(prefix="tpuops-script-") as scratch:
        reports = _Reports(os.path.join(scratch, "report.json"), status)
        env = environment(spec, script, paths, attempt, os.path.join(scratch, "report.json"))
        log.info("script mode: running %s in %s", " ".join(argv), cwd)
        status.set_phase("training")
        child = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        output = _Output(child.stdout)
        output.start()
        code = _supervise(child, notice, reports, output, status)
        output.join(timeout=5)
        reports.merge()
    diverged = status.nonfinite_metrics()
    if diverged:
        saved = status.get("last_checkpoint_step")
        good = f"last checkpoint it reported: step {saved}" if saved is not None else "it reported no checkpoint"
        raise DivergedExit(f"training diverged: the script reported {', '.join(diverged)} NaN or infinite at "
                           f"step {status.get('step')}; {good}")
    if code == 0:  # finished, even if a notice came while it was wrapping up
        return
    if notice.requested():
        raise interrupted(notice.stopped, notice.reason, f"and the script exited with code {code}")
    if code == USAGE_EXIT:
        raise UserError(f"the script exited with code {USAGE_EXIT} (a usage error): not retried")
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    raise ScriptFailed(f"the script {how}")


def _supervise(
    child: "subprocess.Popen[bytes]", notice: PreemptionNotice, reports: _Reports, output: _Output, status: Status
) -> int:
    """Wait for the program, forwarding the notice and merging reports; returns its exit code."""
    forwarded_at: Optional[float] = None
    while True:
        code = child.poll()
        reports.merge()
        if not reports.seen:
            status.update(step=output.lines)
        if code is not None:
            return code
        if status.nonfinite_metrics():
            log.error("the script reported %s NaN or infinite: killing it", ", ".join(status.nonfinite_metrics()))
            child.kill()
            return child.wait()
        if notice.requested() and forwarded_at is None:
            log.warning("preemption notice (%s): sending SIGTERM to the script", notice.reason)
            child.send_signal(signal.SIGTERM)
            forwarded_at = time.monotonic()
        elif forwarded_at is not None and time.monotonic() - forwarded_at > PREEMPTION_GRACE_SECONDS:
            log.warning("the script did not stop %.0f s after SIGTERM: killing it", PREEMPTION_GRACE_SECONDS)
            child.kill()
        time.sleep(POLL_SECONDS)
