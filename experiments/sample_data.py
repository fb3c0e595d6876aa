"""Small datasets for the example experiments, made on the laptop (control plane, no TensorFlow).

    python experiments/sample_data.py diabetes data/diabetes   # diabetes_regression.yaml
    python experiments/sample_data.py topics data/topics       # text_classifier.yaml

Each writes ``<out>/train`` and ``<out>/test`` as tpuops datasets (TFRecord shards and a
manifest.json), nothing downloaded:

* ``diabetes``: scikit-learn's diabetes data (442 patients, 10 standardised features ``x``,
  the disease progression a year later as a float ``label``), split 80/20 with a fixed seed.
* ``topics``: generated text in four topics. Each sentence mixes words of its topic with
  common words and has 4 to 40 words; it is tokenised with the vocabulary in
  ``vocabulary.py`` into variable-length int64 ``tokens`` (manifest shape ``[-1]``), and
  the topic is the int64 ``label``.

This file runs on the control plane (it imports tpuops.data); the agent never imports it.
"""

import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Sequence

import numpy as np

SEED = 0


def diabetes(out_dir: Path) -> None:
    from sklearn.datasets import load_diabetes
    from tpuops.data.convert import convert

    data = load_diabetes()
    order = np.random.default_rng(SEED).permutation(len(data.target))
    cut = int(len(order) * 0.8)
    with tempfile.TemporaryDirectory() as scratch:
        for split, rows in (("train", order[:cut]), ("test", order[cut:])):
            source = Path(scratch) / f"diabetes-{split}.npz"
            np.savez(source, x=data.data[rows].astype(np.float32), label=data.target[rows].astype(np.float32))
            convert(source, "npz", Path(out_dir) / split, shards=2, overwrite=True)  # a float target: a plain column


def sentences(count: int, seed: int) -> List[tuple]:
    """``count`` (text, topic) pairs of generated text."""
    from vocabulary import COMMON_WORDS, TOPIC_WORDS

    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(count):
        topic = int(rng.integers(len(TOPIC_WORDS)))
        length = int(rng.integers(4, 41))
        topical = rng.random(length) < 0.35
        words = [
            TOPIC_WORDS[topic][rng.integers(len(TOPIC_WORDS[topic]))]
            if pick
            else COMMON_WORDS[rng.integers(len(COMMON_WORDS))]
            for pick in topical
        ]
        pairs.append((" ".join(words), topic))
    return pairs


def _write(out_dir: Path, pairs: Sequence[tuple], description: str) -> None:
    from tpuops.data import tfrecord
    from tpuops.data.manifest import MANIFEST, Manifest, Origin, StoredFeature, utc_now
    from tpuops.data.shards import ShardCutter, even_counts

    from vocabulary import tokenize

    out_dir.mkdir(parents=True, exist_ok=True)
    writer = ShardCutter(out_dir, counts=even_counts(len(pairs), 2))
    for text, topic in pairs:
        writer.write(
            tfrecord.encode_example(
                {"tokens": tfrecord.int64_feature(tokenize(text)), "label": tfrecord.int64_feature([topic])}
            )
        )
    shards = writer.finish()
    features: Dict[str, StoredFeature] = {
        "tokens": StoredFeature(kind="int64", dtype="int64", shape=[-1]),
        "label": StoredFeature(kind="int64", dtype="int64", shape=[]),
    }
    manifest = Manifest(
        created=utc_now(),
        source=Origin(format="generated", path="experiments/sample_data.py", description=description),
        records=sum(s.records for s in shards),
        bytes=sum(s.bytes for s in shards),
        features=features,
        labels=["sports", "cooking", "space", "music"],
        shards=shards,
    )
    (out_dir / MANIFEST).write_bytes(manifest.to_bytes())


def topics(out_dir: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    for split, count, seed in (("train", 2000, SEED), ("test", 400, SEED + 1)):
        _write(Path(out_dir) / split, sentences(count, seed), f"{count} generated sentences in 4 topics")


SAMPLES = {"diabetes": diabetes, "topics": topics}

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in SAMPLES:
        sys.exit(f"usage: python {sys.argv[0]} {{{','.join(SAMPLES)}}} OUT_DIR")
    SAMPLES[sys.argv[1]](Path(sys.argv[2]))
