"""Train the small model of ``test_steps`` under ``CentralStorageStrategy`` over logical CPUs; print JSON.

A process of its own: logical CPU devices can be configured only before TensorFlow starts, which a
pytest process has done long before. ``python central_storage.py REPLICAS ACCUMULATION [mirrored] [batchnorm]``
trains five steps of a 16-example global batch with plain SGD (``REPLICAS`` x ``ACCUMULATION`` micro-batches)
and prints the weights (a batch normalization's moving statistics among them, read as their mean over the
replicas, as a checkpoint saves them), the training metrics and how many times the call was traced.
``mirrored``: under ``MirroredStrategy`` instead (one TPU host's replicas, as ``TPUOPS_CPU_REPLICAS`` gives);
``batchnorm``: a ``BatchNormalization`` layer between the two dense layers.
"""

import json
import sys
from typing import Sequence

import numpy as np
import tensorflow as tf
from tpuops.agent.steps import Steps, make_optimizer
from tpuops.contract.runspec import TrainSpec

GLOBAL_BATCH = 16
STEPS = 5


def main(replicas: int, accumulation: int, options: Sequence[str]) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    devices = [device.name for device in tf.config.list_logical_devices("CPU")]
    # As runtime._slice_strategy builds it for a multi-host slice without TPU chips.
    if "mirrored" in options:
        strategy = tf.distribute.MirroredStrategy(devices)
    else:
        strategy = tf.distribute.experimental.CentralStorageStrategy(devices, parameter_device=devices[0])
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4 * GLOBAL_BATCH, 5)).astype(np.float32)
    y = rng.integers(0, 3, size=4 * GLOBAL_BATCH).astype(np.int64)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH, drop_remainder=True).repeat()
    with strategy.scope():
        tf.keras.utils.set_random_seed(11)
        normalization = [tf.keras.layers.BatchNormalization()] if "batchnorm" in options else []
        model = tf.keras.Sequential([tf.keras.layers.Dense(4, activation="relu", input_shape=(5,)), *normalization,
                                     tf.keras.layers.Dense(3, activation="softmax")])
        optimizer = make_optimizer({"optimizer": "sgd", "learning_rate": 0.1})
    per_replica = GLOBAL_BATCH // (replicas * accumulation)
    spec = TrainSpec(per_replica_batch_size=per_replica, steps=100, steps_per_call=STEPS, global_batch=GLOBAL_BATCH)
    steps = Steps(strategy, model, optimizer, spec, GLOBAL_BATCH, accumulation)
    steps.prepare(data.element_spec)
    steps.train_call(iter(strategy.experimental_distribute_dataset(data)), tf.constant(STEPS, tf.int64))
    print(json.dumps({
        "weights": [value.numpy().tolist() for value in model.weights],
        "metrics": steps.train_metrics.results(),
        "traced": steps.train_call.experimental_get_tracing_count(),
    }))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:])
