"""The whole lifecycle on a ``gs://`` store: TensorFlow 2.9's own Cloud Storage path, as on a TPU VM.

The emulator serves the store's bucket through fake-gcs-server; each node's processes see it as
``https://storage.googleapis.com`` (private /etc/hosts, the emulator's CA) and authenticate with
their metadata server's token (the front answers 401 to any other), so the bootstrap, the
prefetch and every ``tf.io.gfile`` call of the agent (TFRecord shards, checkpoints including the
SIGTERM save, TensorBoard events, the SavedModel, prediction shards) take the real host's code
path. Few runs, many assertions each:

- a reference run (built-in kind) and a run preempted with the notice (SIGTERM save to gs://,
  resume through the prefetch of the newest gs:// checkpoint) end bit-identical;
- a script-mode Keras program that calls ``TPUClusterResolver()`` without arguments, guarded
  the usual way, trains on the CPU and finds its data through ``TPUOPS_DATA_TRAIN_PATTERN``;
- what the runs wrote is readable with ``tf.io.gfile`` through the same names;
- a corrupt newest gs:// checkpoint is skipped for the one before it, still bit-identical;
- ``infer`` writes its prediction shards and manifest to gs://, and a preempted ``infer`` resumes
  keeping the shards it had finished (their generations unchanged);
- the compiled-Keras and ``input_fn`` kinds (the regression and text examples, made short) train
  on gs://, as does a small sweep advanced by real ``tpuops reconcile`` processes;
- with 2 % of the nodes' storage requests failing (503, 429, resets), a run ends in one attempt,
  bit-identical, with every checkpoint whole and no empty object;
- neither the emulator's token, nor a node's service-account token, nor the CA key appears in
  a log, a spec, a store object or node metadata.

Skipped, with the reason, where nodes cannot get a private /etc/hosts (not root, no unshare).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import COMPARE_CHECKPOINTS, REPO, TF_PYTHON, example_datasets, poll, small_digits, spec_variant

from tpuops.emulator import control, enter_command, storage_front, unavailable_reason
from tpuops.store import Store, open_store
from tpuops.sweeps import ops as sweep_ops

pytestmark = [pytest.mark.emulator, pytest.mark.tf, pytest.mark.slow]

SPEC = REPO / "experiments" / "digits_cnn.yaml"
ZONE = "us-central1-a"
BUCKET = "e2e-bucket"
ROOT = f"gs://{BUCKET}/tpuops"

# A user's Keras script, unchanged from what runs on a TPU VM: the usual TPU guard, data by pattern.
RESOLVER_SCRIPT = """
import os
import tensorflow as tf

try:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    strategy = tf.distribute.TPUStrategy(resolver)
except (ValueError, tf.errors.NotFoundError):
    strategy = tf.distribute.get_strategy()
print("strategy", type(strategy).__name__, "accelerator", os.environ.get("TPU_ACCELERATOR_TYPE"))
files = tf.io.gfile.glob(os.environ["TPUOPS_DATA_TRAIN_PATTERN"])
assert files and files == sorted(os.environ["TPUOPS_DATA_TRAIN"].split(",")), files
spec = {"image": tf.io.FixedLenFeature([64], tf.float32), "label": tf.io.FixedLenFeature([], tf.int64)}
data = (tf.data.Dataset.list_files(os.environ["TPUOPS_DATA_TRAIN_PATTERN"], shuffle=False)
        .interleave(tf.data.TFRecordDataset).map(lambda r: tf.io.parse_single_example(r, spec))
        .map(lambda x: (x["image"], x["label"])).batch(64))
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(32, activation="relu"), tf.keras.layers.Dense(10)])
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), ["accuracy"])
history = model.fit(data, epochs=3, verbose=2)
print("trained accuracy", history.history["accuracy"][-1])
model.save(os.path.join(os.environ["TPUOPS_MODEL_DIR"], "keras"))
"""

READ_BACK = """
import sys
import tensorflow as tf

run = sys.argv[1]
events = tf.io.gfile.glob(run + "/tb/*/events.out.tfevents.*") + tf.io.gfile.glob(run + "/tb/events.out.tfevents.*")
assert events, tf.io.gfile.listdir(run)
tags = {v.tag for e in tf.compat.v1.train.summary_iterator(events[0]) for v in e.summary.value}
assert tags, "no summaries in " + events[0]
loaded = tf.saved_model.load(run + "/model")
print("events", len(events), "tags", sorted(tags)[:3], "signatures", list(loaded.signatures))
"""


def _skip_reason() -> str | None:
    if not TF_PYTHON.exists():
        return f"no TF 2.9 runtime at {TF_PYTHON}"
    return unavailable_reason()


@dataclass
class GcsWorld:
    work: Path
    info: control.EmulatorInfo
    env: dict[str, str]
    store: Store
    node_tokens: list[str]

    def tpuops(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "tpuops", *args], cwd=self.work, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def status(self, run: str) -> dict:
        key = f"runs/{run}/status.json"
        return json.loads(self.store.read_bytes(key)) if self.store.exists(key) else {}

    def in_node_view(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """``argv`` with the nodes' view of the network: Google's names, the emulator's CA."""
        front = storage_front(self.info.state_dir)
        assert front is not None
        # Not a node's process: the metadata door refuses it, so TF gets the emulator's own token.
        env = {**os.environ, "CURL_CA_BUNDLE": front.ca_bundle, "SSL_CERT_FILE": front.ca_bundle,
               "GOOGLE_AUTH_TOKEN_FOR_TESTING": self.info.token or ""}
        return subprocess.run(enter_command(self.info.state_dir / "node-hosts", list(argv)), env=env,
                              capture_output=True, text=True, timeout=180, check=False)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsWorld]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("gcs")
    shutil.copytree(REPO / "experiments", work / "experiments", ignore=shutil.ignore_patterns("__pycache__"))
    example_datasets(work / "data")
    state_dir = work / "home" / "emulator"
    info = control.start_background(state_dir, boot_delay_s=0.2, grace_s=20.0, image_python=str(TF_PYTHON),
                                    gcs_buckets=[BUCKET])
    endpoint = control.storage_endpoint(state_dir)
    assert endpoint is not None
    config = work / "tpuops.toml"
    config.write_text(f'zones = ["{ZONE}"]\nstore = "{ROOT}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUOPS_")}
    env.update(TPUOPS_HOME=str(work / "home"), TPUOPS_CONFIG=str(config), TPUOPS_TPU_ENDPOINT=info.endpoint,
               TPUOPS_POLL_INTERVAL_S="0.2", STORAGE_EMULATOR_HOST=endpoint)
    yield GcsWorld(work, info, env, open_store(ROOT, gcs_endpoint=endpoint), [])
    control.stop(state_dir)


def _finish(proc: subprocess.Popen[str], timeout: float = 300) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out)


def test_train_and_preemption_on_gs_end_bit_identical(world: GcsWorld) -> None:
    reference = world.tpuops("train", str(SPEC), "--name", "ref", "--json")
    cut = world.tpuops("train", str(SPEC), "--name", "cut", "--json")
    poll(lambda: (world.status("cut").get("last_checkpoint_step") or 0) >= 200, "a gs:// checkpoint at step >= 200",
         timeout_s=240)
    seen = world.status("cut")["step"]
    world.node_tokens.append(_service_account_token(world, "cut"))
    control.AdminClient(world.info.endpoint).preempt("tpuops-local", ZONE, "cut", grace_s=20.0)
    result = _finish(cut)
    assert (result["exit_class"], result["step"], result["preemptions"], result["attempts"]) == \
           ("succeeded", 600, 1, 2)
    assert _finish(reference)["exit_class"] == "succeeded"
    done = world.status("cut")
    assert seen <= done["resumed_from_step"] < 600  # the SIGTERM save reached gs:// within the notice
    assert world.status("ref")["metrics"]["eval"]["accuracy"] >= 0.95
    names = {info.key for info in world.store.list("runs/cut/ckpt/")}
    assert "runs/cut/ckpt/ckpt-600.index" in names and "runs/cut/ckpt/checkpoint" in names
    compared = world.in_node_view(str(TF_PYTHON), "-c", COMPARE_CHECKPOINTS, f"{ROOT}/runs/ref/ckpt/ckpt-600",
                                  f"{ROOT}/runs/cut/ckpt/ckpt-600")
    assert compared.returncode == 0, compared.stdout + compared.stderr[-3000:]
    read = world.in_node_view(str(TF_PYTHON), "-c", READ_BACK, f"{ROOT}/runs/ref")
    assert read.returncode == 0, read.stderr[-3000:]
    assert "serving_default" in read.stdout


def _service_account_token(world: GcsWorld, node: str) -> str:
    """What node ``node``'s processes get from its metadata server as their access token."""
    [host] = [n["metadata_host"] for n in control.AdminClient(world.info.endpoint).nodes()
              if n["name"].endswith(f"/{node}")]
    request = urllib.request.Request(f"http://{host}/computeMetadata/v1/instance/service-accounts/default/token",
                                     headers={"Metadata-Flavor": "Google"})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10) as response:
        return json.loads(response.read())["access_token"]


def test_script_mode_resolver_guard_and_data_pattern_on_gs(world: GcsWorld, tmp_path: Path) -> None:
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "keras_resolver.py").write_text(RESOLVER_SCRIPT)
    spec = experiments / "keras_resolver.yaml"
    spec.write_text(
        "name: keras-resolver\nscript: keras_resolver.py\n"
        f"dataset:\n  train: {world.work}/data/digits/train\n  label: label\n"
        "accelerator: v3-8\ncapacity: spot\n")
    proc = world.tpuops("train", str(spec), "--name", "resolver", "--json")
    out, err = proc.communicate(timeout=300)
    log = b"".join(world.store.read_bytes(info.key) for info in world.store.list("runs/resolver/logs/"))
    assert proc.returncode == 0, err[-1000:] + log.decode(errors="replace")[-4000:]
    assert json.loads(out)["exit_class"] == "succeeded"
    assert b"strategy _DefaultDistributionStrategy accelerator v3-8" in log
    assert b"trained accuracy" in log and b"Name or service not known" not in log
    assert world.store.exists("runs/resolver/model/keras/saved_model.pb")


def test_infer_writes_sharded_predictions_and_a_manifest_to_gs(world: GcsWorld) -> None:
    result = _finish(world.tpuops("infer", str(SPEC), "--checkpoint", "ref", "--input", "data/digits/test",
                                  "--shards", "2", "--name", "pred", "--json"))
    assert result["metrics"]["predicted"] == 360
    manifest = json.loads(world.store.read_bytes("runs/pred/predictions/manifest.json"))
    shards = sorted(info.key for info in world.store.list("runs/pred/predictions/") if info.key.endswith(".jsonl"))
    lines = [json.loads(line) for key in shards for line in world.store.read_bytes(key).decode().splitlines()]
    assert len(shards) == 2 and len(lines) == manifest["total"] == 360
    assert all(len(line["output"]) == 10 for line in lines)


def test_a_corrupt_newest_gs_checkpoint_falls_back_to_the_previous_one(world: GcsWorld) -> None:
    """The prefetched newest checkpoint fails validation, so does the store's: the one before it is used."""
    for info in world.store.list("runs/ref/ckpt/"):
        name = info.key.rsplit("/", 1)[-1]
        if name.startswith(("ckpt-500.", "ckpt-600.")):
            data = world.store.read_bytes(info.key)
            if name == "ckpt-600.data-00000-of-00001":
                data = data[: len(data) // 2]
            world.store.write_bytes(f"runs/corrupt/ckpt/{name}", data)
    result = _finish(world.tpuops("train", str(SPEC), "--name", "corrupt", "--json"))
    assert (result["exit_class"], result["step"]) == ("succeeded", 600)
    assert world.status("corrupt")["resumed_from_step"] == 500
    log = b"".join(world.store.read_bytes(info.key) for info in world.store.list("runs/corrupt/logs/"))
    assert f"skipping corrupt checkpoint {ROOT}/runs/corrupt/ckpt/ckpt-600".encode() in log
    compared = world.in_node_view(str(TF_PYTHON), "-c", COMPARE_CHECKPOINTS, f"{ROOT}/runs/ref/ckpt/ckpt-600",
                                  f"{ROOT}/runs/corrupt/ckpt/ckpt-600")
    assert compared.returncode == 0, compared.stdout + compared.stderr[-3000:]


def test_two_percent_of_storage_requests_failing_changes_nothing(world: GcsWorld) -> None:
    """TensorFlow's retries (and the bootstrap's) carry the run: one attempt, same weights, whole checkpoints."""
    admin = control.AdminClient(world.info.endpoint)
    admin.reset_stats()
    admin.set_faults(gcs_error_rate=0.02, seed=20)
    try:
        result = _finish(world.tpuops("train", str(SPEC), "--name", "faulty", "--json"))
    finally:
        admin.clear_faults()
    counts = admin.stats()
    injected = sum(count for name, count in counts.items() if name.startswith("storage:injected-"))
    assert injected > 0, counts
    assert (result["exit_class"], result["step"], result["attempts"]) == ("succeeded", 600, 1)
    # TensorFlow asks a session's state after each failed upload request: that must never publish an empty object.
    objects = world.store.list("runs/faulty/")
    assert not [info.key for info in objects if info.size == 0 and not info.key.endswith("/")]  # "/": TF's folders
    names = {info.key.rsplit("/", 1)[-1] for info in objects if info.key.startswith("runs/faulty/ckpt/")}
    steps = {name.split(".")[0] for name in names if name.startswith("ckpt-") and name.endswith(".index")}
    assert steps and all(f"{step}.data-00000-of-00001" in names for step in steps), names
    assert not [name for name in names if "tempstate" in name or "_temp" in name], names
    compared = world.in_node_view(str(TF_PYTHON), "-c", COMPARE_CHECKPOINTS, f"{ROOT}/runs/ref/ckpt/ckpt-600",
                                  f"{ROOT}/runs/faulty/ckpt/ckpt-600")
    assert compared.returncode == 0, compared.stdout + compared.stderr[-3000:]


def test_every_worker_of_a_slice_ships_its_log_to_gs(world: GcsWorld) -> None:
    """Workers 1-3 of a v2-32 ship their logs through the JSON API with their service account's token, which the
    front requires (the token check below then covers the shipped logs too)."""
    spec = spec_variant(world.work, "digits_cnn", "digits-slice", {
        "accelerator: v3-8": "accelerator: v2-32", "steps: 600": "steps: 40", "per_replica: 64": "per_replica: 16",
        "target:\n  metric: accuracy\n  at_least: 0.95\n": ""})
    assert _finish(world.tpuops("train", str(spec), "--name", "slice-gs", "--json"), timeout=900)["step"] == 40
    for worker in (1, 2, 3):
        shown = world.tpuops("logs", "slice-gs", "--worker", str(worker))
        out, err = shown.communicate(timeout=120)
        assert shown.returncode == 0, err
        assert f"worker {worker} booted with TensorFlow" in out and "shipping this log to gs://" in out, out
        assert "tpuops log shipper: shipping" not in out, "no ship failed"


def test_no_token_or_ca_key_in_logs_specs_objects_or_metadata(world: GcsWorld) -> None:
    state_dir = world.info.state_dir
    secrets = {"emulator token": (state_dir / "token").read_text().strip().encode(),
               "CA key": (state_dir / "tls" / "ca.key").read_bytes().strip(),
               "server key": (state_dir / "tls" / "server.key").read_bytes().strip()}
    assert (state_dir / "tls" / "ca.key").stat().st_mode & 0o777 == 0o600
    nodes = control.AdminClient(world.info.endpoint).nodes()
    assert world.node_tokens, "the preemption test records the token of the node it preempts"
    places: dict[str, bytes] = {f"store:{info.key}": world.store.read_bytes(info.key)
                                for info in world.store.list("runs/")}
    for path in (world.work / "home").rglob("*"):
        if path.is_file() and path.suffix in (".log", ".json", ".txt", "") and path.parent.name != "tls" \
                and path.name != "token" and path.stat().st_size < 50_000_000:
            places[str(path)] = path.read_bytes()
    places["node metadata"] = json.dumps(nodes).encode()
    for where, data in places.items():
        for name, secret in secrets.items():
            assert secret not in data, f"the {name} is in {where}"
        for token in world.node_tokens:
            assert token.encode() not in data, f"a node's service-account token is in {where}"


def test_compiled_keras_and_input_fn_kinds_train_on_gs(world: GcsWorld) -> None:
    """The regression example (a compiled model with its own loss and metrics) and the text one (its own input_fn)."""
    short = {"steps: 300": "steps: 40", "every_steps: 100": "every_steps: 20"}
    runs = {"compiled": spec_variant(world.work, "diabetes_regression", "short_regression",
                                     {**short, "every_steps: 50": "every_steps: 20"}),
            "input-fn": spec_variant(world.work, "text_classifier", "short_text", short)}
    procs = {run: world.tpuops("train", str(spec), "--name", run, "--json") for run, spec in runs.items()}
    for run, proc in procs.items():
        result = _finish(proc)
        assert (result["exit_class"], result["step"], result["attempts"]) == ("succeeded", 40, 1), result
        status = world.status(run)
        assert [e["step"] for e in status["evals"]] == [20, 40]
        names = {info.key for info in world.store.list(f"runs/{run}/")}
        assert {f"runs/{run}/ckpt/ckpt-40.index", f"runs/{run}/model/saved_model.pb"} <= names, sorted(names)
    assert set(world.status("compiled")["metrics"]["eval"]) >= {"mae", "root_mean_squared_error", "within_10pct"}
    assert "accuracy" in world.status("input-fn")["metrics"]["eval"]


def _repeated(source: Path, target: Path, copies: int) -> int:
    """Dataset ``target``: ``copies`` copies of dataset ``source``'s shards in order; its record count."""
    manifest = json.loads((source / "manifest.json").read_text())
    target.mkdir(parents=True)
    shards = []
    for copy in range(copies):
        for shard in manifest["shards"]:
            name = f"c{copy:03d}-{shard['name']}"
            shutil.copyfile(source / shard["name"], target / name)
            shards.append({**shard, "name": name})
    manifest.update(shards=shards, records=manifest["records"] * copies, bytes=manifest["bytes"] * copies)
    (target / "manifest.json").write_text(json.dumps(manifest))
    return manifest["records"]


def test_a_preempted_infer_resumes_on_gs_keeping_its_finished_shards(world: GcsWorld) -> None:
    """Until the notice, every storage request waits 400 ms, so that the notice lands between shards whatever the load.

    The emulator sends SIGTERM before ``preempt`` returns and the agent checks for it before each
    shard, so the requests are fast again from then on. The input is the 360 test digits 10 times
    over, so example ``i`` must predict exactly as ``i % 360`` whichever attempt wrote it.
    """
    total = _repeated(world.work / "data" / "digits" / "test", world.work / "data" / "digits-x10", 10)
    prefix = "runs/infer-cut/predictions/"
    admin = control.AdminClient(world.info.endpoint)
    proc = world.tpuops("infer", str(SPEC), "--checkpoint", "ref", "--input", "data/digits-x10", "--shards", "8",
                        "--batch-size", "64", "--name", "infer-cut", "--json")
    try:
        poll(lambda: world.store.exists(prefix + "plan.json"), "the infer job's plan in gs://", timeout_s=240)
        admin.set_faults(gcs_latency_ms=400)
        poll(lambda: _shards(world, prefix), "a finished prediction shard in gs://", timeout_s=120)
        admin.preempt("tpuops-local", ZONE, "infer-cut", grace_s=20.0)
    finally:
        admin.clear_faults()
    poll(lambda: world.status("infer-cut").get("attempt") == 2, "the resumed attempt", timeout_s=240)
    kept = _shards(world, prefix)
    result = _finish(proc, timeout=600)
    assert (result["exit_class"], result["preemptions"], result["attempts"]) == ("succeeded", 1, 2), result
    assert 1 <= len(kept) < 8
    final = _shards(world, prefix)
    assert len(final) == 8 and all(final[key] == generation for key, generation in kept.items()), (kept, final)
    manifest = json.loads(world.store.read_bytes(prefix + "manifest.json"))
    lines = [json.loads(line) for key in sorted(final) for line in world.store.read_bytes(key).decode().splitlines()]
    assert manifest["total"] == total and [line["index"] for line in lines] == list(range(total))
    assert all(line["output"] == lines[line["index"] % 360]["output"] for line in lines)


def _shards(world: GcsWorld, prefix: str) -> dict[str, int]:
    """The finished prediction shards under ``prefix`` and their generations."""
    return {info.key: info.generation for info in world.store.list(prefix) if info.key.endswith(".jsonl")}


SWEEP = """
name: gsweep
experiment: ../experiments/small.yaml
space:
  learning_rate: {type: float, low: 0.001, high: 0.02, log: true}
objective: {metric: accuracy, direction: maximize}
sampler: {type: random, seed: 3}
trials: 2
parallel: 2
eval_every_steps: 20
"""


def test_a_small_sweep_on_gs_ends_through_reconcile_with_its_study_and_trials_in_the_bucket(world: GcsWorld) -> None:
    (world.work / "experiments" / "small.yaml").write_text(small_digits(SPEC.read_text(), steps=20))
    (world.work / "sweeps").mkdir(exist_ok=True)
    (world.work / "sweeps" / "gsweep.yaml").write_text(SWEEP)
    _finish(world.tpuops("sweep", "start", "sweeps/gsweep.yaml", "--json"), timeout=120)

    def ended() -> bool:
        _finish(world.tpuops("reconcile", "--json"), timeout=120)
        return sweep_ops.load_state(world.store, "gsweep")[0].phase == "finished"

    poll(ended, "the sweep's end through reconcile passes", timeout_s=600, interval_s=0.5)
    status = _finish(world.tpuops("sweep", "status", "gsweep", "--json"), timeout=120)
    assert status["outcome"] == "completed" and status["counts"]["COMPLETE"] == 2, status
    for trial in status["trials"]:
        run = trial["run_id"]
        assert trial["value"] == world.status(run)["metrics"]["eval"]["accuracy"]
        assert world.store.exists(f"runs/{run}/ckpt/ckpt-20.index")
    assert [info.key for info in world.store.list("sweeps/gsweep/")], "the sweep's journal lives in the bucket"
