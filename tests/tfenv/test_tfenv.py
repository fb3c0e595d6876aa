"""The local TF 2.9 runtime: the search order, finding an interpreter to build with, and the build.

The build is driven with a stand-in interpreter (a shell script that plays ``python -m venv``,
pip and the TensorFlow import), so every branch runs in milliseconds; the real build from the
packaged pins runs in ``test_wheel.py``.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from helpers import settings_at

from tpuops.cli.main import run
from tpuops.core.errors import TpuopsError, UsageError
from tpuops.core.resources import PIN_FILE, pin_file_text
from tpuops.tfenv import build, locate, pythons

pytestmark = pytest.mark.unit


def _venv(folder: Path, *, stamp: bool) -> Path:
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "python").write_text("")
    (folder / "pyvenv.cfg").write_text("home = /usr/bin\n")
    if stamp:
        (folder / locate.STAMP).write_text(json.dumps({"pins_sha256": build.pins_sha256()}))
    return folder


@pytest.fixture
def no_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Pretend tpuops is installed from a wheel: no checkout next to the package."""
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.setattr(locate, "CHECKOUT", site)
    return site


def test_home_runtime_is_used_only_once_its_stamp_is_written(tmp_path: Path, no_checkout: Path) -> None:
    settings = settings_at(tmp_path)
    assert locate.find(settings) is None
    half_built = _venv(locate.home_runtime(settings), stamp=False)
    assert locate.find(settings) is None
    (half_built / locate.STAMP).write_text("{}")
    found = locate.find(settings)
    assert found is not None and (found.source, found.python) == ("home", half_built / "bin" / "python")


def test_the_checkout_venv_comes_after_the_home_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkout = tmp_path / "repo"
    _venv(checkout / ".venv-tf29", stamp=False)
    (checkout / "pyproject.toml").write_text("")
    monkeypatch.setattr(locate, "CHECKOUT", checkout)
    settings = settings_at(tmp_path)
    assert locate.require(settings) == checkout / ".venv-tf29" / "bin" / "python"
    _venv(locate.home_runtime(settings), stamp=True)
    assert locate.require(settings) == locate.home_runtime(settings) / "bin" / "python"
    assert [c.source for c in locate.candidates(settings)] == ["home", "checkout"]


def test_an_explicit_tf_python_is_the_only_place_looked_at(tmp_path: Path, no_checkout: Path) -> None:
    _venv(tmp_path / "home" / "runtime" / "tf29", stamp=True)
    missing = settings_at(tmp_path, tf_python=str(tmp_path / "nope" / "python"))
    with pytest.raises(UsageError, match=r"tf_python = .*nope/python.*: no such interpreter"):
        locate.require(missing)
    python = tmp_path / "tf" / "python"
    python.parent.mkdir()
    python.write_text("")
    assert locate.require(settings_at(tmp_path, tf_python=str(python))) == python


def test_no_runtime_is_one_line_saying_how_to_get_one(tmp_path: Path, no_checkout: Path) -> None:
    settings = settings_at(tmp_path)
    with pytest.raises(UsageError) as raised:
        locate.require(settings)
    message = str(raised.value)
    assert "\n" not in message
    assert "tpuops runtime install" in message and str(tmp_path / "home" / "runtime" / "tf29") in message


def test_runtime_status_json_names_the_search_order(tmp_path: Path, no_checkout: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TPUOPS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TPUOPS_CONFIG", str(tmp_path / "tpuops.toml"))
    monkeypatch.delenv("TPUOPS_TF_PYTHON", raising=False)
    (tmp_path / "tpuops.toml").write_text("")
    assert run(["runtime", "status", "--json"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["runtime"] is None
    assert [c["source"] for c in json.loads(out)["candidates"]] == ["home"]
    assert "tpuops runtime install" in err and "Traceback" not in err


def _fake_python(folder: Path, name: str, *, pip_fails: bool = False, tf_version: str = "2.9.3") -> Path:
    """A stand-in base interpreter: ``-m venv DIR`` makes a venv whose python plays pip and TF."""
    venv_python = textwrap.dedent(f"""\
        #!/bin/bash
        echo "$@" >> "$(dirname "$0")/../calls"
        if [ "$1 $2" = "-m pip" ]; then
          echo "Collecting tensorflow-cpu==2.9.3"
          {'echo "ERROR: No matching distribution found for tensorflow-cpu==2.9.3"; exit 1' if pip_fails else ''}
          echo "Successfully installed tensorflow-cpu-2.9.3"; exit 0
        fi
        case "$2" in *tensorflow*) echo "{tf_version}";; *) echo "3.8.18";; esac
        """)
    script = folder / name
    script.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        [ "$1 $2" = "-m venv" ] || exit 3
        mkdir -p "$3/bin" && echo "home = /usr/bin" > "$3/pyvenv.cfg"
        cat > "$3/bin/python" <<'PY'
        {textwrap.indent(venv_python, "        ").strip()}
        PY
        chmod +x "$3/bin/python"
        """))
    script.chmod(0o755)
    return script


def test_install_builds_from_the_packaged_pins_and_stamps_last(tmp_path: Path) -> None:
    seen: list[str] = []
    venv = tmp_path / "runtime" / "tf29"
    built = build.install(venv, base_python=str(_fake_python(tmp_path, "py38")), progress=seen.append)
    assert not built.reused
    assert (venv / PIN_FILE).read_text() == pin_file_text()
    stamp = json.loads((venv / locate.STAMP).read_text())
    assert stamp["pins_sha256"] == build.pins_sha256() and (stamp["python"], stamp["tensorflow"]) == ("3.8.18",
                                                                                                    "2.9.3")
    assert any("Collecting tensorflow-cpu==2.9.3" in line for line in seen)
    # compiled as installed: a node's TensorFlow import is then not compiled again at every boot
    assert f"-m pip install --progress-bar off -r {venv / PIN_FILE}\n" in (venv / "calls").read_text()

    again = build.install(venv, base_python="/nonexistent/python")
    assert again.reused and again.stamp == stamp
    rebuilt = build.install(venv, base_python=str(_fake_python(tmp_path, "py38b")), force=True)
    assert not rebuilt.reused


@pytest.mark.parametrize(("fake", "message"), [
    ({"pip_fails": True}, "pip could not install the TF 2.9 pins: ERROR: No matching distribution found"),
    ({"tf_version": "2.11.0"}, "imports TensorFlow 2.11.0, not 2.9"),
])
def test_a_failed_build_leaves_nothing_behind(tmp_path: Path, fake: dict, message: str) -> None:
    venv = tmp_path / "runtime" / "tf29"
    with pytest.raises(TpuopsError, match=message):
        build.install(venv, base_python=str(_fake_python(tmp_path, "py38", **fake)))
    assert not venv.exists()


def test_install_never_deletes_a_folder_that_is_not_a_venv(tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    with pytest.raises(UsageError, match="exists and is not a Python venv"):
        build.install(precious, base_python=str(_fake_python(tmp_path, "py38")))
    assert (precious / "thesis.tex").read_text() == "years of work"


def test_find_python_looks_under_pyenv_and_names_what_to_install(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    with pytest.raises(UsageError) as raised:
        pythons.find_python(["3.8", "3.9"])
    assert str(raised.value) == ("no Python 3.8, 3.9 found on PATH, under pyenv or through uv: install one "
                                 "(e.g. 'pyenv install 3.8', 'uv python install 3.8' or your OS's python3.8)")
    fake = tmp_path / "pyenv" / "versions" / "3.9.18" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho 3.9\n")
    fake.chmod(0o755)
    assert pythons.find_python(["3.8", "3.9"]) == str(fake)
