"""``tpuops data ...`` in-process through the real entry point (``tpuops.cli.main.run``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fake_gcs import FakeGcsServer

from tpuops.cli.main import run


def _csv(folder: Path, rows: int = 50) -> Path:
    path = folder / "iris.csv"
    lines = ["sepal,petal,species"] + [f"{i * 0.1:.1f},{i % 7},{'ab'[i % 2]}" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> object:
    capsys.readouterr()
    assert run(list(args)) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.unit
def test_convert_upload_verify_ls_on_a_local_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, root = tmp_path / "out", tmp_path / "store"
    converted = _json(capsys, "data", "convert", str(_csv(tmp_path)), "--format", "csv", "--out", str(out),
                      "--shards", "3", "--label-from", "column:species", "--json")
    assert converted["records"] == 50 and converted["shards"] == 3
    assert converted["manifest"]["labels"] == ["a", "b"]

    uploaded = _json(capsys, "data", "upload", str(out), str(root / "data" / "iris"), "--workers", "2", "--json")
    assert len(uploaded["sent"]) == 3 and uploaded["manifest_written"]
    again = _json(capsys, "data", "upload", str(out), str(root / "data" / "iris"), "--json")
    assert again["sent"] == [] and again["bytes_sent"] == 0

    assert _json(capsys, "data", "verify", str(root / "data" / "iris"), "--json")["ok"] is True
    listed = _json(capsys, "data", "ls", "--store", str(root), "--json")
    assert [(d["name"], d["records"], d["complete"]) for d in listed] == [("data/iris", 50, True)]


@pytest.mark.unit
def test_human_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert run(["data", "convert", str(_csv(tmp_path)), "-f", "csv", "-o", str(out), "--label-from", "species"]) == 0
    assert "50 records in 1 shards" in capsys.readouterr().out
    assert run(["data", "upload", str(out), str(tmp_path / "dest"), "--dry-run"]) == 0
    assert "would send 1 shards" in capsys.readouterr().out
    assert run(["data", "upload", str(out), str(tmp_path / "dest")]) == 0
    assert "sent 1 shards" in capsys.readouterr().out
    assert run(["data", "verify", str(tmp_path / "dest")]) == 0
    assert capsys.readouterr().out.startswith("ok: 1 shards, 50 records")


@pytest.mark.emulator
def test_upload_to_gcs_through_the_emulator_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    fake_gcs: FakeGcsServer, gcs_bucket: str,
) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake_gcs.endpoint)
    out = tmp_path / "out"
    assert run(["data", "convert", str(_csv(tmp_path)), "-f", "csv", "-o", str(out), "--shards", "2",
                "--label-from", "species"]) == 0
    uri = f"gs://{gcs_bucket}/root/data/iris"
    uploaded = _json(capsys, "data", "upload", str(out), uri, "--zone", "europe-west4-a", "--json")
    assert len(uploaded["sent"]) == 2
    assert "europe-west4" in uploaded["warning"]
    assert _json(capsys, "data", "verify", uri, "--json")["ok"] is True
    listed = _json(capsys, "data", "ls", f"gs://{gcs_bucket}/root", "--json")
    assert [(d["name"], d["uri"]) for d in listed] == [("data/iris", uri)]


@pytest.mark.unit
def test_errors_are_one_line_with_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["data", "convert", str(tmp_path / "missing.csv"), "-f", "csv", "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "missing.csv" in err and "\n" not in err

    out, dest = tmp_path / "out", tmp_path / "dest"
    assert run(["data", "convert", str(_csv(tmp_path)), "-f", "csv", "-o", str(out), "--shards", "2",
                "--label-from", "species"]) == 0
    assert run(["data", "upload", str(out), str(dest)]) == 0
    shard = sorted(p for p in dest.iterdir() if p.suffix == ".tfrecord")[1]
    shard.write_bytes(shard.read_bytes()[::-1])
    capsys.readouterr()
    assert run(["data", "verify", str(dest)]) == 1
    captured = capsys.readouterr()
    assert shard.name in captured.out
    assert captured.err.strip().startswith("error:") and shard.name in captured.err

    assert run(["data", "ls"]) == 2
    assert "--store" in capsys.readouterr().err


@pytest.mark.unit
def test_importing_the_cli_module_stays_light() -> None:
    heavy = ("numpy", "google.cloud.storage", "PIL")
    probe = f"import sys, tpuops.cli.data; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.unit
def test_verify_names_a_bad_record_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A shard whose manifest was made from its damaged bytes: only framing the records finds it (the store's
    data is wrong: a failure of the world, exit 1)."""
    from tpuops.data.manifest import MANIFEST, parse_manifest
    from tpuops.store.files import crc32c_of_bytes

    out = tmp_path / "out"
    assert run(["data", "convert", str(_csv(tmp_path)), "-f", "csv", "-o", str(out), "--shards", "2",
                "--label-from", "species"]) == 0
    manifest = parse_manifest((out / MANIFEST).read_bytes(), MANIFEST)
    shard = manifest.shards[1]
    data = bytearray((out / shard.name).read_bytes())
    data[12] ^= 0x01  # the first record's first data byte
    (out / shard.name).write_bytes(bytes(data))
    shards = [s.model_copy(update={"crc32c": crc32c_of_bytes(bytes(data))}) if s is shard else s
              for s in manifest.shards]
    (out / MANIFEST).write_bytes(manifest.model_copy(update={"shards": shards}).to_bytes())
    assert run(["data", "upload", str(out), str(tmp_path / "dest")]) == 0
    capsys.readouterr()

    assert run(["data", "verify", str(tmp_path / "dest")]) == 1
    captured = capsys.readouterr()
    assert "ok:" not in captured.out and shard.name in captured.out
    err = captured.err.strip()
    assert err.startswith("error:") and "\n" not in err
    assert f"{shard.name} (record 0 at byte 0: corrupt record data" in err
    assert run(["data", "verify", str(tmp_path / "dest"), "--json"]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert [p["name"] for p in problems] == [shard.name]
