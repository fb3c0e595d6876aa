"""A user's own model.fit script for the script-mode tests, with the tpuops helper callbacks.

    python fit_script.py --epochs=3 --steps_per_epoch=20 [--batch=32]

Flags it does not know (the other hparams, passed as flags too) are ignored. The model is
``testmodels.slow_mlp`` unless hparam ``model`` names another function of ``testmodels``.
"""

import argparse
import json
import os

import tensorflow as tf
import testmodels
import tpuops_helper

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, required=True)
parser.add_argument("--steps_per_epoch", type=int, required=True)
parser.add_argument("--batch", type=int, default=32)
args, _ = parser.parse_known_args()

hparams = json.loads(os.environ["TPUOPS_HPARAMS"])
features = json.loads(os.environ["TPUOPS_DATA_TRAIN_FEATURES"])
label = os.environ["TPUOPS_LABEL"]
spec = {name: tf.io.FixedLenFeature(f["shape"], getattr(tf, f["dtype"])) for name, f in features.items()}


def parse(serialized):  # type: ignore[no-untyped-def]
    parsed = tf.io.parse_example(serialized, spec)
    return parsed["x"], parsed[label]


def dataset(name, training):  # type: ignore[no-untyped-def]
    records = tf.data.TFRecordDataset(sorted(os.environ[f"TPUOPS_DATA_{name}"].split(",")))
    if training:
        records = records.shuffle(64, seed=int(os.environ["TPUOPS_SEED"])).repeat()
    return records.batch(args.batch, drop_remainder=training).map(parse)


tf.keras.utils.set_random_seed(int(os.environ["TPUOPS_SEED"]))
model = getattr(testmodels, hparams.get("model", "slow_mlp"))(hparams)  # another testmodels function if named
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
ckpt = tpuops_helper.StepCheckpoint(model, steps_per_epoch=args.steps_per_epoch)
model.fit(
    ckpt.resume(dataset("TRAIN", True)),
    epochs=args.epochs,
    steps_per_epoch=args.steps_per_epoch,
    initial_epoch=ckpt.initial_epoch,
    validation_data=dataset("EVAL", False),
    callbacks=[ckpt, tpuops_helper.StatusReporter(every_seconds=0.2)],
    verbose=2,
)
print("finished at step", int(model.optimizer.iterations.numpy()))
