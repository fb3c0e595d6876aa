"""Benchmark a gs:// store on the emulator against a local one: what TensorFlow's own Cloud Storage path costs.

Run (as root: nodes need mount namespaces):
    .venv/bin/python bench/bench_gcs.py [--repeats 3] [--checkpoint-mb 100,1024] [--input-mb 100]
        [--parts input,checkpoint,requests,recovery] [--baseline DIR] [--json]

One emulator serves bucket ``bench`` through fake-gcs-server and its HTTPS front; every TF 2.9
process below runs with a node's view of the network (``storage.googleapis.com`` is the front,
the emulator's CA trusted), so TF uses the exact code path of a TPU VM. Each repetition measures
the local case and the gs:// case back to back in one process (ours / baseline = gs / local):

- input: the same TFRecord shards (8 of them; 64 float32 + an int64 label per example) through
  the agent's own training stream (``tpuops.agent.inputs.train_dataset``: shuffled, parsed in
  batches of 1,024), one epoch, with op determinism off (a TPU VM's default) and on (the
  default without a TPU); examples per second. Goal: gs:// >= 0.9 of local. With
  ``--baseline DIR`` the same for an older tree, repetitions alternating. Beside it,
  where the time goes: wall and CPU seconds of the TF process, the emulator (whose threads run
  the HTTPS front) and fake-gcs-server (from /proc), for the parsing pipeline and for the
  transport alone (every shard read through ``tf.io.gfile``, nothing parsed).
- checkpoint save and restore of one variable of each ``--checkpoint-mb`` size with
  ``tf.train.Checkpoint``. The largest size is the SIGTERM save as measured (does it fit the 30-s
  notice?); the largest that would fit is extrapolated from its save rate, minus the fixed part
  of a save (the time of a 1-MB save), and labelled so.
- recovery: a ``tpuops train`` of the digits CNN preempted (30-s notice) once a checkpoint at step
  200 is in, on the gs:// store and on a local one: seconds from the preemption to the resumed
  attempt's first step (emulated boot 0.2 s; the rest is the control plane, the bootstrap, the
  TF import, the prefetch and restore of the newest checkpoint).
- requests per 1,000 steps: a whole ``tpuops train`` of the digits CNN (600 steps: boot, bundle,
  shards, 6 checkpoints, eval, SavedModel) on the gs:// store, counted by the front
  (``storage:<METHOD>`` in the emulator's stats), scaled to 1,000 steps; once, not repeated.

TF's credentials come from ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` here, set to the emulator's own token
(these processes are not a node's, so the metadata door refuses them, as it should); the train
run uses the node's token.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import result_file

from tpuops import emulator, runs
from tpuops.data.samples import digits
from tpuops.emulator import enter_command, unavailable_reason
from tpuops.store import open_store

ROOT = Path(__file__).resolve().parents[1]
TF_PYTHON = ROOT / ".venv-tf29" / "bin" / "python"
BUCKET = "bench"
NOTICE_S = 30.0

_TF = r"""
import json, os, sys, time
import numpy as np
import tensorflow as tf

command, local, remote = sys.argv[1], sys.argv[2], sys.argv[3]
# Processes whose CPU time is charged to each measurement: the emulator (the HTTPS front's threads)
# and fake-gcs-server. The nodes' view shares the machine's PID namespace, so /proc shows them.
SERVERS = json.loads(os.environ.get("BENCH_SERVER_PIDS", "{}"))
TICK = os.sysconf("SC_CLK_TCK")

def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK

def measured(fn, *args):
    # fn's result, and what it cost: wall seconds, CPU seconds of this process (every thread) and of each server.
    before = {name: cpu_s(pid) for name, pid in SERVERS.items()}
    own, wall = time.process_time(), time.perf_counter()
    result = fn(*args)
    cost = {"wall": time.perf_counter() - wall, "tf": time.process_time() - own}
    cost.update({name: cpu_s(pid) - before[name] for name, pid in SERVERS.items()})
    return result, cost

def make(mb):
    rng = np.random.default_rng(0)
    per_shard = (mb << 20) // 8 // 300
    for shard in range(8):
        path = f"{local}/shard-{shard:05d}.tfrecord"
        with tf.io.TFRecordWriter(path) as out:
            for x, y in zip(rng.random((per_shard, 64), dtype=np.float32), rng.integers(0, 10, per_shard)):
                feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
                           "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[y]))}
                out.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        tf.io.gfile.copy(path, f"{remote}/shard-{shard:05d}.tfrecord", overwrite=True)
    return {"examples": per_shard * 8}

def read_rate(root, examples):
    # The agent's own training stream (tpuops.agent.inputs of the tree on PYTHONPATH): one epoch of parsed
    # batches of 1,024.
    from tpuops.agent import inputs
    from tpuops.contract.runspec import DatasetSpec, FeatureSpec
    spec = DatasetSpec(features={"x": FeatureSpec("float32", (64,)), "y": FeatureSpec("int64", ())}, label="y")
    files = sorted(tf.io.gfile.glob(root + "/shard-*.tfrecord"))
    steps = examples // 1024
    data = inputs.train_dataset(files, spec, 0, 1024, 0, examples)
    start = time.perf_counter()
    for _ in data.take(steps):
        pass
    return steps * 1024 / (time.perf_counter() - start)

def read_only(root):
    # Seconds to read every shard's bytes through tf.io.gfile: the transport alone, no parsing.
    start = time.perf_counter()
    for path in sorted(tf.io.gfile.glob(root + "/shard-*.tfrecord")):
        with tf.io.gfile.GFile(path, "rb") as src:
            while src.read(8 << 20):
                pass
    return time.perf_counter() - start

def checkpoint(root, mb):
    variable = tf.Variable(tf.random.uniform([mb << 18]))
    ckpt = tf.train.Checkpoint(v=variable)
    start = time.perf_counter()
    path = ckpt.write(root + f"/ckpt-{mb}mb")
    saved = time.perf_counter() - start
    variable.assign(tf.zeros_like(variable))
    start = time.perf_counter()
    ckpt.read(path).assert_consumed()
    restored = time.perf_counter() - start
    return saved, restored

if command == "make":
    result = make(int(sys.argv[4]))
elif command == "input":
    if sys.argv[5] == "on":
        tf.config.experimental.enable_op_determinism()
    result = {}
    for name, root in (("local", local), ("gcs", remote)):
        result[name], result[name + "_cpu"] = measured(read_rate, root, int(sys.argv[4]))
        result[name + "_transport_s"], result[name + "_transport_cpu"] = measured(read_only, root)
else:
    mb = int(sys.argv[4])
    result = {"small_gcs": checkpoint(remote, 1)[0]}
    for name, root in (("local", local), ("gcs", remote)):
        result[name] = checkpoint(root, mb)
print("RESULT " + json.dumps(result))
"""


def _in_node_view(state_dir: Path, *args: str, tree: Path = ROOT) -> dict[str, Any]:
    """The ``_TF`` step ``args`` in a node's view of the network, importing tpuops from ``tree``."""
    front = emulator.storage_front(state_dir)
    info = emulator.status(state_dir)
    assert front is not None and info is not None
    env = {**os.environ, "CURL_CA_BUNDLE": front.ca_bundle, "SSL_CERT_FILE": front.ca_bundle, "PYTHONPATH": str(tree),
           "GOOGLE_AUTH_TOKEN_FOR_TESTING": emulator.read_token(state_dir) or "", "TF_CPP_MIN_LOG_LEVEL": "2",
           "BENCH_SERVER_PIDS": json.dumps({"front": info.pid, "fake_gcs": front.pid})}
    # cwd: ``python -c`` puts it first on sys.path, before PYTHONPATH.
    done = subprocess.run(enter_command(state_dir / "node-hosts", [str(TF_PYTHON), "-c", _TF, *args]), env=env,
                          cwd=tree, capture_output=True, text=True, check=False, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"bench step {args[0]} failed: {done.stderr[-2000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def _train_env(work: Path, info: emulator.EmulatorInfo, store: str) -> dict[str, str]:
    config = work / "tpuops.toml"
    config.write_text('zones = ["us-central1-a"]\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUOPS_")}
    env.update(TPUOPS_HOME=str(info.state_dir.parent), TPUOPS_CONFIG=str(config), TPUOPS_TPU_ENDPOINT=info.endpoint,
               TPUOPS_POLL_INTERVAL_S="0.2", TPUOPS_STORE=store,
               STORAGE_EMULATOR_HOST=emulator.storage_endpoint(info.state_dir) or "")
    return env


def _train(work: Path, env: dict[str, str], name: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tpuops", "train", str(ROOT / "experiments" / "digits_cnn.yaml"),
                             "--name", name, "--json"], cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finished(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"a train run failed: {err[-2000:]}")
    return json.loads(out)


def _recovery_s(work: Path, info: emulator.EmulatorInfo, store: str, name: str) -> float:
    """Seconds from a preemption (at a checkpoint >= step 200) to the resumed attempt's first step."""
    env = _train_env(work, info, store)
    opened = open_store(store, gcs_endpoint=env["STORAGE_EMULATOR_HOST"] or None)
    proc = _train(work, env, name)
    deadline = time.monotonic() + 600
    while True:
        status = runs.read_status(opened, name) if proc.poll() is None else None
        if status is not None and (status.last_checkpoint_step or 0) >= 200 and str(status.phase) == "training":
            break
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"run {name} ended or stalled before its checkpoint at step 200")
        time.sleep(0.1)
    preempted = time.time()
    emulator.AdminClient(info.endpoint).preempt("tpuops-local", "us-central1-a", name, grace_s=NOTICE_S)
    _finished(proc)
    final = runs.read_status(opened, name)
    assert final is not None and len(final.attempts) >= 2
    return (final.attempts[1].first_step_at or preempted) - preempted


def _requests_per_1000_steps(work: Path, info: emulator.EmulatorInfo) -> dict[str, Any]:
    admin = emulator.AdminClient(info.endpoint)
    admin.reset_stats()
    steps = _finished(_train(work, _train_env(work, info, f"gs://{BUCKET}/tpuops"), "bench-requests"))["step"]
    counts = {name.removeprefix("storage:"): count for name, count in admin.stats().items()
              if name.startswith("storage:")}
    return {"steps": steps, "requests": sum(counts.values()), "by_method": counts,
            "per_1000_steps": sum(counts.values()) * 1000 / steps}


PARTS = ("input", "checkpoint", "requests", "recovery")


def run(repeats: int, checkpoint_mbs: list[int], input_mb: int, recovery_repeats: int,
        parts: tuple[str, ...] = PARTS, baseline: Path | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"repeats": repeats, "rows": [], "samples": {}}
    with tempfile.TemporaryDirectory(prefix="bench-gcs-") as tmp:
        work = Path(tmp)
        state_dir = work / "home" / "emulator"
        info = emulator.start_background(state_dir, boot_delay_s=0.2, grace_s=20.0, image_python=str(TF_PYTHON),
                                        gcs_buckets=[BUCKET])
        try:
            local = work / "local"
            local.mkdir()
            remote = f"gs://{BUCKET}/bench"
            if "input" in parts:
                examples = str(_in_node_view(state_dir, "make", str(local), remote, str(input_mb))["examples"])
                result["input_examples"] = int(examples)
                trees = {"this tree": ROOT, **({f"baseline {baseline}": baseline} if baseline else {})}
                cases = [(f"op determinism {mode}, {label}", mode, tree)
                         for mode in ("off", "on") for label, tree in trees.items()]
                for label, _, _ in cases:
                    result["samples"][f"input {label}"] = []
                for _ in range(repeats):  # repetitions alternate between the cases
                    for label, mode, tree in cases:
                        result["samples"][f"input {label}"].append(
                            _in_node_view(state_dir, "input", str(local), remote, examples, mode, tree=tree))
                for label, _, _ in cases:
                    result["rows"].append(_row(f"training input examples/s, {label}",
                                               result["samples"][f"input {label}"], lambda r, case: r[case]))
                result["input_cpu"] = _input_cpu(result["samples"]["input op determinism off, this tree"])
            if "checkpoint" in parts:
                for mb in checkpoint_mbs:
                    ckpts = [_in_node_view(state_dir, "checkpoint", str(local), remote, str(mb))
                             for _ in range(repeats)]
                    result["samples"][f"checkpoint_{mb}mb"] = ckpts
                    result["rows"].append(_row(f"checkpoint save {mb} MB (s)", ckpts, lambda r, case: r[case][0]))
                    result["rows"].append(_row(f"checkpoint restore {mb} MB (s)", ckpts,
                                               lambda r, case: r[case][1]))
                result["sigterm"] = _largest_sigterm_save(max(checkpoint_mbs),
                                                          result["samples"][f"checkpoint_{max(checkpoint_mbs)}mb"])
            digits(work / "data" / "digits")
            if "requests" in parts:
                result["requests"] = _requests_per_1000_steps(work, info)
            if "recovery" in parts:
                recoveries = [{"gcs": _recovery_s(work, info, f"gs://{BUCKET}/tpuops", f"cut-gcs-{i}"),
                               "local": _recovery_s(work, info, str(work / "home" / "store"), f"cut-local-{i}")}
                              for i in range(recovery_repeats)]
                result["samples"]["recovery"] = recoveries
                result["rows"].append(_row(f"recovery, preemption -> first step (s; {recovery_repeats} runs)",
                                           recoveries, lambda r, case: r[case]))
        finally:
            emulator.stop(state_dir)
    return result


def _row(what: str, samples: list[dict[str, Any]], pick: Any) -> dict[str, Any]:
    """One table row: per-repetition values of each case side by side, their medians and the ratio of medians."""
    gcs = [pick(sample, "gcs") for sample in samples]
    local = [pick(sample, "local") for sample in samples]
    median = statistics.median
    return {"what": what, "gcs": median(gcs), "local": median(local), "ratio": median(gcs) / median(local),
            "gcs_each": gcs, "local_each": local}


def _input_cpu(inputs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Median CPU seconds per process while reading (parsing, and the transport alone), local and gs://."""
    median = statistics.median
    return {f"{case}{part}": {who: median(r[f"{case}{part}_cpu" if part else f"{case}_cpu"][who] for r in inputs)
                              for who in inputs[0][f"{case}_cpu"]}
            for case in ("local", "gcs") for part in ("", "_transport")}


def _largest_sigterm_save(mb: int, ckpts: list[dict[str, Any]]) -> dict[str, float]:
    """The ``mb`` save as measured, and the size that would take the whole notice at its rate (an extrapolation)."""
    median = statistics.median
    save = median(c["gcs"][0] for c in ckpts)
    fixed = median(c["small_gcs"] for c in ckpts)
    rate = mb / max(save - fixed, 1e-6)
    return {"measured_mb": mb, "measured_save_s": save, "fits": save <= NOTICE_S, "fixed_save_s": fixed,
            "gcs_save_mb_per_s": rate, "largest_mb_estimate": max(0.0, (NOTICE_S - fixed) * rate)}


def _print_table(result: dict[str, Any]) -> None:
    print(f"| what (median of {result['repeats']}; each repetition in brackets) | gs:// | local | gs:// / local |")
    print("|---|---|---|---|")
    for row in result["rows"]:
        each = ", ".join(f"{g:.3g}/{v:.3g}" for g, v in zip(row["gcs_each"], row["local_each"], strict=True))
        print(f"| {row['what']} [{each}] | {row['gcs']:.3g} | {row['local']:.3g} | {row['ratio']:.2f} |")
    if "sigterm" in result:
        sig = result["sigterm"]
        print(f"| SIGTERM save of {sig['measured_mb']} MB to gs:// (measured; notice {NOTICE_S:.0f} s) | "
              f"{sig['measured_save_s']:.1f} s ({'fits' if sig['fits'] else 'does not fit'}) | | |")
        print(f"| largest save in {NOTICE_S:.0f} s (extrapolated: {sig['gcs_save_mb_per_s']:.0f} MB/s, "
              f"{sig['fixed_save_s']:.2f} s fixed) | {sig['largest_mb_estimate']:.0f} MB | | |")
    if "requests" in result:
        requests = result["requests"]
        methods = ", ".join(f"{k} {v}" for k, v in sorted(requests["by_method"].items()))
        print(f"| storage requests per 1,000 steps (whole run of {requests['steps']} steps: {methods}) | "
              f"{requests['per_1000_steps']:.0f} | 0 | |")
    if "input_cpu" in result:
        print()
        print("| input: CPU seconds (median) | wall | TF process | emulator (HTTPS front) | fake-gcs-server |")
        print("|---|---|---|---|---|")
        for case, cpu in result["input_cpu"].items():
            print(f"| {case} | {cpu['wall']:.2f} | {cpu['tf']:.2f} | {cpu.get('front', 0):.2f} | "
                  f"{cpu.get('fake_gcs', 0):.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--checkpoint-mb", default="100,1024", help="checkpoint sizes in MB, comma-separated")
    parser.add_argument("--input-mb", type=int, default=100)
    parser.add_argument("--recovery-repeats", type=int, default=3, help="preempted runs per store")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"what to measure, of {','.join(PARTS)}")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="an older tree (git archive COMMIT | tar -x -C DIR) whose training input is measured "
                             "beside this tree's")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    result_file.add_argument(parser)
    args = parser.parse_args()
    measuring = result_file.Run("bench_gcs")
    if args.baseline is not None and not (args.baseline / "tpuops" / "agent" / "inputs.py").is_file():
        print(f"bench_gcs: no tpuops tree at {args.baseline} (git archive COMMIT | tar -x -C DIR)", file=sys.stderr)
        raise SystemExit(2)
    reason = unavailable_reason() or (None if TF_PYTHON.exists() else f"no TF 2.9 runtime at {TF_PYTHON}")
    if reason:
        print(f"bench_gcs: {reason}", file=sys.stderr)
        raise SystemExit(2)
    parts = tuple(part for part in args.parts.split(",") if part)
    if not set(parts) <= set(PARTS):
        print(f"bench_gcs: --parts takes some of {','.join(PARTS)}, not {args.parts}", file=sys.stderr)
        raise SystemExit(2)
    sizes = [int(mb) for mb in args.checkpoint_mb.split(",")]
    result = run(args.repeats, sizes, args.input_mb, args.recovery_repeats, parts, args.baseline)
    if args.result:
        measuring.write(result, part="" if set(parts) == set(PARTS) else "+".join(parts))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print_table(result)


if __name__ == "__main__":
    main()
