"""The training stream is a pure function of (files, seed, position): resume lands on the same batch."""

from typing import List

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import op_def_registry
from tpuops.agent.inputs import Parser, count_records, list_files, padded_batches, train_dataset
from tpuops.contract.exits import UserError
from tpuops.contract.runspec import DatasetSpec

pytestmark = pytest.mark.tf

RECORDS = 50  # 4 files of 12/13; batches of 8 do not divide an epoch
BATCH = 8


def _example(value: int) -> bytes:
    feature = {
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=[float(value), -float(value)])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[value])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> List[str]:
    directory = tmp_path_factory.mktemp("records")
    for shard, values in enumerate(np.array_split(np.arange(RECORDS), 4)):
        with tf.io.TFRecordWriter(str(directory / f"part-{shard}.tfrecord")) as out:
            for value in values:
                out.write(_example(int(value)))
    return list_files([str(directory / "part-*.tfrecord"), str(directory / "part-0.tfrecord")], "test")


def _spec(shuffle_buffer: int = 16, cache: bool = False) -> DatasetSpec:
    return DatasetSpec.from_json(
        {
            "features": {"x": {"dtype": "float32", "shape": [2]}, "label": {"dtype": "int64"}},
            "label": "label",
            "shuffle_buffer": shuffle_buffer,
            "cache": cache,
        },
        "dataset",
    )


def _labels(dataset: tf.data.Dataset, batches: int) -> List[List[int]]:
    return [labels.tolist() for _, labels in dataset.take(batches).as_numpy_iterator()]


def test_files_are_deduplicated_sorted_and_counted(files: List[str]) -> None:
    assert len(files) == 4 and files == sorted(files)
    assert count_records(files, "dataset.train") == RECORDS
    with pytest.raises(UserError, match="matches no file"):
        list_files([files[0] + ".missing"], "dataset.train")


@pytest.mark.parametrize("remote", [False, True], ids=["local", "bucket"])
@pytest.mark.parametrize("cache", [False, True])
def test_resumed_stream_continues_exactly_where_the_step_left_off(files: List[str], cache: bool, remote: bool) -> None:
    names = ["file://" + name for name in files] if remote else files
    spec = _spec(cache=cache)
    whole = _labels(train_dataset(names, spec, seed=5, global_batch=BATCH, examples_seen=0, epoch_size=RECORDS), 20)
    for step in (1, 6, 7, 13):  # 6 and 7 straddle the end of epoch 0, 13 the end of epoch 1
        resumed = train_dataset(names, spec, seed=5, global_batch=BATCH, examples_seen=step * BATCH, epoch_size=RECORDS)
        assert _labels(resumed, 20 - step) == whole[step:], f"resume at step {step}"


def _shard(label: int) -> int:
    """The file a label was written to (np.array_split of 50: 13, 13, 12, 12)."""
    return sum(label >= first for first in (13, 26, 38))


def test_files_in_a_bucket_are_read_in_the_order_local_files_are(files: List[str]) -> None:
    """A URL (a bucket; here file://) goes through the read-ahead path, a local path through one TFRecordDataset."""
    urls = ["file://" + name for name in files]
    unshuffled = _spec(shuffle_buffer=1)
    remote, local = (
        _labels(train_dataset(names, unshuffled, seed=5, global_batch=RECORDS, examples_seen=0, epoch_size=RECORDS), 2)
        for names in (urls, files)
    )
    assert remote == local
    assert [len({_shard(label) for label in batch[i : i + 12]}) for batch in local for i in (0, 38)] == [1, 1, 1, 1]
    assert count_records(urls, "dataset.train") == count_records(files, "dataset.train") == RECORDS


def test_every_epoch_is_a_fresh_permutation(files: List[str]) -> None:
    stream = train_dataset(files, _spec(), seed=5, global_batch=RECORDS, examples_seen=0, epoch_size=RECORDS)
    first, second = _labels(stream, 2)
    assert sorted(first) == sorted(second) == list(range(RECORDS))
    assert first != second and first != list(range(RECORDS))
    other_seed = train_dataset(files, _spec(), seed=6, global_batch=RECORDS, examples_seen=0, epoch_size=RECORDS)
    assert _labels(other_seed, 1)[0] != first


# Stateful ops tf.data's make_deterministic rewrite (TF 2.9) lets through: sources and checks.
ORDER_SAFE_STATEFUL = {"RangeDataset", "TFRecordDataset", "TensorSliceDataset", "Assert", "_Retval"}


def test_the_training_stream_stays_parallel_under_op_determinism(files: List[str]) -> None:
    """A stateful op in any of its functions (a seed generator) would serialise the parse and drop the prefetch."""
    dataset = train_dataset(files, _spec(), seed=3, global_batch=BATCH, examples_seen=0, epoch_size=RECORDS)
    graph = tf.compat.v1.GraphDef.FromString(dataset._as_serialized_graph().numpy())
    nodes = [*graph.node, *(node for function in graph.library.function for node in function.node_def)]
    stateful = {node.op for node in nodes if op_def_registry.get(node.op) and op_def_registry.get(node.op).is_stateful}
    assert stateful <= ORDER_SAFE_STATEFUL, stateful - ORDER_SAFE_STATEFUL
    assert {node.op for node in nodes} >= {"ShuffleDataset", "ParallelMapDatasetV2", "PrefetchDataset"}


def test_padded_batches_keep_every_example_once(files: List[str]) -> None:
    batches = list(padded_batches(files, _spec(), global_batch=16, with_label=True).as_numpy_iterator())
    assert all(inputs.shape == (16, 2) for inputs, _, _ in batches)
    labels = np.concatenate([label[mask == 1] for _, label, mask in batches])
    assert sorted(labels.tolist()) == list(range(RECORDS))
    assert [int(mask.sum()) for _, _, mask in batches] == [16, 16, 16, 2]
    only_inputs = list(padded_batches(files, _spec(), global_batch=16, with_label=False).as_numpy_iterator())
    assert len(only_inputs[0]) == 2, "without labels a batch is (inputs, mask)"


def test_records_that_do_not_match_the_features_are_a_user_error(files: List[str]) -> None:
    wrong = DatasetSpec.from_json(
        {"features": {"x": {"dtype": "float32", "shape": [3]}, "label": {"dtype": "int64"}}, "label": "label"},
        "dataset",
    )
    with pytest.raises(UserError, match=r"do not match dataset\.features"):
        Parser(wrong, with_label=True).check(files, "dataset.train")
    Parser(_spec(), with_label=True).check(files, "dataset.train")


def test_one_pattern_matches_exactly_the_files_or_is_none(tmp_path) -> None:
    from tpuops.agent.inputs import one_pattern

    for name in ("shard-00000-of-00002.tfrecord", "shard-00001-of-00002.tfrecord", "manifest.json", "x[1].tfrecord"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "shard-00000-of-00001.tfrecord").write_bytes(b"")
    shards = [str(tmp_path / "shard-00000-of-00002.tfrecord"), str(tmp_path / "shard-00001-of-00002.tfrecord")]
    pattern = one_pattern(shards)
    assert pattern == f"{tmp_path}/shard-0000*-of-00002.tfrecord"
    assert sorted(tf.io.gfile.glob(pattern)) == shards
    assert one_pattern([str(tmp_path / "x[1].tfrecord")]) == f"{tmp_path}/x[[]1].tfrecord*"
    assert one_pattern([shards[0], str(tmp_path / "other" / "shard-00000-of-00001.tfrecord")]) is None
    assert one_pattern([shards[0]]) == f"{shards[0]}*"
    assert one_pattern([]) is None
