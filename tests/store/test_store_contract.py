"""The ``Store`` contract (tpuops/store/base.py), run against every implementation.

Each test receives a store rooted at a fresh location; the tests never ask which
implementation they got. The GCS stores use small chunks so uploads of a few hundred KiB
already go through resumable sessions.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from lanes import LOCAL_AND_GCS

from tpuops.core.errors import NotFound, UsageError
from tpuops.store import IntegrityError, LocalStore, PreconditionFailed, Store, gcs_client, open_store
from tpuops.store.files import crc32c_of_bytes
from tpuops.store.gcs import GcsStore

SMALL_CHUNK = 256 * 1024


@dataclass
class Stores:
    """Makes stores rooted at ``name`` for one implementation, plus how another process opens them."""

    make: Callable[[str], Store]
    uri: Callable[[str], str]
    endpoint: str | None


@pytest.fixture(params=LOCAL_AND_GCS)
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Stores:
    if request.param == "local":
        return Stores(lambda name: LocalStore(tmp_path / name), lambda name: str(tmp_path / name), None)
    server = request.getfixturevalue("fake_gcs")
    bucket = request.getfixturevalue("gcs_bucket")
    client = gcs_client(server.endpoint)

    def make(name: str) -> Store:
        return GcsStore(
            bucket, f"root/{name}", client=client,
            chunk_size=SMALL_CHUNK, resumable_threshold=SMALL_CHUNK, deadline_s=10,
        )

    return Stores(make, lambda name: f"gs://{bucket}/root/{name}", server.endpoint)


@pytest.fixture
def store(stores: Stores) -> Store:
    return stores.make("main")


def test_write_then_read_returns_bytes_and_generation(store: Store) -> None:
    generation = store.write_bytes("runs/r1/status.json", b'{"phase": "RUNNING"}')
    data, read_generation = store.read_versioned("runs/r1/status.json")
    info = store.stat("runs/r1/status.json")
    assert data == b'{"phase": "RUNNING"}'
    assert generation > 0
    assert read_generation == generation == info.generation == store.generation_of("runs/r1/status.json")
    assert info.size == len(data)
    assert info.crc32c == crc32c_of_bytes(data)
    assert store.read_bytes("runs/r1/status.json") == data
    assert store.exists("runs/r1/status.json")


def test_missing_object(store: Store, tmp_path: Path) -> None:
    assert store.generation_of("nope") == 0
    assert not store.exists("nope")
    for call in (
        lambda: store.read_bytes("nope"),
        lambda: store.stat("nope"),
        lambda: store.download_file("nope", tmp_path / "out"),
    ):
        with pytest.raises(NotFound):
            call()
    assert not (tmp_path / "out").exists()


def test_overwrite_changes_generation(store: Store) -> None:
    first = store.write_bytes("k", b"one")
    second = store.write_bytes("k", b"two")
    third = store.write_bytes("k", b"two")
    assert len({first, second, third}) == 3
    assert store.read_versioned("k") == (b"two", third)


def test_compare_and_swap(store: Store) -> None:
    created = store.write_if_generation_match("leases/a", b"holder=1", 0)
    with pytest.raises(PreconditionFailed):
        store.write_if_generation_match("leases/a", b"holder=2", 0)
    updated = store.write_if_generation_match("leases/a", b"holder=1;renewed", created)
    assert updated != created
    with pytest.raises(PreconditionFailed):
        store.write_if_generation_match("leases/a", b"holder=3", created)
    assert store.read_versioned("leases/a") == (b"holder=1;renewed", updated)
    store.delete("leases/a")
    with pytest.raises(PreconditionFailed):
        store.write_if_generation_match("leases/a", b"holder=4", updated)
    assert not store.exists("leases/a")


@pytest.mark.parametrize("existing", [False, True])
def test_cas_race_between_threads_has_one_winner(store: Store, existing: bool) -> None:
    expected = store.write_bytes("leases/race", b"start") if existing else 0
    barrier = threading.Barrier(8)

    def contend(i: int) -> bool:
        barrier.wait()
        try:
            store.write_if_generation_match("leases/race", f"winner={i}".encode(), expected)
        except PreconditionFailed:
            return False
        return True

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(contend, range(8)))
    assert results.count(True) == 1
    assert store.read_bytes("leases/race") == f"winner={results.index(True)}".encode()


def _contend_in_process(uri: str, endpoint: str | None, generation: int, i: int, barrier, wins) -> None:
    target = open_store(uri, gcs_endpoint=endpoint)
    barrier.wait()
    try:
        target.write_if_generation_match("leases/race", f"process={i}".encode(), generation)
    except PreconditionFailed:
        return
    wins.put(i)


def test_cas_race_between_processes_has_one_winner(stores: Stores) -> None:
    store = stores.make("procs")
    generation = store.write_bytes("leases/race", b"start")
    context = multiprocessing.get_context("fork")
    barrier, wins = context.Barrier(4), context.Queue()
    workers = [
        context.Process(
            target=_contend_in_process,
            args=(stores.uri("procs"), stores.endpoint, generation, i, barrier, wins),
        )
        for i in range(4)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    winner = wins.get(timeout=5)
    assert wins.empty()
    assert store.read_bytes("leases/race") == f"process={winner}".encode()


def test_list_is_recursive_sorted_and_prefix_bounded(stores: Stores) -> None:
    store, sibling = stores.make("main"), stores.make("main2")
    for key in ("data/b/manifest.json", "data/a/shard-0", "data/a/sub/x", "runs/r1/spec.json", "dat"):
        store.write_bytes(key, key.encode())
    sibling.write_bytes("data/a/other", b"not in main")

    listing = store.list("data/")
    assert [info.key for info in listing] == ["data/a/shard-0", "data/a/sub/x", "data/b/manifest.json"]
    for info in listing:
        assert info == store.stat(info.key)
        assert info.size == len(info.key)
    assert [info.key for info in store.list("data/a")] == ["data/a/shard-0", "data/a/sub/x"]
    assert store.list("da")[0].key == "dat"
    assert len(store.list()) == 5
    assert store.list("nothing/") == []


def test_delete_is_idempotent(store: Store) -> None:
    store.write_bytes("a/b", b"x")
    store.delete("a/b")
    store.delete("a/b")
    assert not store.exists("a/b")
    assert store.list("a/") == []


def test_upload_and_download_verify_crc32c(store: Store, tmp_path: Path) -> None:
    payload = os.urandom(3 * SMALL_CHUNK + 12345)
    source = tmp_path / "shard.bin"
    source.write_bytes(payload)
    seen: list[int] = []

    info = store.upload_file(source, "data/d/shard.bin", expected_crc32c=crc32c_of_bytes(payload),
                             progress=seen.append)
    assert info.size == len(payload)
    assert info.crc32c == crc32c_of_bytes(payload) == store.stat("data/d/shard.bin").crc32c
    assert seen[-1] == len(payload)
    assert seen == sorted(seen)

    target = tmp_path / "copy.bin"
    downloaded = store.download_file("data/d/shard.bin", target)
    assert target.read_bytes() == payload
    assert downloaded.crc32c == info.crc32c
    assert downloaded.generation == info.generation


def test_small_and_empty_uploads(store: Store, tmp_path: Path) -> None:
    for name, payload in (("empty", b""), ("small", b"tiny")):
        source = tmp_path / name
        source.write_bytes(payload)
        info = store.upload_file(source, f"f/{name}")
        assert (info.size, info.crc32c) == (len(payload), crc32c_of_bytes(payload))
        assert store.read_bytes(f"f/{name}") == payload


def test_upload_refuses_a_file_that_does_not_match_its_checksum(store: Store, tmp_path: Path) -> None:
    source = tmp_path / "shard.bin"
    source.write_bytes(b"changed after the manifest was written")
    with pytest.raises(IntegrityError, match=r"shard\.bin"):
        store.upload_file(source, "data/d/shard.bin", expected_crc32c=crc32c_of_bytes(b"original"))
    assert not store.exists("data/d/shard.bin")
    with pytest.raises(UsageError, match=r"missing\.bin"):
        store.upload_file(tmp_path / "missing.bin", "data/d/missing.bin")


def test_readers_never_see_a_partial_object(store: Store) -> None:
    versions = (b"a" * (600 * 1024), b"b" * (700 * 1024))
    store.write_bytes("big", versions[0])
    stop = threading.Event()
    seen: set[bytes] = set()

    def read_until_stopped() -> None:
        while not stop.is_set():
            seen.add(store.read_bytes("big"))

    readers = [threading.Thread(target=read_until_stopped) for _ in range(2)]
    for reader in readers:
        reader.start()
    try:
        for i in range(12):
            store.write_bytes("big", versions[i % 2])
    finally:
        stop.set()
        for reader in readers:
            reader.join()
    assert seen <= set(versions)


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "a/../b", "./a", "a/", ".tpuops/lock"])
def test_invalid_keys_are_usage_errors(store: Store, key: str) -> None:
    with pytest.raises(UsageError):
        store.write_bytes(key, b"x")


def test_uri_of_names_the_object(stores: Stores) -> None:
    assert stores.make("main").uri_of("runs/r1/spec.json") == stores.uri("main") + "/runs/r1/spec.json"


@pytest.mark.unit
def test_open_store_picks_the_implementation_by_scheme(tmp_path: Path) -> None:
    assert open_store(str(tmp_path)).uri == str(tmp_path)
    assert open_store(f"file://{tmp_path}").uri == str(tmp_path)
    assert open_store("gs://bucket/a/b/", gcs_endpoint="http://127.0.0.1:9").uri == "gs://bucket/a/b"
    with pytest.raises(UsageError, match="s3"):
        open_store("s3://bucket/x")
    with pytest.raises(UsageError):
        open_store("gs:///nobucket")


# ----- the GCS adapter's error table (classification on status codes, not message text) -----


@pytest.mark.unit
@pytest.mark.parametrize(
    ("error", "expected", "retryable"),
    [
        ("Forbidden", "PermissionDenied", False),
        ("Unauthorized", "PermissionDenied", False),
        ("NotFound", "NotFound", False),
        ("PreconditionFailed", "PreconditionFailed", False),
        ("Conflict", "AlreadyExists", False),
        ("BadRequest", "InvalidRequest", False),
        ("TooManyRequests", "TransientError", True),
        ("ServiceUnavailable", "TransientError", True),
        ("InternalServerError", "TransientError", True),
        ("GatewayTimeout", "TransientError", True),
    ],
)
def test_gcs_errors_map_onto_the_taxonomy(error: str, expected: str, retryable: bool) -> None:
    from google.api_core import exceptions as api

    from tpuops.store.gcs import convert_error

    converted = convert_error(getattr(api, error)("POST https://storage.googleapis.com/...: nope"), "gs://b/k")
    assert type(converted).__name__ == expected
    assert converted is not None and converted.retryable is retryable
    assert str(converted).startswith("gs://b/k: ") and "\n" not in str(converted)


@pytest.mark.unit
def test_gcs_transport_and_credential_errors_map_onto_the_taxonomy() -> None:
    import requests
    from google.auth import exceptions as auth

    from tpuops.core.errors import PermissionDenied, TransientError
    from tpuops.store.gcs import convert_error

    assert isinstance(convert_error(requests.ConnectionError("refused"), "gs://b"), TransientError)
    assert isinstance(convert_error(auth.DefaultCredentialsError("none"), "gs://b"), PermissionDenied)
    assert convert_error(ValueError("a bug, not a failure of the store"), "gs://b") is None


def test_a_store_pickles_and_its_copy_reads_and_writes_the_same_objects(store: Store) -> None:
    store.write_bytes("a", b"one")
    copy = pickle.loads(pickle.dumps(store))
    assert copy.uri == store.uri
    assert copy.read_bytes("a") == b"one"
    copy.write_bytes("b", b"two")
    assert store.read_bytes("b") == b"two"


@pytest.mark.emulator
def test_gcs_listing_skips_the_folder_markers_tensorflow_writes(fake_gcs, gcs_bucket: str) -> None:
    """``tf.io.gfile.makedirs`` on gs:// writes empty objects named ``dir/``: they are not store objects."""
    client = gcs_client(fake_gcs.endpoint)
    store = GcsStore(gcs_bucket, "root", client=client)
    store.write_bytes("runs/r1/ckpt/checkpoint", b"x")
    client.bucket(gcs_bucket).blob("root/runs/r1/ckpt/").upload_from_string(b"")
    assert [info.key for info in store.list("runs/r1/")] == ["runs/r1/ckpt/checkpoint"]
