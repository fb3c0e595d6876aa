"""Where a run's files live in the store, and the one way the agent writes a whole file.

Layout under ``<store_root>/runs/<run_id>/`` (docs/design.md, "The store is the message bus")::

    spec.json      the run spec (written by the control plane; the agent only reads it)
    status.json    phase, step, heartbeat, metrics, exit class (``status``)
    logs/NNNNNN.log  log chunks, numbered in write order, each written whole (``logs``)
    ckpt/          tf.train.CheckpointManager: ckpt-<step>.index/.data-*, checkpoint (``checkpoints``)
    tb/            TensorBoard event files
    model/         the final Keras SavedModel, complete once status says succeeded
    predictions/   default output prefix of ``infer`` (``infer``)
    profile.json   a profile request (written by the control plane; the agent only reads it)
    profiles/      TensorFlow profiles, one folder per capture with its record (``profiles``)

Paths are joined with "/" so that they work for ``gs://`` URIs and local paths alike. This
module imports TensorFlow only when it writes: ``prefetch`` uses the paths before the import.
"""

import hashlib
import os
import re

CHECKPOINT_INDEX = re.compile(r"^ckpt-(\d+)\.index$")
"""The name of a checkpoint's index file under ``ckpt/``; group 1 is its step."""


def join(*parts: str) -> str:
    """Join store path parts with "/" (os.path.join would use the local separator)."""
    head, *rest = parts
    return "/".join([head.rstrip("/"), *(part.strip("/") for part in rest)])


def local_directory(root: str, location: str) -> str:
    """A directory under ``root`` on this machine that belongs to the store ``location``, one per location."""
    return os.path.join(root, hashlib.sha256(location.encode("utf-8")).hexdigest()[:16])


class RunPaths:
    """The paths of one run under a store root."""

    def __init__(self, store_root: str, run_id: str) -> None:
        self.run_dir = join(store_root, "runs", run_id)
        self.status = join(self.run_dir, "status.json")
        self.logs = join(self.run_dir, "logs")
        self.ckpt = join(self.run_dir, "ckpt")
        self.tb = join(self.run_dir, "tb")
        self.model = join(self.run_dir, "model")
        self.predictions = join(self.run_dir, "predictions")
        self.stop = join(self.run_dir, "stop.json")
        """A stop someone asked for (``tpuops.runs.layout.STOP``): the agent saves and ends when it appears."""


def is_remote(path: str) -> bool:
    """Whether ``path`` is in a bucket (any ``scheme://``, e.g. ``gs://``) rather than on the VM's disk."""
    return "://" in path


def write_whole(path: str, data: str) -> None:
    """Write ``data`` so that a reader sees the old file or the new one, never a torn one.

    Locally: a temporary sibling renamed over ``path`` (the rename is atomic). Its name never
    ends in the final name's suffix, so a reader that lists ``*.log`` or ``*.json`` does not pick
    it up. In a bucket (any ``scheme://``): one upload straight to ``path``. Cloud Storage
    publishes an object only when its upload completes, so readers see the old generation or the
    new one. A temporary object would add nothing but requests: tf.io.gfile renames by a
    directory check, a copy and a delete, on every heartbeat's ``status.json``.
    """
    import tensorflow as tf  # loaded by then: a dictionary lookup (see the module docstring)

    if is_remote(path):
        with tf.io.gfile.GFile(path, "w") as out:
            out.write(data)
        return
    tmp = f"{path}.tmp-{os.getpid()}"
    with tf.io.gfile.GFile(tmp, "w") as out:
        out.write(data)
    tf.io.gfile.rename(tmp, path, overwrite=True)
