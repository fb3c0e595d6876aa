"""``upload`` / ``verify`` / ``ls`` against a local store and fake-gcs-server, including crashes.

The dataset is a few MB in four shards; GCS stores use 256 KiB chunks, so every shard goes
through a multi-chunk resumable session and several shards are in flight at once.
"""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from fake_gcs import FakeGcsServer
from lanes import LOCAL_AND_GCS

from tpuops.core.errors import NotFound, TransientError
from tpuops.data import convert, ls, region_warning, upload, verify
from tpuops.data.manifest import MANIFEST, Manifest
from tpuops.store import IntegrityError, LocalStore, Store, gcs_client
from tpuops.store.files import crc32c_of_bytes
from tpuops.store.gcs import GcsStore

CHUNK = 256 * 1024


def _gcs(endpoint: str, bucket: str, prefix: str, **options: object) -> GcsStore:
    return GcsStore(bucket, prefix, client=gcs_client(endpoint), chunk_size=CHUNK, resumable_threshold=CHUNK,
                    **options)  # type: ignore[arg-type]


def _make_dataset(folder: Path, seed: int) -> Manifest:
    pixels = np.random.default_rng(seed).integers(0, 256, (240, 64, 64, 3), dtype=np.uint8)
    np.savez(folder.with_suffix(".npz"), image=pixels, label=np.arange(240) % 10)
    return convert(folder.with_suffix(".npz"), "npz", folder, shards=4, label_from="label").manifest


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest]:
    folder = tmp_path_factory.mktemp("datasets") / "pets"
    return folder, _make_dataset(folder, seed=1)


@pytest.fixture(params=LOCAL_AND_GCS)
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], Store]:
    """Stores at prefixes of one fresh root (a directory, or a bucket on the session's server)."""
    if request.param == "local":
        return lambda prefix: LocalStore(tmp_path / "root" / prefix)
    endpoint = request.getfixturevalue("fake_gcs").endpoint
    bucket = request.getfixturevalue("gcs_bucket")
    return lambda prefix: _gcs(endpoint, bucket, prefix, deadline_s=10)


def _generations(store: Store) -> dict[str, int]:
    return {info.key: info.generation for info in store.list()}


def test_upload_then_rerun_sends_nothing(dataset: tuple[Path, Manifest], make_store: Callable[[str], Store]) -> None:
    folder, manifest = dataset
    store = make_store("data/pets")
    seen: list[tuple[int, int]] = []
    report = upload(folder, store, workers=3, progress=lambda done, total: seen.append((done, total)))
    assert sorted(report.sent) == sorted(s.name for s in manifest.shards)
    assert report.bytes_sent == manifest.bytes and report.manifest_written
    assert seen[-1] == (manifest.bytes, manifest.bytes)
    listing = {info.key: info for info in store.list()}
    for shard in manifest.shards:
        assert (listing[shard.name].size, listing[shard.name].crc32c) == (shard.bytes, shard.crc32c)
    assert store.read_bytes(MANIFEST) == (folder / MANIFEST).read_bytes()
    assert verify(store).ok

    before = _generations(store)
    again = upload(folder, store, workers=3)
    assert again.sent == () and again.bytes_sent == 0 and not again.manifest_written
    assert len(again.plan.skip) == 4
    assert _generations(store) == before


def test_dry_run_sends_nothing(dataset: tuple[Path, Manifest], make_store: Callable[[str], Store]) -> None:
    folder, manifest = dataset
    store = make_store("data/pets")
    report = upload(folder, store, dry_run=True)
    assert report.dry_run and len(report.plan.send) == 4 and report.plan.bytes_to_send == manifest.bytes
    assert store.list() == []


def test_verify_names_bad_shards_and_upload_repairs_only_them(
    dataset: tuple[Path, Manifest], make_store: Callable[[str], Store]
) -> None:
    folder, manifest = dataset
    store = make_store("data/pets")
    upload(folder, store)
    corrupt, missing, intact = manifest.shards[1], manifest.shards[2], manifest.shards[0]
    original = store.read_bytes(corrupt.name)
    store.write_bytes(corrupt.name, bytes([original[0] ^ 0xFF]) + original[1:])
    store.delete(missing.name)

    report = verify(store)
    assert not report.ok
    reasons = {p.name: p.reason for p in report.problems}
    assert set(reasons) == {corrupt.name, missing.name}
    assert reasons[missing.name] == "missing"
    assert reasons[corrupt.name].startswith("crc32c")

    intact_generation = store.stat(intact.name).generation
    repaired = upload(folder, store)
    assert sorted(repaired.sent) == sorted([corrupt.name, missing.name])
    assert store.stat(intact.name).generation == intact_generation
    assert verify(store).ok


def test_verify_without_manifest_is_not_found(make_store: Callable[[str], Store]) -> None:
    with pytest.raises(NotFound, match="manifest"):
        verify(make_store("data/none"))


def _record_offsets(data: bytes) -> list[int]:
    """Where each record of a TFRecord file starts (the framing read by hand, not by the code under test)."""
    offsets, pos = [], 0
    while pos < len(data):
        offsets.append(pos)
        pos += 8 + 4 + struct.unpack_from("<Q", data, pos)[0] + 4
    return offsets


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


def _second_record_data(data: bytes) -> tuple[bytes, str]:
    at = _record_offsets(data)[1]
    return _flip(data, at + 12), f"record 1 at byte {at}: corrupt record data"


def _second_record_length(data: bytes) -> tuple[bytes, str]:
    at = _record_offsets(data)[1]
    return _flip(data, at + 8), f"record 1 at byte {at}: corrupt record length"


def _last_record_truncated(data: bytes) -> tuple[bytes, str]:
    offsets = _record_offsets(data)
    return data[:-3], f"record {len(offsets) - 1} at byte {offsets[-1]}: truncated record data"


@pytest.mark.parametrize("damage", [_second_record_data, _second_record_length, _last_record_truncated,
                                    "count"], ids=["data-crc", "length-crc", "truncated", "count"])
def test_verify_frames_every_record_even_when_the_manifest_matches_the_damaged_bytes(
    dataset: tuple[Path, Manifest], make_store: Callable[[str], Store], damage: object, tmp_path: Path
) -> None:
    """A shard written with a bad record, and a manifest made from it: whole-shard size and crc32c agree, the
    records do not (TensorFlow's reader would raise DataLossError on the node). verify names shard and offset."""
    folder, manifest = dataset
    local = tmp_path / "damaged"
    shutil.copytree(folder, local)
    victim = manifest.shards[2]
    data = (local / victim.name).read_bytes()
    records = victim.records
    if damage == "count":
        reason = f"{records} records, manifest says {records + 1}"
        records += 1
    else:
        data, reason = damage(data)  # type: ignore[operator]
    (local / victim.name).write_bytes(data)
    shards = [s.model_copy(update={"bytes": len(data), "crc32c": crc32c_of_bytes(data), "records": records})
              if s.name == victim.name else s for s in manifest.shards]
    total = sum(s.records for s in shards)
    damaged = manifest.model_copy(update={"shards": shards, "records": total,
                                          "bytes": sum(s.bytes for s in shards)})
    (local / MANIFEST).write_bytes(damaged.to_bytes())
    store = make_store("data/pets")
    upload(local, store)
    seen: list[tuple[int, int]] = []

    report = verify(store, workers=2, progress=lambda done, total: seen.append((done, total)))
    assert not report.ok
    assert [p.name for p in report.problems] == [victim.name]
    assert report.problems[0].reason.startswith(reason), report.problems[0].reason
    assert seen and seen[-1][1] == damaged.bytes and max(done for done, _ in seen) <= damaged.bytes


def test_a_different_dataset_loses_its_manifest_before_any_shard_is_replaced(
    dataset: tuple[Path, Manifest], make_store: Callable[[str], Store], tmp_path: Path
) -> None:
    folder, _ = dataset
    store = make_store("data/pets")
    upload(folder, store)
    other = tmp_path / "other"
    other_manifest = _make_dataset(other, seed=2)
    victim = other / other_manifest.shards[3].name
    victim.write_bytes(victim.read_bytes()[:-1] + b"\x00")  # same size, different bytes: caught by crc32c

    with pytest.raises(IntegrityError, match=other_manifest.shards[3].name):
        upload(other, store, workers=1)
    assert not store.exists(MANIFEST)


def test_ls_lists_datasets_with_counts(dataset: tuple[Path, Manifest], make_store: Callable[[str], Store]) -> None:
    folder, manifest = dataset
    upload(folder, make_store("data/a"))
    upload(folder, make_store("data/b"))
    make_store("data/c").write_bytes("shard-00000-of-00001.tfrecord", b"no manifest: not a dataset")
    make_store("data/b").delete(manifest.shards[0].name)

    found = {d.name: d for d in ls(make_store(""), "data/")}
    assert sorted(found) == ["data/a", "data/b"]
    assert (found["data/a"].records, found["data/a"].shards, found["data/a"].bytes) == (240, 4, manifest.bytes)
    assert found["data/a"].complete and not found["data/b"].complete
    assert found["data/a"].uri == make_store("data/a").uri


_DRIVER = r"""
import sys, threading
from pathlib import Path
from tpuops.data import upload
from tpuops.store import gcs_client
from tpuops.store.gcs import GcsStore

endpoint, bucket, prefix, folder, pause_at = sys.argv[1:6]
store = GcsStore(bucket, prefix, client=gcs_client(endpoint), chunk_size=262144, resumable_threshold=262144)

def progress(done, total):
    if done >= int(pause_at):
        print("PAUSED", flush=True)
        threading.Event().wait()

upload(Path(folder), store, workers=1, progress=progress)
print("DONE", flush=True)
"""


@pytest.mark.emulator
def test_sigkill_mid_upload_then_rerun_finishes_without_resending(
    dataset: tuple[Path, Manifest], fake_gcs: FakeGcsServer, gcs_bucket: str
) -> None:
    folder, manifest = dataset
    first, rest = manifest.shards[0], manifest.shards[1:]
    # With one worker, shards go in order: once the second chunk of the second shard is being
    # read, the first shard is complete and the second is part-way through its resumable session.
    assert first.bytes > 2 * CHUNK
    pause_at = first.bytes + CHUNK + 1
    args = [fake_gcs.endpoint, gcs_bucket, "data/pets", str(folder), str(pause_at)]
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER, *args], stdout=subprocess.PIPE, text=True)
    watchdog = threading.Timer(60, driver.kill)
    watchdog.start()
    try:
        assert driver.stdout is not None
        assert driver.stdout.readline().strip() == "PAUSED"
        os.kill(driver.pid, signal.SIGKILL)
        assert driver.wait() == -signal.SIGKILL
    finally:
        watchdog.cancel()

    store = _gcs(fake_gcs.endpoint, gcs_bucket, "data/pets", deadline_s=10)
    left = {info.key: info for info in store.list()}
    assert set(left) == {first.name}
    assert left[first.name].crc32c == first.crc32c

    report = upload(folder, store, workers=2)
    assert [s.name for s in report.plan.skip] == [first.name]
    assert sorted(report.sent) == sorted(s.name for s in rest)
    assert store.stat(first.name).generation == left[first.name].generation
    assert verify(store).ok


@pytest.mark.emulator
def test_server_restart_mid_upload_is_retried_to_success(dataset: tuple[Path, Manifest], tmp_path: Path) -> None:
    folder, manifest = dataset
    server = FakeGcsServer(backend="filesystem", root=tmp_path / "gcs")
    server.start()
    try:
        server.create_bucket("restart")
        paused, resume, retried = threading.Event(), threading.Event(), threading.Event()
        store = _gcs(server.endpoint, "restart", "data/pets", deadline_s=60,
                     on_retry=lambda err, wait: retried.set())
        pause_at = manifest.shards[0].bytes + CHUNK + 1

        def progress(done: int, total: int) -> None:
            if done >= pause_at and not paused.is_set():
                paused.set()
                resume.wait(30)

        outcome: dict[str, object] = {}

        def run() -> None:
            try:
                outcome["report"] = upload(folder, store, workers=1, progress=progress)
            except Exception as err:
                outcome["error"] = err

        worker = threading.Thread(target=run)
        worker.start()
        assert paused.wait(30)
        server.stop()
        resume.set()
        assert retried.wait(30), "the upload never saw the outage"
        server.start()
        worker.join(60)
        assert not worker.is_alive()
        assert "error" not in outcome, outcome.get("error")
        assert len(outcome["report"].sent) == 4  # type: ignore[attr-defined]
        assert verify(store).ok
    finally:
        server.close()


@pytest.mark.emulator
def test_server_gone_ends_in_one_clear_error(dataset: tuple[Path, Manifest]) -> None:
    folder, _ = dataset
    with FakeGcsServer() as server:
        server.create_bucket("gone")
        store = _gcs(server.endpoint, "gone", "data/pets", deadline_s=1.0)
    with pytest.raises(TransientError) as raised:
        upload(folder, store)
    message = str(raised.value)
    assert "gs://gone/data/pets" in message and "connection failed" in message and "\n" not in message


@pytest.mark.unit
def test_local_dataset_must_be_complete(dataset: tuple[Path, Manifest], tmp_path: Path) -> None:
    folder, manifest = dataset
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    (broken / manifest.shards[2].name).unlink()
    from tpuops.core.errors import UsageError

    with pytest.raises(UsageError, match="missing"):
        upload(broken, LocalStore(tmp_path / "dest"))
    with pytest.raises(UsageError, match="convert"):
        upload(tmp_path / "nothing-here", LocalStore(tmp_path / "dest"))
    assert not (tmp_path / "dest").exists()


@pytest.mark.unit
def test_region_warning() -> None:
    assert region_warning("US-CENTRAL1", "us-central1-a") is None
    assert region_warning("us-central1", "US-CENTRAL1-B") is None
    assert region_warning("NAM4", "us-east1-c") is None
    assert region_warning("US-CENTRAL1+US-EAST1", "us-east1-d") is None
    assert region_warning(None, "us-central1-a") is None
    elsewhere = region_warning("EUROPE-WEST4", "us-central1-a")
    assert elsewhere is not None and "EUROPE-WEST4" in elsewhere and "us-central1" in elsewhere
    multi = region_warning("US", "us-central1-a")
    assert multi is not None and "multi-region" in multi


@pytest.mark.emulator
def test_upload_warns_when_the_bucket_is_in_another_region(
    dataset: tuple[Path, Manifest], fake_gcs: FakeGcsServer, gcs_bucket: str
) -> None:
    folder, _ = dataset
    store = _gcs(fake_gcs.endpoint, gcs_bucket, "data/pets")
    far = upload(folder, store, dry_run=True, tpu_zone="europe-west4-a")
    near = upload(folder, store, dry_run=True, tpu_zone="us-central1-a")  # fake-gcs-server: US-CENTRAL1
    assert far.warning is not None and "europe-west4" in far.warning
    assert near.warning is None
