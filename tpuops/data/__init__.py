"""Datasets: TFRecord conversion without TensorFlow, and verified, resumable, parallel upload to the store.

``convert`` (local source → shards + manifest.json, framed by ``tfrecord``), ``upload`` (local dataset → store),
``verify`` (store objects against the manifest) and ``ls`` (datasets under a root).
The manifest format is documented in ``tpuops.data.manifest``.

May import: ``tpuops.core`` and ``tpuops.store`` (where datasets live), and pydantic, numpy, Pillow,
google-crc32c and scikit-learn (the sample datasets); never TensorFlow, and nothing that knows a run,
a node or a price, so the launch wing and the sweeps can stand on it (``tests/house/test_wings.py``).
"""

from tpuops.core.formats import format_size, parse_size
from tpuops.data.convert import ConvertReport, convert
from tpuops.data.inventory import DatasetSummary, VerifyReport, ls, verify
from tpuops.data.upload import UploadReport, region_warning, upload

__all__ = [
    "ConvertReport",
    "DatasetSummary",
    "UploadReport",
    "VerifyReport",
    "convert",
    "format_size",
    "ls",
    "parse_size",
    "region_warning",
    "upload",
    "verify",
]
