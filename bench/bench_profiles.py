"""Benchmark what the profile feature costs a run while nobody asks for a profile, against a run without the profiler
server, under TensorFlow 2.9 on the CPU.

Run:  .venv-tf29/bin/python bench/bench_profiles.py [--calls 5] [--repeats 3] [--rounds 60] [--poll 1.0] [--json]
      [--result]

Three processes train the same small CNN (the digits model's shape at batch 256) with ``--steps-per-call`` steps in
one ``tf.function`` call, from in-memory batches, as the agent's loop does; they differ in what profiling they carry:

- ``without``: nothing: no profiler server, no ``Profiler`` (the baseline the issue names: a run without the
  profiler server);
- ``idle``: what every run of tpuops carries (``tpuops/agent/profiles.py``): the ``Profiler`` of the training loop,
  whose thread reads the store for ``runs/<run>/profile.json`` every ``--poll`` seconds (a run reads it every
  ``heartbeat_seconds``, 10 s by default: the bench polls ten times as often, so the cost it shows is an upper
  bound), and whose ``boundary`` and ``steps_to_edge`` run at every call boundary; no profiler session or server;
- ``server``: the same plus a TensorFlow profiler server listening in the job, not capturing
  (``tf.profiler.experimental.server.start``, what remote capture of one host would keep open, and what a slice's
  workers serve in their runtimes).

A profiler server cannot be stopped inside its process, so each side is its own process, and they take turns on the
CPU: a repetition runs blocks of ``--calls`` calls in the order A B C C B A, ``--rounds`` times, one process at a
time (the others wait on their pipe), so that load from elsewhere on a shared machine lands on all alike. A
repetition's figure is each side's fastest block (and its least CPU a step): many short blocks, because on a
machine shared by a dozen busy processes a block of a second is rarely left alone, and one of 60 ms now and then
is. A side's overhead is ``1 - side / without`` in steps/s (``side / without - 1`` in CPU a step), reported per
repetition and as the median over ``--repeats``. A block of 60 ms holds a read of the request (every ``--poll``
s) less often than not, so the fastest block tends to be one without it: the reads are timed apart (below).
Goal: <= 1 % (issue 40). On a shared 2-core machine the paired figure moves by a few per cent either way between
repetitions, more than the feature can cost, so the bench also times the idle feature's own work alone
(``direct_share``: a call boundary's checks, and one read of the absent request every poll, against the call they
ride on).
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import result_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GOAL = 0.01
HEARTBEAT_S = 10.0
"""How often a run reads the request: the run spec's default ``heartbeat_seconds``."""
BOUNDARY_CALLS, READS = 20000, 500
SIDES = ("without", "idle", "server")


def _model_and_step(steps_per_call: int):  # type: ignore[no-untyped-def]
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(16, 3, activation="relu", input_shape=(8, 8, 1)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    optimizer = tf.keras.optimizers.Adam(0.003)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    images = tf.random.uniform((256, 8, 8, 1))
    labels = tf.random.uniform((256,), maxval=10, dtype=tf.int64)

    @tf.function
    def call() -> tf.Tensor:
        total = tf.constant(0.0)
        for _ in tf.range(steps_per_call):
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(images, training=True))
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))  # noqa: B905 (3.8: no strict)
            total += loss
        return total

    call().numpy()  # traced and warmed up before any block is timed
    return call


def _block(call, calls: int, steps_per_call: int, profiler) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Steps per second over ``calls`` calls, and the process's CPU milliseconds per step (every thread's: the
    profiler's polling thread too), with the idle profiler's work at every boundary when given."""
    step, size, elapsed = 0, 0, 0.0
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        if profiler is not None:
            profiler.boundary(step, size, elapsed)
            profiler.steps_to_edge(step)
        begun = time.perf_counter()
        call().numpy()
        elapsed, size = time.perf_counter() - begun, steps_per_call
        step += steps_per_call
    steps = calls * steps_per_call
    return steps / (time.perf_counter() - started), 1000 * (time.process_time() - cpu) / steps


def child(side: str, steps_per_call: int, poll_s: float, port: int) -> None:
    """One side's process: warm up, say ``ready``, then run a block for every ``block N`` line read, printing its
    steps/s, until ``quit``; at the end print whether a profile session was ever started (nothing asked: never)."""
    import tensorflow as tf

    from tpuops.agent.profiles import Profiler

    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    call = _model_and_step(steps_per_call)
    profiler: Profiler | None = None
    with tempfile.TemporaryDirectory() as store:
        run_dir = Path(store) / "runs" / "bench"
        run_dir.mkdir(parents=True)
        if side in ("idle", "server"):
            profiler = Profiler(str(run_dir), 1, poll_s)
            profiler.start()
        if side == "server":
            tf.profiler.experimental.server.start(port)
        print("ready", flush=True)
        for line in sys.stdin:
            words = line.split()
            if words[:1] != ["block"]:
                break
            print("{:.3f} {:.5f}".format(*_block(call, int(words[1]), steps_per_call, profiler)), flush=True)
        if profiler is not None:
            profiler.close()
        asked = (profiler is not None and profiler.capture is not None) or any(run_dir.iterdir())
    print(json.dumps({"profiler_session_started": asked}), flush=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


class _Side:
    """A side's process, driven one block at a time through its pipes."""

    def __init__(self, side: str, steps_per_call: int, poll_s: float) -> None:
        self.side = side
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child", side, "--steps-per-call", str(steps_per_call), "--poll", str(poll_s),
             "--port", str(self.port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ready(self) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            raise SystemExit(f"the {self.side} side did not start: {line!r}")

    def block(self, calls: int) -> tuple[float, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"block {calls}\n")
        self.proc.stdin.flush()
        rate, cpu = self.proc.stdout.readline().split()
        return float(rate), float(cpu)

    def finish(self) -> dict[str, Any]:
        out, _ = self.proc.communicate("quit\n", timeout=120)
        return json.loads(out.strip().splitlines()[-1])


def _order(repeat: int, rounds: int) -> list[str]:
    """A B C C B A, rotated by the repetition so that no side always runs first."""
    turn = [SIDES[(i + repeat) % len(SIDES)] for i in range(len(SIDES))]
    return (turn + turn[::-1]) * rounds


# Long: one measurement from start to finish: the three processes started and checked, the repetitions in turns, the
# figures and the direct timing put together (one dict the --json prints and the result file keeps).
def measure(calls: int, repeats: int, rounds: int, steps_per_call: int, poll_s: float) -> dict[str, Any]:
    sides = {side: _Side(side, steps_per_call, poll_s) for side in SIDES}
    rows = []
    try:
        for side in sides.values():
            side.ready()
        server_listening = _listening(sides["server"].port)
        for repeat in range(repeats):
            best, least = dict.fromkeys(SIDES, 0.0), dict.fromkeys(SIDES, float("inf"))
            for name in _order(repeat, rounds):
                rate, cpu = sides[name].block(calls)
                best[name], least[name] = max(best[name], rate), min(least[name], cpu)
            rows.append({**{f"{name}_steps_per_s": round(best[name], 1) for name in SIDES},
                         **{f"{name}_overhead": round(1.0 - best[name] / best["without"], 4) for name in SIDES[1:]},
                         **{f"{name}_cpu_ms_per_step": round(least[name], 4) for name in SIDES},
                         **{f"{name}_cpu_overhead": round(least[name] / least["without"] - 1.0, 4)
                            for name in SIDES[1:]}})
        ends = {name: side.finish() for name, side in sides.items()}
    finally:
        for side in sides.values():
            if side.proc.poll() is None:
                side.proc.kill()
    overheads = {name: statistics.median(row[f"{name}_overhead"] for row in rows) for name in SIDES[1:]}
    cpu_overheads = {name: statistics.median(row[f"{name}_cpu_overhead"] for row in rows) for name in SIDES[1:]}
    costs = _direct_costs(repeats)
    call_s = steps_per_call / statistics.median(row["without_steps_per_s"] for row in rows)
    bound = {f"poll_{poll:g}s": (costs["boundary_us"] + costs["read_us"] * call_s / poll) / (call_s * 1e6)
             for poll in (poll_s, HEARTBEAT_S)}
    return {"repetitions": rows, "overhead_median": overheads, "cpu_overhead_median": cpu_overheads, "goal": GOAL,
            "met": all(value <= GOAL for value in overheads.values()),
            "cpu_met": all(value <= GOAL for value in cpu_overheads.values()), "calls_per_block": calls,
            "rounds": rounds, "steps_per_call": steps_per_call, "poll_s": poll_s, "call_ms": call_s * 1e3,
            "server_listening": server_listening, **costs, "direct_share": bound,
            "direct_met": all(share <= GOAL for share in bound.values()),
            "profiler_session_started": any(end["profiler_session_started"] for end in ends.values())}


def _direct_costs(repeats: int) -> dict[str, float]:
    """The idle feature's own work, timed alone (medians of ``repeats``): a call boundary's checks, and one read
    of the absent request (what the polling thread does every heartbeat)."""
    from tpuops.agent.profiles import Profiler

    boundary, read = [], []
    with tempfile.TemporaryDirectory() as store:
        profiler = Profiler(str(Path(store) / "runs" / "bench"), 1, 3600.0)
        profiler._read_request()  # the first read imports TensorFlow, which a run has done long before
        for _ in range(repeats):
            started = time.perf_counter()
            for step in range(BOUNDARY_CALLS):
                profiler.boundary(step, 10, 0.01)
                profiler.steps_to_edge(step)
            boundary.append((time.perf_counter() - started) / BOUNDARY_CALLS * 1e6)
            started = time.perf_counter()
            for _ in range(READS):
                profiler._read_request()
            read.append((time.perf_counter() - started) / READS * 1e6)
    return {"boundary_us": round(statistics.median(boundary), 2), "read_us": round(statistics.median(read), 1)}


def _print(figures: dict[str, Any]) -> None:
    for number, row in enumerate(figures["repetitions"], 1):
        print(f"repetition {number}: without {row['without_steps_per_s']} steps/s; idle profiler "
              f"{row['idle_steps_per_s']} ({100 * row['idle_overhead']:.2f} %); idle + profiler server "
              f"{row['server_steps_per_s']} ({100 * row['server_overhead']:.2f} %)")
        print(f"  CPU ms a step: without {row['without_cpu_ms_per_step']}; idle profiler {row['idle_cpu_ms_per_step']} "
              f"({100 * row['idle_cpu_overhead']:.2f} %); idle + profiler server {row['server_cpu_ms_per_step']} "
              f"({100 * row['server_cpu_overhead']:.2f} %)")
    for key, what in (("overhead_median", "steps/s"), ("cpu_overhead_median", "CPU a step")):
        print(f"median overhead in {what}: " + ", ".join(f"{name} {100 * value:.2f} %" for name, value
                                                        in figures[key].items()) + f" (goal <= {100 * GOAL:g} %)")
    print(f"direct: {figures['boundary_us']} us per call boundary, {figures['read_us']} us per request read, "
          f"a call {figures['call_ms']:.1f} ms: " + ", ".join(
              f"{100 * share:.4f} % at {name}" for name, share in figures["direct_share"].items()))


def _write(run: result_file.Run, figures: dict[str, Any], args: argparse.Namespace) -> None:
    percent = "{:.2f} %".format
    rows = figures["repetitions"]
    sides = "without any profiler server or profiler, with the idle profiler every run carries, and with that plus a " \
            "listening profiler server"
    wall = result_file.Table(
        f"Steps/s of the same training calls in three processes taking turns: {sides} (each side's fastest block of "
        "a repetition; overhead against 'without')",
        ["repetition", "without", "idle profiler", "overhead", "idle + profiler server", "overhead"],
        [[str(n), f"{r['without_steps_per_s']:.1f}", f"{r['idle_steps_per_s']:.1f}", percent(100 * r["idle_overhead"]),
          f"{r['server_steps_per_s']:.1f}", percent(100 * r["server_overhead"])] for n, r in enumerate(rows, 1)]
        + [["median", "", "", percent(100 * figures["overhead_median"]["idle"]), "",
            percent(100 * figures["overhead_median"]["server"])]])
    cpu = result_file.Table(
        "CPU milliseconds a step of the same blocks (the process's every thread, the profiler's polling thread "
        "included; each side's least of a repetition)",
        ["repetition", "without", "idle profiler", "overhead", "idle + profiler server", "overhead"],
        [[str(n), f"{r['without_cpu_ms_per_step']:.3f}", f"{r['idle_cpu_ms_per_step']:.3f}",
          percent(100 * r["idle_cpu_overhead"]), f"{r['server_cpu_ms_per_step']:.3f}",
          percent(100 * r["server_cpu_overhead"])] for n, r in enumerate(rows, 1)]
        + [["median", "", "", percent(100 * figures["cpu_overhead_median"]["idle"]), "",
            percent(100 * figures["cpu_overhead_median"]["server"])]])
    direct = result_file.Table(
        "The idle feature's own work timed alone, as a share of one training call "
        f"({figures['call_ms']:.1f} ms, {args.steps_per_call} steps)",
        ["request read every", "per call boundary", "per request read", "share of step time"],
        [[name.replace("poll_", ""), f"{figures['boundary_us']} us", f"{figures['read_us']} us",
          f"{100 * share:.4f} %"] for name, share in figures["direct_share"].items()])
    verdict, verdict_yes = {True: "met", False: "not met"}, {True: "yes", False: "no"}
    run.write(figures, [wall, cpu, direct], notes=[
        f"Goal <= {100 * GOAL:g} % of step time: {verdict[figures['met']]} by the paired steps/s medians, "
        f"{verdict[figures['cpu_met']]} by the CPU a step, {verdict[figures['direct_met']]} by the direct timing. "
        f"Blocks of {args.calls} calls of {args.steps_per_call} steps, A B C C B A {args.rounds} times a repetition; "
        f"the request was read every {args.poll:g} s (a run reads it every heartbeat, 10 s by default); the server "
        f"side's profiler server was listening: {verdict_yes[figures['server_listening']]}; a profile session started "
        f"in any process: {verdict_yes[figures['profiler_session_started']]}. An overhead below zero is the machine's "
        "noise (that side was the faster one in the repetition): on a shared machine under load the paired steps/s "
        "move by more than the feature costs, which the last table times directly (each call boundary's checks and "
        "one read of the absent request, against the call they ride on)."])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=60, help="A B C C B A turns per repetition")
    parser.add_argument("--steps-per-call", type=int, default=10)
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between reads of the request")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    result_file.add_argument(parser)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps_per_call, args.poll, args.port)
        return
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    run = result_file.Run("bench_profiles")
    figures = measure(args.calls, args.repeats, args.rounds, args.steps_per_call, args.poll)
    if args.json:
        print(json.dumps(figures, indent=1))
    else:
        _print(figures)
    if args.result:
        _write(run, figures, args)


if __name__ == "__main__":
    main()
