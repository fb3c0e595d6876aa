"""TFRecord input pipelines whose position can be restored exactly.

Exact resume needs the batch after step ``s`` of a resumed run to be the batch the
uninterrupted run saw. Two ways exist in TF 2.9: checkpoint the iterator, or rebuild a
deterministic pipeline at a position. We rebuild, because an iterator checkpoint holds the
whole shuffle buffer (10 000 CIFAR images are 30 MB, ImageNet-sized records make it GBs, every
checkpoint) and because distributed iterators on TPU are not all saveable.

The training stream is a pure function of (files, seed, position):

* files are listed per pattern, de-duplicated and sorted, so every attempt sees one order;
* epoch ``e`` shuffles the file order, reads the files in it one after another (a bucket's
  with the next file read ahead, ``file_records``), and shuffles records with a buffer seeded from ``(seed, e)`` with
  ``reshuffle_each_iteration=False``: the order of an epoch never depends on what ran before;
* epochs are chained (``range(e0, inf).flat_map``), so batches run across epoch boundaries
  exactly as ``repeat()`` would;
* the position is the number of records consumed, ``examples_seen = step x global_batch``
  (``drop_remainder=True`` makes every step take exactly one global batch). A resumed
  pipeline starts at epoch ``examples_seen // epoch_size`` and ``skip``s the remainder
  *before* parsing, so a resume costs at most one epoch of raw reads, never a parse.
* the stream's batches are global batches on every slice size (a slice that accumulates cuts each
  into micro-batches inside the step, ``steps``), and the single client reads it once for every
  host (``distribution_options``), so the position is one number independent of the slice: a
  resume on another size continues with the very next example (the elastic-run invariant).

Both shuffles are built by ``seeded_shuffle``, not ``Dataset.shuffle``: inside a tf.function (the
epoch function is one) TF 2.9's ``shuffle`` creates a ``DummySeedGenerator`` resource op, and
with op determinism on (``deterministic`` in the spec, on by default without a TPU) tf.data's
``make_deterministic`` rewrite then treats the whole pipeline as stateful: it runs the parallel
parse one batch at a time and drops the prefetch. That cost the training stream about a third of
its throughput on a CPU host (bench/bench_agent.py ``pipeline_vs_plain``, determinism on).

``epoch_size`` (records per pass) is counted once per run and kept in the checkpoint; a
size from elsewhere could be wrong and would silently shift every epoch boundary.

Eval and inference read the files once, in order, and pad the last batch to the full batch
size with a 0/1 ``mask``: TPUs and XLA need one static batch shape, and padding keeps every
example in the metrics instead of dropping the tail.

A record whose CRC does not match, or one cut short at the end of a file, is the data's fault:
wherever the agent reads a dataset's records (``dataset_records``), TensorFlow's ``DataLossError``
becomes a ``UserError`` naming the dataset (and the file, where it is known), never retried
(``exits``: a DataLossError elsewhere, in a checkpoint or the store, stays a crash). A file cut
exactly at a record boundary is not detectable here: it reads as a shorter file
(``tpuops data verify`` compares it with the manifest).

Raw features (``"encoding": "raw"``) are parsed as one string per record, length-checked,
``decode_raw``-ed and reshaped; uint8 becomes float32 there, on the host, so the model and the
TPU infeed only ever see floats.
"""

import contextlib
import math
import os
import posixpath
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import tensorflow as tf
from tensorflow.python.data.ops import dataset_ops
from tensorflow.python.framework import random_seed
from tensorflow.python.ops import gen_dataset_ops

from tpuops.agent.paths import is_remote
from tpuops.contract.exits import UserError, cause_line
from tpuops.contract.runspec import DatasetSpec, FeatureSpec

AUTOTUNE = tf.data.AUTOTUNE
REMOTE_BLOCK = 64
_MAX_EPOCHS = 2**62
# Dataset.shuffle with a tensor seed trips over TF's "(0, 0) means unseeded" check when the
# graph-level seed is 0; fixing the graph seed inside the epoch function avoids it and makes
# the data order depend on spec.seed alone, not on the global TF seed.
_DATA_GRAPH_SEED = 0x74707573
_SEED_STRIDE = 1000003
_DTYPES = {"float32": tf.float32, "int64": tf.int64, "string": tf.string, "uint8": tf.uint8}


def _model_dtype(feature: FeatureSpec) -> tf.DType:
    """What the model receives: uint8 pixels as float32, every other dtype as stored."""
    return tf.float32 if feature.dtype == "uint8" else _DTYPES[feature.dtype]


def _stored(feature: FeatureSpec) -> tf.io.FixedLenFeature:
    if feature.encoding == "raw":
        return tf.io.FixedLenFeature([], tf.string)
    return tf.io.FixedLenFeature(feature.shape, _DTYPES[feature.dtype])


def _decode_raw(name: str, feature: FeatureSpec, raw: tf.Tensor) -> tf.Tensor:
    """A batch of raw arrays as ``[batch, *shape]``; a record of another byte length fails, naming the feature.

    Every record's length is checked because the reshape would not notice: a batch of records
    that are all too short can still hold a whole number of examples, silently mixing images.
    """
    dtype = _DTYPES[feature.dtype]
    size = math.prod(feature.shape) * dtype.size
    check = tf.debugging.assert_equal(
        tf.strings.length(raw),
        size,
        message=f"feature {name} ({feature.dtype}{list(feature.shape)} raw): every record must hold {size} bytes",
    )
    with tf.control_dependencies([check]):
        values = tf.io.decode_raw(raw, dtype)
    return tf.reshape(values, [-1, *feature.shape])


def list_files(patterns: Sequence[str], what: str) -> List[str]:
    """All files matching ``patterns``, de-duplicated and sorted; a pattern matching none is an error."""
    files = set()
    for pattern in patterns:
        matched = tf.io.gfile.glob(pattern)
        if not matched:
            raise UserError(f"{what}: {pattern!r} matches no file")
        files.update(matched)
    return sorted(files)


def one_pattern(files: Sequence[str]) -> Optional[str]:
    """A single glob pattern that matches exactly ``files`` (sorted), or None when there is none.

    The files' directory, their basenames' common prefix, ``*``, their common suffix
    (``.../data/x/shard-0000*.tfrecord``); checked by globbing it, so a pattern that would also
    match another file (a manifest, a shard of another dataset) is never returned.
    """
    if not files:
        return None
    directory = posixpath.dirname(files[0])
    if any(posixpath.dirname(name) != directory for name in files):
        return None
    names = [posixpath.basename(name) for name in files]
    prefix = posixpath.commonprefix(names)
    suffix = posixpath.commonprefix([name[len(prefix):][::-1] for name in names])[::-1]
    pattern = f"{directory}/{glob_escape(prefix)}*{glob_escape(suffix)}"
    return pattern if sorted(tf.io.gfile.glob(pattern)) == sorted(files) else None


def glob_escape(text: str) -> str:
    """``text`` with glob metacharacters bracketed, so that it matches only itself."""
    return "".join(f"[{char}]" if char in "*?[" else char for char in text)


class Parser:
    """Parses batches of serialized tf.train.Examples into (inputs, label) or inputs alone."""

    def __init__(self, spec: DatasetSpec, with_label: bool) -> None:
        self._spec = spec
        self._with_label = with_label and spec.label is not None
        names = spec.inputs + ([spec.label] if self._with_label else [])
        self._description = {name: _stored(spec.features[name]) for name in names}

    def __call__(self, serialized: tf.Tensor) -> Any:
        parsed = {
            name: self._decode(name, tensor)
            for name, tensor in tf.io.parse_example(serialized, self._description).items()
        }
        inputs = self._model_inputs(parsed)
        return (inputs, parsed[self._spec.label]) if self._with_label else inputs

    def _decode(self, name: str, tensor: tf.Tensor) -> tf.Tensor:
        feature = self._spec.features[name]
        if feature.encoding == "raw":
            tensor = _decode_raw(name, feature, tensor)
        return tf.cast(tensor, _model_dtype(feature))

    def _model_inputs(self, parsed: Dict[str, Any]) -> Any:
        names = self._spec.inputs
        return parsed[names[0]] if len(names) == 1 else {name: parsed[name] for name in names}

    def input_signature(self, batch: int) -> Any:
        """TensorSpecs of the model input for a batch of ``batch`` examples."""
        specs = {
            name: tf.TensorSpec((batch, *self._spec.features[name].shape), _model_dtype(self._spec.features[name]))
            for name in self._spec.inputs
        }
        return self._model_inputs(specs)

    def _declared(self) -> Dict[str, str]:
        return {
            name: f"{f.dtype}{list(f.shape)}" + (f" {f.encoding}" if f.encoding else "")
            for name, f in self._spec.features.items()
        }

    def check(self, files: Sequence[str], what: str) -> None:
        """Parse the first record of ``files``: a dataset that does not match the spec fails here."""
        with dataset_records(what, files[0]):
            first = list(tf.data.TFRecordDataset(list(files)).take(1).as_numpy_iterator())
        if not first:
            raise UserError(f"{what}: the files hold no records")
        try:
            self(tf.constant(first))
        except tf.errors.InvalidArgumentError as err:
            raise UserError(
                f"{what}: records in {files[0]} do not match dataset.features {self._declared()}: {err.message}"
            ) from err


def distribution_options(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Deterministic order, and sharding by data when the strategy distributes it."""
    options = tf.data.Options()
    options.deterministic = True
    # Multi-host: every host reads the whole stream and keeps its share of each global batch,
    # so the position in records stays one number for all hosts.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)


def host_cores() -> int:
    """Cores this process may run on (a container's CPU set, not the machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def untuned(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """``dataset`` without tf.data's autotuning model; only for pipelines this module builds.

    The model times every step of every element, and each record passes several steps
    (read, shuffle, epoch chaining, batch): on a CPU host that bookkeeping cost 6-9 % of the
    training stream's throughput (bench/bench_agent.py ``pipeline_vs_plain``). What it would
    tune is set here instead: the parse runs on one thread per core, a bucket's next file is
    read ahead (``file_records``), and prefetch(AUTOTUNE) keeps sizing its buffer with its own autotuner
    (``legacy_autotune``), which needs no model. User input functions keep TensorFlow's
    defaults.
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def file_records(names: tf.data.Dataset, files: Sequence[str]) -> tf.data.Dataset:
    """The records of the files ``names`` yields, one file after another, in that order.

    Local files are read by one ``TFRecordDataset``. Files in a bucket are read in the same order,
    but each file's records come through a one-file parallel interleave in blocks of
    REMOTE_BLOCK records, so that the next file is opened, and its first block (TF 2.9 reads
    gs:// in 64-MB requests) fetched, while this one is consumed: the network wait is hidden
    without a per-record cost. The alternatives measured worse (the agent's training stream over
    100 MB in 8 shards on 2 cores, op determinism off as on a TPU VM; docs/benchmarks.md, "The agent on
    gs://"): sixteen files interleaved record by record, as before, made the stream 0.14 of
    local disk (handing every record between threads cost more than parsing it); file after
    file without read-ahead 0.50 like this path, but 0.23 against this path's 0.41 once every
    request waited 100 ms, a real bucket's first-byte latency. A larger ``TFRecordDataset``
    ``buffer_size`` changes nothing on gs:// (the filesystem's own 64-MB read buffer serves it:
    one request per block either way). The local order also means one data order for either store.
    """
    if not any(is_remote(name) for name in files):
        return tf.data.TFRecordDataset(names)
    blocks = names.interleave(
        lambda name: tf.data.TFRecordDataset(name).batch(REMOTE_BLOCK),
        cycle_length=1,
        num_parallel_calls=1,
        deterministic=True,
    )
    return blocks.unbatch()


class _SeededShuffle(dataset_ops.UnaryUnchangedStructureDataset):
    """TF 2.9's shuffle without a seed-generator resource (the first ``ShuffleDataset`` op).

    Same seeds as ``Dataset.shuffle(seed=...)`` (``random_seed.get_seed``), so the same order;
    ``reshuffle_each_iteration`` is off, which is all that op needs the resource for.
    """

    def __init__(self, input_dataset: tf.data.Dataset, buffer_size: Any, seed: Any) -> None:
        self._input_dataset = input_dataset
        self._name = None
        graph_seed, op_seed = random_seed.get_seed(seed)
        variant = gen_dataset_ops.shuffle_dataset(
            input_dataset._variant_tensor,
            buffer_size=tf.convert_to_tensor(buffer_size, tf.int64),
            seed=graph_seed,
            seed2=op_seed,
            reshuffle_each_iteration=False,
            **self._common_args,
        )
        super().__init__(input_dataset, variant)


def seeded_shuffle(dataset: tf.data.Dataset, buffer_size: Any, seed: Any) -> tf.data.Dataset:
    """``dataset.shuffle(buffer_size, seed, reshuffle_each_iteration=False)`` that keeps op determinism parallel.

    See the module docstring: no stateful op enters the pipeline, so tf.data keeps the parallel
    parse and the prefetch when op determinism is on.
    """
    return _SeededShuffle(dataset, buffer_size, seed)


def _count(records: tf.data.Dataset) -> int:
    return int(records.reduce(tf.constant(0, tf.int64), lambda count, _: count + 1).numpy())


@contextlib.contextmanager
def dataset_records(what: str, file: Optional[str] = None) -> Iterator[None]:
    """Turn a ``DataLossError`` raised while ``what``'s records are read into a ``UserError`` (module docstring)."""
    try:
        yield
    except tf.errors.DataLossError as err:
        where = f" in {file}" if file else ""
        raise UserError(
            f"{what}: a record{where} is corrupt or cut short ({cause_line(err)}); every attempt would fail "
            "the same way: rewrite the file ('tpuops data verify' checks every shard)"
        ) from err


def count_records(files: Sequence[str], what: str) -> int:
    """Records in one pass over ``files`` (reads them all once, without parsing).

    Raises:
        UserError: a record is corrupt or cut short; the first such file is named (found by reading
            the files again one by one, only then).
    """
    try:
        return _count(file_records(tf.data.Dataset.from_tensor_slices(list(files)), files))
    except tf.errors.DataLossError:
        for name in files:
            with dataset_records(what, name):
                _count(tf.data.TFRecordDataset(name))
        raise


def train_dataset(
    files: Sequence[str],
    spec: DatasetSpec,
    seed: int,
    global_batch: int,
    examples_seen: int,
    epoch_size: int,
) -> tf.data.Dataset:
    """The endless training stream of parsed global batches, starting after ``examples_seen`` records."""
    first_epoch, offset = divmod(examples_seen, epoch_size)
    file_list = list(files)
    cached = file_records(tf.data.Dataset.from_tensor_slices(file_list), file_list).cache() if spec.cache else None

    def one_epoch(epoch: tf.Tensor) -> tf.data.Dataset:
        tf.random.set_seed(_DATA_GRAPH_SEED)  # only the graph of this function; see _DATA_GRAPH_SEED
        epoch_seed = tf.constant(seed, tf.int64) * _SEED_STRIDE + 2 * epoch
        if cached is not None:
            records = cached
        else:
            names = seeded_shuffle(tf.data.Dataset.from_tensor_slices(file_list), len(file_list), epoch_seed)
            records = file_records(names, file_list)
        if spec.shuffle_buffer > 1:
            records = seeded_shuffle(records, spec.shuffle_buffer, epoch_seed + 1)
        return records

    stream = tf.data.Dataset.range(first_epoch, _MAX_EPOCHS).flat_map(one_epoch).skip(offset)
    batches = stream.batch(global_batch, drop_remainder=True).map(
        Parser(spec, with_label=True), num_parallel_calls=host_cores(), deterministic=True
    )
    return distribution_options(untuned(batches.prefetch(AUTOTUNE)))


def _pad_to(batch: int) -> Any:
    """A function padding every tensor of a batch to ``batch`` rows, adding the 0/1 mask last."""

    def pad(*parts: Any) -> Tuple[Any, ...]:
        rows = tf.shape(tf.nest.flatten(parts)[0])[0]

        def fill(tensor: tf.Tensor) -> tf.Tensor:
            padding = [[0, batch - rows]] + [[0, 0]] * (tensor.shape.rank - 1)
            padded = tf.pad(tensor, padding)
            padded.set_shape([batch, *tensor.shape[1:]])
            return padded

        mask = tf.sequence_mask(rows, batch, dtype=tf.float32)
        return (*tf.nest.map_structure(fill, parts), mask)

    return pad


def padded_batches(files: Sequence[str], spec: DatasetSpec, global_batch: int, with_label: bool) -> tf.data.Dataset:
    """One ordered pass over ``files`` in batches of exactly ``global_batch``: (inputs[, label], mask).

    Parsing and padding are one map function: every dataset stage costs each batch a hand-over,
    and as three stages the pipeline took about 10 % more CPU time per batch of 64 (0.71 against
    0.64 ms; in latency mode that time is taken from the model, which shares the cores).
    """
    parser, pad = Parser(spec, with_label), _pad_to(global_batch)
    labelled = with_label and spec.label is not None

    def parse_and_pad(serialized: tf.Tensor) -> Tuple[Any, ...]:
        parsed = parser(serialized)
        return pad(*parsed) if labelled else pad(parsed)

    batches = tf.data.TFRecordDataset(list(files)).batch(global_batch)
    batches = batches.map(parse_and_pad, num_parallel_calls=host_cores())
    return distribution_options(untuned(batches.prefetch(AUTOTUNE)))
