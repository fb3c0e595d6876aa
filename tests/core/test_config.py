"""Configuration precedence and one-line validation errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuops.config import load_settings, write_config
from tpuops.core.errors import UsageError
from tpuops.core.kinds import Capacity, Cloud

pytestmark = pytest.mark.unit


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tpuops.toml"
    path.write_text(text)
    return path


def test_defaults_are_local_spot_v3_8(tmp_path: Path) -> None:
    settings = load_settings(environ={"TPUOPS_HOME": str(tmp_path)}, config_path=None)
    assert settings.cloud is Cloud.LOCAL
    assert settings.capacity is Capacity.SPOT
    assert settings.accelerator == "v3-8"
    assert settings.store_root == str(tmp_path / "store")


def test_the_vm_service_account_reaches_the_create_body(tmp_path: Path) -> None:
    from tpuops.launch.provision import plan_up
    from tpuops.providers.cloud_tpu.adapter import node_body

    email = "tpuops-vm@my-project.iam.gserviceaccount.com"
    path = _write(tmp_path, f'service_account = "{email}"\n')
    settings = load_settings(config_path=path, environ={"TPUOPS_HOME": str(tmp_path)})
    account = node_body(plan_up(settings, "n1").request)["serviceAccount"]
    assert account == {"email": email, "scope": ["https://www.googleapis.com/auth/cloud-platform"]}
    default = plan_up(load_settings(environ={"TPUOPS_HOME": str(tmp_path)}, config_path=None), "n1")
    assert "email" not in node_body(default.request)["serviceAccount"]


def test_precedence_env_over_file(tmp_path: Path) -> None:
    path = _write(tmp_path, 'project = "from-file"\nzones = ["europe-west4-a"]\naccelerator = "v2-8"\n')
    env = {"TPUOPS_HOME": str(tmp_path), "GOOGLE_CLOUD_PROJECT": "from-env",
           "TPUOPS_ZONES": "us-central1-b, us-central1-a"}
    settings = load_settings(config_path=path, environ=env)
    assert settings.project == "from-env"
    assert settings.zones == ["us-central1-b", "us-central1-a"]
    assert settings.accelerator == "v2-8"
    only_file = load_settings(config_path=path, environ={"TPUOPS_HOME": str(tmp_path)})
    assert (only_file.project, only_file.zones, only_file.accelerator) == ("from-file", ["europe-west4-a"], "v2-8")


def test_tpuops_env_overrides_google_cloud_project(tmp_path: Path) -> None:
    env = {"TPUOPS_HOME": str(tmp_path), "GOOGLE_CLOUD_PROJECT": "g", "TPUOPS_PROJECT": "t"}
    assert load_settings(environ=env, config_path=None).project == "t"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('capacity = "cheap"', "capacity = 'cheap' is not allowed: expected 'spot', 'preemptible' or 'on-demand'"),
        ('zones = ["central"]', "zones = ['central'] is not allowed: zone 'central' is not a zone name"),
        ('colour = "blue"', "unknown key 'colour'"),
        ('tpu_endpoint = "localhost:1"', "tpu_endpoint = 'localhost:1' is not allowed: expected a URL"),
        ("poll_interval_s = -1", "poll_interval_s = -1 is not allowed"),
        ("capacity = ", "not valid TOML"),
        ('service_account = "tpuops-vm"', "service_account = 'tpuops-vm' is not allowed"),
        ('node_provider = "cloud-tup"', "node_provider = 'cloud-tup' is not allowed: not a registered node provider "
                                        "(did you mean 'cloud-tpu'?)"),
        ('node_provider = "gke"', "expected one of cloud-tpu, memory, simulated"),
    ],
)
def test_bad_values_give_one_line_naming_key_and_value(tmp_path: Path, text: str, expected: str) -> None:
    from tpuops import api

    path = _write(tmp_path, text + "\n")
    with pytest.raises(UsageError) as caught:
        api.load_settings(path, {"TPUOPS_HOME": str(tmp_path)})  # the settings, checked by the providers' rules
    message = str(caught.value)
    assert expected in message
    assert str(path) in message
    assert "\n" not in message
    assert caught.value.exit_code == 2


def test_env_value_error_names_the_environment(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^environment: capacity = 'later'"):
        load_settings(environ={"TPUOPS_HOME": str(tmp_path), "TPUOPS_CAPACITY": "later"}, config_path=None)


def test_gcp_needs_project_and_bucket(tmp_path: Path) -> None:
    env = {"TPUOPS_HOME": str(tmp_path), "TPUOPS_PROVIDER": "gcp"}
    with pytest.raises(UsageError, match="provider 'gcp' needs a project"):
        load_settings(environ=env, config_path=None)
    with pytest.raises(UsageError, match="expected a bucket URI"):
        load_settings(environ={**env, "TPUOPS_PROJECT": "p-1", "TPUOPS_STORE": "/tmp/x"}, config_path=None)
    ok = load_settings(environ={**env, "TPUOPS_PROJECT": "p-1", "TPUOPS_STORE": "gs://b/x"}, config_path=None)
    assert ok.store_root == "gs://b/x"


def test_write_config_round_trips_and_refuses_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "tpuops.toml"
    settings = write_config(path, {"provider": "local", "zones": ["us-central1-b", "us-central1-c"],
                                   "labels": {"team": "ml", "cost-center": "x_1"}, "capacity": Capacity.ON_DEMAND})
    assert settings.zones == ["us-central1-b", "us-central1-c"]
    again = load_settings(config_path=path, environ={"TPUOPS_HOME": str(tmp_path)})
    assert again.labels == {"team": "ml", "cost-center": "x_1"}
    assert again.capacity is Capacity.ON_DEMAND
    with pytest.raises(UsageError, match="exists already"):
        write_config(path, {"provider": "local"})


def test_write_config_rejects_bad_value_without_writing(tmp_path: Path) -> None:
    path = tmp_path / "tpuops.toml"
    with pytest.raises(UsageError, match="capacity = 'never'"):
        write_config(path, {"capacity": "never"})
    assert not path.exists()


def test_loading_settings_probes_nothing_and_prints_nothing(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A gs:// store on provider local is checked against this machine where the store is opened (session)."""
    import subprocess
    import sys

    settings = load_settings(environ={"TPUOPS_HOME": str(tmp_path), "TPUOPS_STORE": "gs://b/p"}, config_path=None)
    assert settings.store_root == "gs://b/p"
    assert capfd.readouterr().err == ""
    probe = "import sys, tpuops.config; print(sorted(m for m in sys.modules if m.startswith('tpuops.emulator')))"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True).stdout.strip() == "[]"


def test_a_store_the_machine_can_serve_is_kept_without_a_warning(tmp_path: Path) -> None:
    from tpuops.emulator import unavailable_reason
    from tpuops.session import with_reachable_store

    warned: list[str] = []
    local = load_settings(environ={"TPUOPS_HOME": str(tmp_path)}, config_path=None)
    assert with_reachable_store(local, warned.append) is local and warned == []
    bucket = local.model_copy(update={"store": "gs://b/p"})
    reason = unavailable_reason()
    kept = with_reachable_store(bucket, warned.append)
    if reason is None:
        assert kept.store_root == "gs://b/p" and warned == []
    else:
        assert kept.store_root == str(tmp_path / "store")
        assert warned == [f"{reason}: using the local store {tmp_path / 'store'} instead of gs://b/p"]


def test_an_integer_setting_from_the_environment_is_read_as_its_number(tmp_path: Path) -> None:
    """The environment is text: TPUOPS_MAX_RESTARTS=1 is 1, while a file's `max_restarts = true` stays refused."""
    config = tmp_path / "tpuops.toml"
    config.write_text("")
    settings = load_settings(config_path=config, environ={"TPUOPS_MAX_RESTARTS": "1", "TPUOPS_HOME": str(tmp_path)})
    assert settings.max_restarts == 1
    with pytest.raises(UsageError, match="max_restarts"):
        load_settings(config_path=config, environ={"TPUOPS_MAX_RESTARTS": "one", "TPUOPS_HOME": str(tmp_path)})
    config.write_text("max_restarts = true\n")
    with pytest.raises(UsageError, match="max_restarts"):
        load_settings(config_path=config, environ={"TPUOPS_HOME": str(tmp_path)})




@pytest.mark.parametrize("lacking", ["CAP_SYS_ADMIN", "util-linux"])
def test_without_namespaces_a_gs_store_on_provider_local_is_one_line_then_the_local_store(lacking: str,
                                                                                          tmp_path: Path) -> None:
    """The real check (``netview.unavailable_reason``) in a real ``tpuops`` process that lacks what it needs.

    As root, that process has CAP_SYS_ADMIN dropped from its bounding set (setpriv), so the
    ``unshare -m`` probe really fails, or has no util-linux on its PATH; run by another user it has
    no root. (runuser to ``nobody`` cannot be used here: the interpreter lives under /root, mode 0700.)
    The listing shows the run declared in the local store beforehand: that store is the one used.
    """
    import json
    import os
    import shutil
    import subprocess
    import sys

    from tests.runs.test_runs import declare
    from tpuops.store import LocalStore

    root = os.geteuid() == 0
    if root and lacking == "CAP_SYS_ADMIN" and shutil.which("setpriv") is None:
        pytest.skip("dropping CAP_SYS_ADMIN needs setpriv (util-linux)")
    declare(LocalStore(tmp_path / "store"), "kept-locally")
    (tmp_path / "tpuops.toml").write_text('provider = "local"\nstore = "gs://bkt/prefix"\n')
    env = {"PATH": os.environ["PATH"], "TPUOPS_HOME": str(tmp_path), "TPUOPS_CONFIG": str(tmp_path / "tpuops.toml")}
    command = [sys.executable, "-m", "tpuops", "runs", "--json"]
    if lacking == "util-linux":
        env["PATH"] = str(tmp_path)  # no unshare on this PATH; the interpreter is named by its path
    elif root:
        command = ["setpriv", "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin", *command]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    [line] = done.stderr.splitlines()
    why = {"CAP_SYS_ADMIN": "needs mount namespaces (unshare -m: ", "util-linux": "needs unshare and mount"}[lacking]
    assert line.startswith("tpuops: a gs:// store on the local emulator " + (why if root else "needs root")), line
    assert line.endswith(f": using the local store {tmp_path / 'store'} instead of gs://bkt/prefix"), line
    assert [run["run_id"] for run in json.loads(done.stdout)["runs"]] == ["kept-locally"]
