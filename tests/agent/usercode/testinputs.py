"""User input functions for the agent tests (parse the blobs records themselves)."""

import time

import tensorflow as tf

FEATURES = 12


def _parse(serialized: tf.Tensor) -> tuple:
    parsed = tf.io.parse_example(
        serialized,
        {"x": tf.io.FixedLenFeature([FEATURES], tf.float32), "label": tf.io.FixedLenFeature([], tf.int64)},
    )
    return parsed["x"], parsed["label"]


def blobs(file_patterns, batch_size, *, training, seed, input_context):  # type: ignore[no-untyped-def]
    """Deterministic: a seeded shuffle that repeats; batches parsed after batching."""
    records = tf.data.TFRecordDataset(sorted(file_patterns))
    if training:
        records = records.shuffle(64, seed=seed).repeat()
    return records.batch(batch_size, drop_remainder=training).map(_parse)


def unseeded(file_patterns, batch_size, *, training, seed, input_context):  # type: ignore[no-untyped-def]
    """Breaks the contract: the shuffle is seeded from the clock."""
    records = tf.data.TFRecordDataset(sorted(file_patterns))
    if training:
        records = records.shuffle(600, seed=time.time_ns() % 2**31).repeat()
    return records.batch(batch_size, drop_remainder=training).map(_parse)


def ragged_batches(file_patterns, batch_size, *, training, seed, input_context):  # type: ignore[no-untyped-def]
    """Breaks the contract: the batch dimension is not static."""
    return tf.data.TFRecordDataset(sorted(file_patterns)).batch(batch_size).map(_parse)


def two_arguments(file_patterns, batch_size):  # type: ignore[no-untyped-def]
    return tf.data.TFRecordDataset(file_patterns)
