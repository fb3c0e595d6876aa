"""One notion of provider: ``node_provider`` says which provider makes the nodes, its connection (``tpu_endpoint``)
says where its cloud is, and nothing else in tpuops keeps a second, ``local``/``gcp`` notion of its own.

Older ``tpuops.toml`` files and environments say ``provider = "local"|"gcp"``: ``tpuops.config`` reads that old
key into ``tpu_endpoint``, and it is the only module that may name it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tpuops import config
from tpuops.config import Settings, load_settings, write_config
from tpuops.core import kinds
from tpuops.core.errors import UsageError
from tpuops.core.kinds import Cloud

pytestmark = pytest.mark.unit

PACKAGE = Path(config.__file__).parent


def _reads_of_the_old_key(path: Path) -> list[str]:
    """Where ``path`` reads a ``provider`` off settings, or names the old key as a string."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr == config.OLD_KEY and "settings" in ast.unparse(node.value):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Constant) and node.value == config.OLD_KEY:
            found.append(f"{path.name}:{node.lineno}: the string {node.value!r}")
    return found


def test_no_module_but_config_reads_a_second_provider_notion() -> None:
    assert config.OLD_KEY not in Settings.model_fields
    assert not hasattr(kinds, "Provider")
    reads = [hit for path in sorted(PACKAGE.rglob("*.py")) if path != Path(config.__file__)
             for hit in _reads_of_the_old_key(path)]
    assert reads == []


def test_the_guard_sees_a_second_notion_when_one_comes_back(tmp_path: Path) -> None:
    back = tmp_path / "back.py"
    back.write_text('def local(settings, values):\n    return settings.provider == values["provider"]\n')
    assert _reads_of_the_old_key(back) == ["back.py:2: settings.provider", "back.py:2: the string 'provider'"]


@pytest.mark.parametrize(("text", "environ", "endpoint", "cloud"), [
    ('provider = "gcp"\nproject = "p-1"\nstore = "gs://b/x"\n', {}, "gcp", Cloud.GCP),
    ('provider = "local"\n', {}, "local", Cloud.LOCAL),
    ('provider = "local"\ntpu_endpoint = "http://127.0.0.1:8470"\n', {}, "http://127.0.0.1:8470", Cloud.LOCAL),
    ('tpu_endpoint = "gcp"\nproject = "p-1"\nstore = "gs://b/x"\n', {"TPUOPS_PROVIDER": "local"}, "local",
     Cloud.LOCAL),
    ('provider = "local"\nproject = "p-1"\nstore = "gs://b/x"\n', {"TPUOPS_TPU_ENDPOINT": "https://tpu.example.com"},
     "https://tpu.example.com", Cloud.GCP),
    ('tpu_endpoint = "https://tpu.example.com"\nproject = "p-1"\nstore = "gs://b/x"\n', {"TPUOPS_PROVIDER": "gcp"},
     "https://tpu.example.com", Cloud.GCP),
    ('tpu_endpoint = "https://tpu.example.com"\n', {"TPUOPS_PROVIDER": "local"}, "local", Cloud.LOCAL),
])
def test_the_old_key_is_read_into_the_providers_connection(tmp_path: Path, text: str, environ: dict[str, str],
                                                          endpoint: str, cloud: Cloud) -> None:
    path = tmp_path / "tpuops.toml"
    path.write_text(text)
    settings = load_settings(config_path=path, environ={"TPUOPS_HOME": str(tmp_path), **environ})
    assert (settings.tpu_endpoint, settings.cloud) == (endpoint, cloud)
    assert settings.endpoint_url == (endpoint if "://" in endpoint else None)


def test_a_bad_old_key_is_one_line_and_init_writes_the_new_shape(tmp_path: Path) -> None:
    path = tmp_path / "tpuops.toml"
    path.write_text('provider = "cloud"\n')
    with pytest.raises(UsageError, match=r"provider = 'cloud' is not allowed: expected 'local' or 'gcp'") as caught:
        load_settings(config_path=path, environ={"TPUOPS_HOME": str(tmp_path)})
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)
    written = tmp_path / "new.toml"
    assert write_config(written, {"provider": Cloud.LOCAL}).cloud is Cloud.LOCAL
    assert written.read_text() == 'tpu_endpoint = "local"\n'


@pytest.mark.parametrize(("endpoint", "local"), [("local", True), ("http://127.0.0.1:8470", True), ("gcp", False),
                                                 ("https://tpu.example.com", False)])
def test_what_follows_from_where_the_cloud_is(tmp_path: Path, endpoint: str, local: bool) -> None:
    """The store's bucket is the emulator's on a local cloud only; the API's address is the configured one, else
    Google's (None) on gcp, and the emulator runs on doctor's checks only where the cloud is local."""
    from tpuops import doctor, session

    settings = Settings(tpu_endpoint=endpoint, home=tmp_path, store="gs://bkt/root", project="p-1")
    assert session.emulated_buckets(settings) == (["bkt"] if local else [])
    if endpoint != "local":  # "local" with no address starts the emulator: the emulator tests cover it
        assert session.tpu_endpoint(settings) == settings.endpoint_url
    if local:
        apis = doctor._Apis(settings)
        assert apis.local and doctor.check_emulator(apis).detail != "not used (provider gcp)"
        assert apis.base("tpu") == (settings.endpoint_url or None)
