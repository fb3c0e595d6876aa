"""Small real datasets that ship inside installed packages, made into TFRecords: no downloads.

``digits``: the 1,797 8x8 handwritten digits that scikit-learn carries (UCI ML hand-written
digits), split once with a fixed seed into ``train`` (80 %) and ``test`` (20 %), each a
dataset folder with manifest.json: ``image`` float32 [8, 8, 1] (pixel values 0..16) and
``label`` int64. It trains to >= 95 % test accuracy on a CPU in a minute or two.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from tpuops.core.errors import UsageError
from tpuops.data.convert import ConvertReport, convert

SAMPLES = ("digits",)


def digits(out_dir: Path, *, seed: int = 0, overwrite: bool = False) -> dict[str, ConvertReport]:
    """Write ``out_dir/train`` and ``out_dir/test``."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise UsageError("the digits sample needs scikit-learn: pip install 'tpuops[samples]'") from None
    data = load_digits()
    images = data.images.astype(np.float32)[..., np.newaxis]
    labels = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(labels))
    cut = int(len(order) * 0.8)
    reports = {}
    with tempfile.TemporaryDirectory() as scratch:
        for split, rows in (("train", order[:cut]), ("test", order[cut:])):
            source = Path(scratch) / f"digits-{split}.npz"
            np.savez(source, image=images[rows], label=labels[rows])
            reports[split] = convert(source, "npz", Path(out_dir) / split, shards=2, label_from="label",
                                     overwrite=overwrite)
    return reports


def make_sample(name: str, out_dir: Path, *, overwrite: bool = False) -> dict[str, ConvertReport]:
    if name != "digits":
        raise UsageError(f"sample {name!r} is not one of: {', '.join(SAMPLES)}")
    return digits(out_dir, overwrite=overwrite)
