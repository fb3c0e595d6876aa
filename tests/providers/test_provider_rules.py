"""The settings ask the node providers, and ``tpuops.config`` imports none: which providers exist, and which zones
and accelerators the configured one offers, are the providers' rules (``tpuops.providers.registry.RULES``),
handed to ``config.load_settings`` by the api layer (``tpuops.api.load_settings``).

``tests/providers/test_provider_jobset.py`` shows a provider whose rules differ from Cloud TPU's (no v3 on GKE)
applied to the same file.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tpuops
from tpuops import api
from tpuops.config import load_settings
from tpuops.core.errors import UsageError

pytestmark = pytest.mark.unit

CONFIG = Path(tpuops.__file__).parent / "config.py"


def test_config_imports_no_provider() -> None:
    imported = [node.module for node in ast.walk(ast.parse(CONFIG.read_text(encoding="utf-8")))
                if isinstance(node, ast.ImportFrom) and node.module]
    imported += [alias.name for node in ast.walk(ast.parse(CONFIG.read_text(encoding="utf-8")))
                 if isinstance(node, ast.Import) for alias in node.names]
    assert [name for name in imported if name.startswith("tpuops.providers")] == []


@pytest.mark.parametrize(("text", "expected"), [
    ('zones = ["us-central1-x"]', "zone 'us-central1-x' offers no Cloud TPUs (did you mean 'us-central1-"),
    ('accelerator = "v9-8"', "accelerator 'v9-8' is not a Cloud TPU type"),
    ('node_provider = "gke"', "not a registered node provider (expected one of cloud-tpu, memory, simulated)"),
])
def test_the_providers_rules_refuse_what_no_provider_offers(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "tpuops.toml"
    path.write_text(text + "\n")
    env = {"TPUOPS_HOME": str(tmp_path)}
    with pytest.raises(UsageError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        api.load_settings(path, env)
    # without the rules, config checks what holds for any provider only: these are well-formed values
    assert load_settings(config_path=path, environ=env) is not None


def test_a_zone_name_of_the_wrong_shape_is_refused_without_any_provider(tmp_path: Path) -> None:
    path = tmp_path / "tpuops.toml"
    path.write_text('zones = ["central"]\n')
    with pytest.raises(UsageError, match="zone 'central' is not a zone name such as 'us-central1-a'"):
        load_settings(config_path=path, environ={"TPUOPS_HOME": str(tmp_path)})


def test_init_writes_nothing_the_configured_provider_refuses(tmp_path: Path) -> None:
    path = tmp_path / "tpuops.toml"
    with pytest.raises(UsageError, match="offers no Cloud TPUs"):
        api.init(path, {"zones": ["mars-central1-z"]})
    assert not path.exists()
