"""``tpuops profile`` end to end: real TF 2.9 on the emulator, a one-host run and a v2-32 slice (4 workers).

- The profile is asked for through the store as soon as the run is declared (before its agent trains), so the
  agent serves it from its first call; the run goes on. A one-host capture has one trace, a slice's one per
  worker, each written by that worker's own profiler service.
- Every worker's trace holds events, read back by TensorBoard's Profile tab's own converter
  (``tensorboard_plugin_profile``'s ``xspace_to_tool_data``: the trace viewer per host, the overview page over all),
  in the TF 2.9 runtime.
- A profiled run's final weights are bit-identical to an unprofiled run's (the window cuts the calls at its
  edges, which changes no step's result); the experiment's own ``profile:`` window too.
- A window cut short by a preemption is recorded discarded, its trace removed, and the resumed attempt captures the
  request again; the run still ends bit-identical to an unprofiled one. On a slice too, where the agent is killed
  inside its call (the other workers stop at once) and leaves the window's folder without a record, which no reader
  takes for a profile.
- A profile of a run that is not running is one line, exit 2; ``tpuops tensorboard --no-serve`` copies the
  complete captures and says how to serve them.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import (
    COMPARE_CHECKPOINTS,
    TF_PYTHON,
    digits_project,
    poll,
    run_dir,
    run_status,
    small_digits,
    start_cli,
    start_tf_emulator,
)

from tpuops.emulator.control import AdminClient, EmulatorInfo, stop

pytestmark = [pytest.mark.emulator, pytest.mark.tf, pytest.mark.slow]

HOST_STEPS, SLICE_STEPS, LONG_STEPS = 60, 40, 300

# Run by TF_PYTHON with xplane paths: every host's trace through the plugin's trace viewer, all through the
# overview page; prints what each held.
READ_BACK = '''
import json, sys
from tensorboard_plugin_profile.convert import raw_to_tool_data
out = {}
for path in sys.argv[1:]:
    trace = json.loads(raw_to_tool_data.xspace_to_tool_data([path], "trace_viewer^", None))
    out[path] = sum(1 for event in trace["traceEvents"] if event.get("ph") == "X")
overview = raw_to_tool_data.xspace_to_tool_data(sys.argv[1:], "overview_page^", None)
print(json.dumps({"events": out, "overview": len(overview or "")}))
'''


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, EmulatorInfo]]:
    work = tmp_path_factory.mktemp("profile")
    text = small_digits(digits_project(work), steps=HOST_STEPS).replace(
        "target:\n  metric: accuracy\n  at_least: 0.95\n", "")
    (work / "experiments" / "host.yaml").write_text(text)
    (work / "experiments" / "planned.yaml").write_text(text + "profile:\n  at_step: 20\n  steps: 10\n")
    (work / "experiments" / "long.yaml").write_text(text.replace(f"steps: {HOST_STEPS}", f"steps: {LONG_STEPS}"))
    sliced = text.replace("per_replica: 32", "per_replica: 8").replace("accelerator: v3-8", "accelerator: v2-32")
    (work / "experiments" / "slice.yaml").write_text(sliced.replace(f"steps: {HOST_STEPS}", f"steps: {SLICE_STEPS}"))
    (work / "experiments" / "slice-long.yaml").write_text(sliced.replace(f"steps: {HOST_STEPS}",
                                                                         f"steps: {LONG_STEPS}"))
    info = start_tf_emulator(work / "home" / "emulator", grace_s=20.0)
    yield work, info
    stop(info.state_dir)


def _cli(work: Path, info: EmulatorInfo, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    proc = start_cli(work, info, *args)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _train(work: Path, info: EmulatorInfo, spec: str, run: str) -> subprocess.Popen[str]:
    return start_cli(work, info, "train", f"experiments/{spec}.yaml", "--name", run, "--json")


def _succeeded(proc: subprocess.Popen[str]) -> dict:
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out)


def _profiled(work: Path, info: EmulatorInfo, spec: str, run: str) -> tuple[dict, dict]:
    """Train ``run`` asking for a 5-step profile once it is declared: (the capture, the run's result)."""
    train = _train(work, info, spec, run)
    poll((run_dir(work, run) / "run.json").exists, f"run {run} declared", timeout_s=300)
    asked = _cli(work, info, "profile", run, "--steps", "5", "--json")
    assert asked.returncode == 0, asked.stderr[-3000:]
    return json.loads(asked.stdout), _succeeded(train)


def _read_back(work: Path, capture: dict) -> dict:
    folder = work / "home" / "store" / capture["folder"]
    traces = sorted(str(p) for p in folder.glob("plugins/profile/*/*.xplane.pb"))
    assert traces, f"no trace under {folder}"
    read = subprocess.run([str(TF_PYTHON), "-c", READ_BACK, *traces], capture_output=True, text=True, timeout=600,
                          check=False)
    assert read.returncode == 0, read.stderr[-3000:]
    return json.loads(read.stdout.strip().splitlines()[-1])


def _same_result(work: Path, left: str, right: str, step: int) -> None:
    """The two runs' final weights and optimizer slots are bit-identical, and so is their eval loss trajectory at every
    step both evaluated (an attempt killed inside a call never evaluated the step it had just saved, which its
    resumed attempt does not redo; the train metrics are not a result: they are averaged over each heartbeat's
    calls, which timing decides)."""
    evals = [{point["step"]: point["metrics"] for point in run_status(work, run)["evals"]} for run in (left, right)]
    both = sorted(set(evals[0]) & set(evals[1]))
    assert len(both) >= len(evals[0]) - 1 and step in both, evals
    assert [evals[0][at] for at in both] == [evals[1][at] for at in both], evals
    compared = subprocess.run([str(TF_PYTHON), "-c", COMPARE_CHECKPOINTS, str(run_dir(work, left) / "ckpt" /
                               f"ckpt-{step}"), str(run_dir(work, right) / "ckpt" / f"ckpt-{step}")],
                              capture_output=True, text=True, timeout=300, check=False)
    assert compared.returncode == 0, compared.stdout + compared.stderr


@pytest.fixture(scope="module")
def plain_host(world: tuple[Path, EmulatorInfo]) -> str:
    work, info = world
    assert _succeeded(_train(work, info, "host", "plain"))["step"] == HOST_STEPS
    return "plain"


def test_a_one_host_profile_loads_in_tensorboard_and_changes_nothing(world: tuple[Path, EmulatorInfo],
                                                                      plain_host: str) -> None:
    work, info = world
    capture, result = _profiled(work, info, "host", "host")
    assert result["step"] == HOST_STEPS
    assert (capture["state"], capture["attempt"], capture["first_step"]) == ("complete", 1, 0)
    assert capture["last_step"] - capture["first_step"] == 5, "the calls are cut at the window's edges"
    assert len(capture["hosts"]) == 1
    read = _read_back(work, capture)
    assert all(events > 0 for events in read["events"].values()), read
    assert read["overview"] > 0
    _same_result(work, plain_host, "host", HOST_STEPS)

    again = _cli(work, info, "profile", "host", "--steps", "5")
    assert again.returncode == 2 and again.stderr.strip().count("\n") == 0, again.stderr
    assert "run host is not running (succeeded)" in again.stderr and "Traceback" not in again.stderr

    board = _cli(work, info, "tensorboard", "host", "--no-serve", "--json")
    assert board.returncode == 0, board.stderr[-3000:]
    shown = json.loads(board.stdout)
    copied = list(Path(shown["logdir"]).glob("profiles/*/plugins/profile/*/*.xplane.pb"))
    assert len(copied) == 1 and shown["argv"][1:3] == ["-m", "tensorboard.main"]


def test_the_experiments_own_window_is_captured_once(world: tuple[Path, EmulatorInfo], plain_host: str) -> None:
    work, info = world
    assert _succeeded(_train(work, info, "planned", "planned"))["step"] == HOST_STEPS
    listed = _cli(work, info, "profile", "planned", "--list", "--json")
    assert listed.returncode == 0, listed.stderr
    captures = json.loads(listed.stdout)
    assert [(c["request"], c["state"], c["first_step"], c["last_step"]) for c in captures] == [
        ("experiment", "complete", 20, 30)]
    _same_result(work, plain_host, "planned", HOST_STEPS)


def test_a_slice_profile_has_a_trace_per_worker_and_changes_nothing(world: tuple[Path, EmulatorInfo]) -> None:
    work, info = world
    plain = _train(work, info, "slice", "slice-plain")
    capture, result = _profiled(work, info, "slice", "slice")
    assert _succeeded(plain)["step"] == result["step"] == SLICE_STEPS
    assert capture["state"] == "complete" and len(capture["hosts"]) == 4, capture
    assert capture["first_step"] == 10, "a slice's window starts once a call of the attempt was timed"
    assert capture["reason"] is None, "every worker's trace came back"
    read = _read_back(work, capture)
    # Every worker's own trace holds the events of the steps it computed in the window: each worker is asked at
    # once (one request naming all four reached workers 1-3 only after worker 0's trace, or gRPC's next backup
    # poll, when they had nothing left to do: an empty trace in 4 runs of 10).
    assert len(read["events"]) == 4 and all(events > 0 for events in read["events"].values()), read
    assert read["overview"] > 0
    _same_result(work, "slice-plain", "slice", SLICE_STEPS)


def _cut_then_resumed(work: Path, info: EmulatorInfo, spec: str, run: str, steps: int) -> tuple[list[dict], dict]:
    """Train ``run`` asking for an hour's profile once it is declared, preempt its node once attempt 1's window is open
    and step 20 saved, and let it finish: (attempt 1's captures, attempt 2's complete one)."""
    train = _train(work, info, spec, run)
    poll((run_dir(work, run) / "run.json").exists, f"run {run} declared", timeout_s=300)
    asked = _cli(work, info, "profile", run, "--seconds", "3600", "--no-wait", "--json")
    assert asked.returncode == 0, asked.stderr[-3000:]
    poll(lambda: any((run_dir(work, run) / "profiles").glob("1-step*"))
         and (run_status(work, run).get("last_checkpoint_step") or 0) >= 20,
         "attempt 1's window open and a checkpoint at step 20", timeout_s=600)
    node = next(n for n in AdminClient(info.endpoint).nodes() if n["name"].endswith(f"/nodes/{run}"))
    AdminClient(info.endpoint).preempt("tpuops-local", node["name"].split("/")[3], run, grace_s=20.0)
    result = _succeeded(train)
    assert (result["step"], result["preemptions"], result["attempts"]) == (steps, 1, 2)
    listed = _cli(work, info, "profile", run, "--list", "--json")
    captures = json.loads(listed.stdout)
    request = json.loads(asked.stdout)["request"]
    assert all(c["request"] == request for c in captures)
    cut = [c for c in captures if c["attempt"] == 1]
    assert [(c["attempt"], c["state"]) for c in captures] == [(1, "discarded")] * len(cut) + [(2, "complete")]
    # cut by the notice (the agent saved and discarded it), or by the other workers' end, which a slice's agent may
    # meet in its call before it reads the notice (UnavailableError): discarded either way, no host's trace kept
    assert all(c["reason"].startswith(("preempted at step", "the attempt ended: ")) and c["hosts"] == []
               for c in cut), cut
    return cut, captures[-1]


def test_a_window_cut_by_a_preemption_is_discarded_then_captured_again(world: tuple[Path, EmulatorInfo]) -> None:
    work, info = world
    plain = _train(work, info, "long", "long-plain")
    assert _succeeded(plain)["step"] == LONG_STEPS
    [cut], whole = _cut_then_resumed(work, info, "long", "cut", LONG_STEPS)
    assert not (work / "home" / "store" / cut["folder"] / "plugins").exists(), "the cut window's trace is removed"
    assert whole["last_step"] == LONG_STEPS and len(whole["hosts"]) == 1
    _same_result(work, "long-plain", "cut", LONG_STEPS)


def test_a_slice_window_cut_by_a_preemption_is_discarded_then_captured_again(
        world: tuple[Path, EmulatorInfo]) -> None:
    """The slice's workers are traced by their own services while the loop goes on: the preemption ends attempt 1
    inside the window (the hour asked is traced at most until the run's estimated end). The emulated slice's other
    workers stop at once, so the agent is killed inside its call, before a boundary could record the window
    discarded: the folder stays without a record, which no reader takes for a profile. Attempt 2 traces all four
    workers again, and the run ends bit-identical to an unprofiled one."""
    work, info = world
    plain = _train(work, info, "slice-long", "slice-long-plain")
    _, whole = _cut_then_resumed(work, info, "slice-long", "slice-cut", LONG_STEPS)
    assert _succeeded(plain)["step"] == LONG_STEPS
    opened = [p.name for p in (run_dir(work, "slice-cut") / "profiles").glob("1-step*")]
    assert len(opened) == 1 and whole["first_step"] > int(opened[0].split("step")[1]) > 0, (opened, whole)
    assert len(whole["hosts"]) == 4 and whole["reason"] is None, whole
    read = _read_back(work, whole)
    assert len(read["events"]) == 4 and all(events > 0 for events in read["events"].values()), read
    board = _cli(work, info, "tensorboard", "slice-cut", "--no-serve", "--json")
    assert board.returncode == 0, board.stderr[-3000:]
    shown = json.loads(board.stdout)
    assert [c["folder"] for c in shown["profiles"]] == [whole["folder"]], "a discarded window is never shown"
    _same_result(work, "slice-long-plain", "slice-cut", LONG_STEPS)
