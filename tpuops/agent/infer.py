"""``infer``: batch prediction over TFRecords into sharded JSON Lines and a manifest.

The model comes from ``infer.model``: a Keras SavedModel directory (``saved_model.pb``), or a
checkpoint directory, in which case the entry point builds the model and the newest valid
checkpoint (``checkpoints.newest_valid``) fills in its weights. Prediction runs in a
``tf.function(jit_compile=True)`` on CPU; on a TPU ``strategy.run`` compiles it with XLA
anyway. Batches are padded to one static size, so XLA compiles once.

Outputs, under ``output_prefix`` (default ``runs/<run>/predictions``):

* ``predictions-SSSSS-of-NNNNN.jsonl``: one JSON object per example,
  ``{"index": i, "output": [...]}`` where ``i`` is the example's position in the sorted input
  files and ``output`` the model's output row as floats. Batch ``b`` goes to shard ``b mod N``,
  and lines within a shard are in ascending ``index``. JSON Lines, not TFRecords, because the
  control plane reads results without TensorFlow.
* ``manifest.json``, written last and whole: ``{"run_id", "format": "jsonl", "model",
  "inputs": [files], "shards": [{"path": name, "count": n}], "total": n, "created"}``. Shards
  without a manifest are an unfinished attempt; a rerun overwrites them.

A preemption notice stops the loop at the next batch (exit class "preempted"); there is no
partial resume, inference simply runs again.
"""

import json
import logging
from typing import Any

import numpy as np
import tensorflow as tf

from tpuops.agent import checkpoints, entry, inputs
from tpuops.agent.exits import PreemptedExit, UserError
from tpuops.agent.paths import RunPaths, join, write_whole
from tpuops.agent.preemption import PreemptionNotice
from tpuops.agent.runspec import RunSpec
from tpuops.agent.runtime import Runtime
from tpuops.agent.status import Status, utc_now

log = logging.getLogger(__name__)


def shard_name(index: int, count: int) -> str:
    return f"predictions-{index:05d}-of-{count:05d}.jsonl"


def load_model(spec: RunSpec, runtime: Runtime, source: str) -> tf.keras.Model:
    """The Keras model in ``source``: a SavedModel dir, or a checkpoint dir plus the entry point."""
    with runtime.strategy.scope():
        if tf.io.gfile.exists(join(source, "saved_model.pb")):
            return tf.keras.models.load_model(source, compile=False)
        found = checkpoints.newest_valid(source)
        if found is None:
            raise UserError(f"infer.model: {source} holds neither a SavedModel nor a valid checkpoint")
        parser = inputs.Parser(spec.dataset, with_label=False)
        model = entry.build_model(entry.load_entry_point(spec), spec, parser.input_signature(1), runtime.strategy)
    tf.train.Checkpoint(model=model).restore(found[1]).expect_partial()
    log.info("model restored from checkpoint %s (step %d)", found[1], found[0])
    return model


def _predict_fn(model: tf.keras.Model, runtime: Runtime) -> Any:
    def forward(batch: Any) -> tf.Tensor:
        return tf.cast(model(batch, training=False), tf.float32)

    if not runtime.on_tpu:
        return tf.function(forward, jit_compile=True)
    strategy = runtime.strategy

    @tf.function
    def on_replicas(batch: Any) -> tf.Tensor:
        return strategy.gather(strategy.run(forward, args=(batch,)), axis=0)

    return on_replicas


def run(spec: RunSpec, runtime: Runtime, status: Status, notice: PreemptionNotice, paths: RunPaths) -> None:
    """Predict over ``infer.input`` and write the shards and then the manifest."""
    ispec = spec.require_infer()
    status.update(device=runtime.device, replicas=runtime.replicas, global_batch=ispec.batch_size)
    status.set_phase("loading")
    files = inputs.list_files(ispec.input, "infer.input")
    inputs.Parser(spec.dataset, with_label=False).check(files, "infer.input")
    model = load_model(spec, runtime, ispec.model)
    predict = _predict_fn(model, runtime)
    batches = inputs.padded_batches(files, spec.dataset, ispec.batch_size, with_label=False)
    if runtime.on_tpu:
        batches = runtime.strategy.experimental_distribute_dataset(batches)
    prefix = ispec.output_prefix or paths.predictions
    tf.io.gfile.makedirs(prefix)
    names = [shard_name(i, ispec.num_shards) for i in range(ispec.num_shards)]
    counts = [0] * ispec.num_shards
    status.set_phase("predicting")
    writers = [tf.io.gfile.GFile(join(prefix, name), "w") for name in names]
    try:
        total = 0
        for number, (batch, mask) in enumerate(batches):
            if notice.requested():
                raise PreemptedExit(f"preempted ({notice.reason}) after {total} predictions")
            valid = int(np.sum((runtime.strategy.gather(mask, axis=0) if runtime.on_tpu else mask).numpy()))
            rows = predict(batch).numpy()[:valid]
            shard = number % ispec.num_shards
            writers[shard].write("".join(_line(total + i, row) for i, row in enumerate(rows)))
            counts[shard] += valid
            total += valid
            status.update(metrics={"predicted": total})
    finally:
        for writer in writers:
            writer.close()
    manifest = {
        "run_id": spec.run_id,
        "format": "jsonl",
        "model": ispec.model,
        "inputs": files,
        "shards": [{"path": name, "count": count} for name, count in zip(names, counts)],
        "total": total,
        "created": utc_now(),
    }
    write_whole(join(prefix, "manifest.json"), json.dumps(manifest, indent=1))
    log.info("wrote %d predictions in %d shard(s) under %s", total, ispec.num_shards, prefix)


def _line(index: int, row: Any) -> str:
    return json.dumps({"index": index, "output": np.asarray(row).tolist()}) + "\n"
