"""The Cloud TPU Keras article's CNN as a user writes it: TPUStrategy, model.compile, model.fit.

Run by tpuops in script mode (``article_cnn.yaml``), unchanged but for three adaptations:

* the data are the TFRecords tpuops names in ``TPUOPS_DATA_TRAIN`` / ``TPUOPS_DATA_EVAL``, parsed
  with the schema in ``TPUOPS_DATA_TRAIN_FEATURES`` (so CIFAR-10's 32x32x3 images or the
  8x8x1 digits the tests use), files read with ``tf.io.gfile`` paths (gs:// on GCP);
* without a TPU it falls back to the CPU only when the run allows it (``TPUOPS_ALLOW_CPU``),
  else it exits 2 (a user error: tpuops does not retry it);
* two ``tpuops_helper`` callbacks checkpoint every N steps and on the preemption notice,
  resume mid-epoch, and report progress to ``tpuops status``.

    python article_cnn.py --epochs=5 --batch_size=128 --learning_rate=0.001
"""

import argparse
import json
import os
import sys

import tensorflow as tf
import tpuops_helper

flags = argparse.ArgumentParser(description=__doc__.splitlines()[0])
flags.add_argument("--epochs", type=int, default=5)
flags.add_argument("--batch_size", type=int, default=128)
flags.add_argument("--learning_rate", type=float, default=0.001)
flags.add_argument("--steps_per_epoch", type=int, default=0, help="0: one pass over the training records")
flags.add_argument("--pixel_max", type=float, default=255.0, help="the largest pixel value (255; 16 for digits)")
args = flags.parse_args()


def tpu_strategy() -> tf.distribute.Strategy:
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=os.environ.get("TPU_NAME", "local"))
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        print("All devices: ", tf.config.list_logical_devices("TPU"))
        return tf.distribute.TPUStrategy(resolver)
    except (ValueError, tf.errors.NotFoundError) as err:
        if os.environ.get("TPUOPS_ALLOW_CPU") != "1":
            print(f"no TPU ({str(err).splitlines()[0]}) and this run does not allow the CPU", file=sys.stderr)
            sys.exit(2)
        print("no TPU: training on the CPU, as this run allows")
        return tf.distribute.get_strategy()


strategy = tpu_strategy()
features = json.loads(os.environ["TPUOPS_DATA_TRAIN_FEATURES"])
label = os.environ.get("TPUOPS_LABEL") or "label"
image_name = next(name for name in sorted(features) if name != label)
image = features[image_name]
shape = image["shape"]
stored = {
    image_name: tf.io.FixedLenFeature([], tf.string)
    if image["encoding"] == "raw"
    else tf.io.FixedLenFeature(shape, tf.float32),
    label: tf.io.FixedLenFeature([], tf.int64),
}


def parse(record: tf.Tensor) -> tuple:
    example = tf.io.parse_single_example(record, stored)
    pixels = example[image_name]
    if image["encoding"] == "raw":
        pixels = tf.reshape(tf.io.decode_raw(pixels, tf.uint8), shape)
    return tf.cast(pixels, tf.float32), example[label]


def files(name: str) -> list:
    return sorted(os.environ[f"TPUOPS_DATA_{name}"].split(","))


batch_size = args.batch_size * strategy.num_replicas_in_sync
records = sum(1 for _ in tf.data.TFRecordDataset(files("TRAIN")))
steps_per_epoch = args.steps_per_epoch or records // batch_size
seed = int(os.environ.get("TPUOPS_SEED", "0"))
tf.keras.utils.set_random_seed(seed)
train = (
    tf.data.TFRecordDataset(files("TRAIN"))
    .map(parse)
    .cache()
    .shuffle(records, seed=seed)
    .repeat()
    .batch(batch_size, drop_remainder=True)
    .prefetch(tf.data.AUTOTUNE)
)
test = tf.data.TFRecordDataset(files("EVAL")).map(parse).batch(batch_size, drop_remainder=True)

with strategy.scope():
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Rescaling(1.0 / args.pixel_max, input_shape=shape),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Conv2D(64, 3, activation="relu"),
            tf.keras.layers.GlobalAveragePooling2D(),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(learning_rate=args.learning_rate),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy()],
    )
    checkpoint = tpuops_helper.StepCheckpoint(model, steps_per_epoch=steps_per_epoch)

model.fit(
    checkpoint.resume(train),
    epochs=args.epochs,
    steps_per_epoch=steps_per_epoch,
    initial_epoch=checkpoint.initial_epoch,
    validation_data=test,
    callbacks=[checkpoint, tpuops_helper.StatusReporter()],
    verbose=2,
)
loss, accuracy = model.evaluate(test, verbose=0)
steps_done = int(model.optimizer.iterations.numpy())
print(f"finished {args.epochs} epochs at step {steps_done}: test accuracy {accuracy:.4f}")
