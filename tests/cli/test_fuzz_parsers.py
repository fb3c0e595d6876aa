"""Every spec and config parser, fuzzed with the nasty corpus (``tests/corpus``), its mutations and drawn documents.

The promise: a document is either accepted, or refused with one ``UsageError`` line that names the
file; nothing else escapes (no RecursionError, UnicodeDecodeError, ValueError, OverflowError),
and nothing takes long or grows without bound (the anchor bomb is refused before it expands).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fuzzing import PROFILE, corpus_files
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuops.config import load_settings
from tpuops.core.errors import UsageError
from tpuops.data.manifest import parse_manifest
from tpuops.launch.experiment import load_experiment
from tpuops.sweeps.spec import load_sweep

pytestmark = pytest.mark.unit


def _settings(path: Path) -> Any:
    return load_settings(config_path=path, environ={})


def _manifest(path: Path) -> Any:
    return parse_manifest(path.read_bytes(), str(path))


PARSERS: dict[str, Callable[[Path], Any]] = {"experiment": load_experiment, "sweep": load_sweep,
                                             "config": _settings, "manifest": _manifest}


def _keeps_promise(parser: Callable[[Path], Any], path: Path) -> None:
    try:
        parser(path)
    except UsageError as err:
        text = str(err)
        assert "\n" not in text, f"{path.name}: a refusal of more than one line: {text[:300]!r}"
        assert len(text) < 600, f"{path.name}: a refusal of {len(text)} characters"


@pytest.mark.parametrize("parser", sorted(PARSERS))
@pytest.mark.parametrize("sample", corpus_files(), ids=lambda p: p.name)
def test_every_parser_refuses_the_corpus_in_one_line(parser: str, sample: Path) -> None:
    _keeps_promise(PARSERS[parser], sample)


EXPERIMENTS = [p for p in corpus_files() if p.suffix == ".yaml" and not p.name.startswith("sweep_")]


@pytest.mark.parametrize("sample", EXPERIMENTS, ids=lambda p: p.name)
def test_nasty_experiments_are_refused(sample: Path) -> None:
    with pytest.raises(UsageError):
        load_experiment(sample)


def _mutate(data: bytes, cuts: list[tuple[int, bytes]]) -> bytes:
    for offset, insert in cuts:
        at = offset % max(len(data), 1)
        data = data[:at] + insert + data[at + len(insert):]
    return data


SEEDS = [p for p in corpus_files() if p.stat().st_size < 20_000]
NASTY_BYTES = st.sampled_from([b"\xff", b"\x00", b"&a [*a]", b"*a", b": ", b"\n  - ", b"[" * 50, b".inf", b"9" * 30,
                               b"\t", b"!!python/object:os.system", b"'", b'"', b"{", b"#", b"---\n", b"%YAML 1.1\n"])


@settings(settings.get_profile(PROFILE))
@given(seed=st.sampled_from(SEEDS),
       cuts=st.lists(st.tuples(st.integers(0, 10_000), NASTY_BYTES | st.binary(max_size=8)), max_size=4),
       parser=st.sampled_from(sorted(PARSERS)))
def test_mutated_documents_keep_the_promise(tmp_path_factory: pytest.TempPathFactory, seed: Path,
                                            cuts: list[tuple[int, bytes]], parser: str) -> None:
    path = tmp_path_factory.mktemp("doc") / seed.name
    path.write_bytes(_mutate(seed.read_bytes(), cuts))
    _keeps_promise(PARSERS[parser], path)


SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                            max_size=3), max_leaves=12)
KEYS = st.sampled_from(["name", "model", "dataset", "steps", "batch", "hparams", "trials", "trails", "space",
                        "experiment", "budget_usd", "provider", "zones", "store", "records", "shards", "capacity"])


@settings(settings.get_profile(PROFILE))
@given(document=st.dictionaries(KEYS | st.text(max_size=8), VALUES, max_size=6),
       parser=st.sampled_from(sorted(PARSERS)))
def test_drawn_documents_keep_the_promise(tmp_path_factory: pytest.TempPathFactory, document: dict[str, Any],
                                          parser: str) -> None:
    path = tmp_path_factory.mktemp("doc") / "doc"
    path.write_text(json.dumps(document))  # JSON is YAML too; TOML refuses it in one line
    _keeps_promise(PARSERS[parser], path)
