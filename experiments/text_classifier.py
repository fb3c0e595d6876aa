"""A text classifier on variable-length token ids: its own input_fn and a small Transformer encoder.

``input_fn`` (the run spec's ``input_fn: "text_classifier:input_fn"``) parses the ``tokens``
feature as a variable-length int64 list, cuts it to ``MAX_TOKENS`` and pads every batch to
exactly ``[batch_size, MAX_TOKENS]``: XLA (and so the TPU) compiles one static shape. It keeps
the agent's contract (``tpuops/agent/userinput.py``): the same arguments give the same batches
(seeded shuffle), drop_remainder for training, no sharding of its own.

``transformer`` is one encoder block: token + position embeddings, self-attention that ignores
the padding, a feed-forward layer, then the mean over the real tokens and a softmax over topics.
"""

from typing import Any, Dict, List

import tensorflow as tf

from vocabulary import PAD, VOCABULARY

layers = tf.keras.layers
MAX_TOKENS = 32


def _parse(record: tf.Tensor) -> Any:
    example = tf.io.parse_single_example(
        record, {"tokens": tf.io.VarLenFeature(tf.int64), "label": tf.io.FixedLenFeature([], tf.int64)}
    )
    tokens = tf.cast(tf.sparse.to_dense(example["tokens"])[:MAX_TOKENS], tf.int32)
    return tokens, example["label"]


def input_fn(file_patterns: List[str], batch_size: int, *, training: bool, seed: int, input_context: Any) -> Any:
    records = tf.data.TFRecordDataset(sorted(file_patterns))
    if training:
        records = records.shuffle(4096, seed=seed).repeat()
    return records.map(_parse).padded_batch(
        batch_size,
        padded_shapes=([MAX_TOKENS], []),
        padding_values=(PAD, tf.constant(0, tf.int64)),
        drop_remainder=training,
    )


class PositionalEmbedding(layers.Layer):
    def __init__(self, vocabulary: int, width: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tokens = layers.Embedding(vocabulary, width)
        self.positions = layers.Embedding(MAX_TOKENS, width)

    def call(self, ids: tf.Tensor) -> tf.Tensor:
        return self.tokens(ids) + self.positions(tf.range(tf.shape(ids)[-1]))


def transformer(hparams: Dict[str, Any]) -> tf.keras.Model:
    """hparams: ``width`` (= 32), ``heads`` (= 2), ``classes`` (= 4)."""
    width, heads = int(hparams.get("width", 32)), int(hparams.get("heads", 2))
    ids = layers.Input(shape=(MAX_TOKENS,), dtype=tf.int32, name="tokens")
    real = tf.cast(tf.not_equal(ids, PAD), tf.float32)
    x = PositionalEmbedding(len(VOCABULARY), width)(ids)
    attention_mask = tf.cast(real[:, tf.newaxis, :], tf.bool)
    attended = layers.MultiHeadAttention(heads, width // heads)(x, x, attention_mask=attention_mask)
    x = layers.LayerNormalization()(x + attended)
    x = layers.LayerNormalization()(x + layers.Dense(width)(layers.Dense(2 * width, activation="relu")(x)))
    pooled = tf.reduce_sum(x * real[..., tf.newaxis], axis=1) / tf.maximum(
        tf.reduce_sum(real, axis=1, keepdims=True), 1.0
    )
    outputs = layers.Dense(int(hparams.get("classes", 4)), activation="softmax", dtype="float32")(pooled)
    return tf.keras.Model(ids, outputs, name="topic_transformer")
