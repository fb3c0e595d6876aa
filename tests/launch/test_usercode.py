"""Pre-launch checks of user code (ast, no TensorFlow) and the experiment modes."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import REPO

from tpuops.core.errors import UsageError
from tpuops.launch.experiment import load_experiment
from tpuops.launch.usercode import check_experiment, check_input_fn, check_program, find_function

pytestmark = pytest.mark.unit

EXPERIMENTS = REPO / "experiments"


@pytest.fixture
def code(tmp_path: Path) -> Path:
    (tmp_path / "inputs.py").write_text(
        "import tensorflow as tf\n"
        "def good(file_patterns, batch_size, *, training, seed, input_context):\n    pass\n"
        "def loose(file_patterns, batch_size, **options):\n    pass\n"
        "def short(file_patterns, batch_size):\n    pass\n"
        "def no_seed(file_patterns, batch_size, *, training, input_context):\n    pass\n"
        "alias = good\n"
    )
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "models.py").write_text("def build(hparams):\n    pass\n")
    (tmp_path / "broken.py").write_text("def build(:\n")
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "latin.py").write_bytes("def build(hparams):\n    return 'caf\u00e9'\n".encode("latin-1"))
    (tmp_path / "declared.py").write_bytes("# -*- coding: latin-1 -*-\ndef build(hparams):\n    return 'caf\u00e9'\n"
                                           .encode("latin-1"))
    (tmp_path / "nul.py").write_bytes(b"x = 1\ndef build(hparams):\x00\n")
    return tmp_path


def test_functions_are_found_in_modules_and_packages(code: Path) -> None:
    assert find_function(code, "pkg.models:build", "model") is not None
    assert find_function(code, "inputs:alias", "input") is None, "bound by assignment: left to the agent"
    assert find_function(code, "declared:build", "model") is not None, "a PEP 263 coding line is honoured"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("absent:build", "model absent:build: no module 'absent' in"),
        ("inputs:build", "model inputs:build: inputs.py defines no function 'build'"),
        ("broken:build", "does not parse: invalid syntax (line 1)"),
        ("latin:build", "latin.py does not parse: (unicode error) 'utf-8' codec can't decode byte 0xe9"),
        ("nul:build", "nul.py is not Python source: a NUL byte (line 2)"),
    ],
)
def test_missing_code_is_one_line(code: Path, name: str, message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")) as raised:
        find_function(code, name, "model")
    assert "\n" not in str(raised.value)


def test_input_fn_signatures(code: Path) -> None:
    check_input_fn(code, "inputs:good")
    check_input_fn(code, "inputs:loose")
    for name in ("inputs:short", "inputs:no_seed"):
        with pytest.raises(UsageError, match=r"expected input_fn\(file_patterns, batch_size, \*, training, seed"):
            check_input_fn(code, name)


def test_scripts_must_be_in_the_bundle(code: Path) -> None:
    check_program(code, ["python", "train.py", "--epochs", "2"])
    check_program(code, ["python3", "-m", "somewhere.train"])
    with pytest.raises(UsageError, match=r"command: absent\.py is not in"):
        check_program(code, ["python", "absent.py"])


def test_experiment_modes_and_their_rules(tmp_path: Path) -> None:
    modes = {path.stem: load_experiment(path).mode for path in EXPERIMENTS.glob("*.yaml")}
    assert modes["article_cnn"] == "script" and modes["text_classifier"] == "model+input_fn"
    assert modes["diabetes_regression"] == "model" and modes["digits_cnn"] == "model"
    article = load_experiment(EXPERIMENTS / "article_cnn.yaml")
    assert article.program is not None and article.program[:2] == ["python", "article_cnn.py"]
    both = tmp_path / "both.yaml"
    both.write_text("name: both\nmodel: m:f\nscript: train.py\ndataset: {train: d}\n")
    with pytest.raises(UsageError, match=r"^.*both\.yaml: a script runs on its own: drop model and input"):
        load_experiment(both)
    bare = tmp_path / "bare.yaml"
    bare.write_text("name: bare\nmodel: m:f\ndataset: {train: d}\n")
    with pytest.raises(UsageError, match=r"bare\.yaml: a model run needs batch and steps$"):
        load_experiment(bare)


def test_every_example_passes_its_checks_and_says_what_runs() -> None:
    for path in EXPERIMENTS.glob("*.yaml"):
        check_experiment(load_experiment(path), EXPERIMENTS)
    article = load_experiment(EXPERIMENTS / "article_cnn.yaml").what_runs()
    assert article.startswith("script: python article_cnn.py plus --name=value for each of ['batch_size', 'epochs'")
    text = load_experiment(EXPERIMENTS / "text_classifier.yaml").what_runs()
    assert "fed by input function text_classifier:input_fn; 300 steps" in text


def test_a_model_may_come_back_compiled_when_its_code_or_code_it_imports_compiles(tmp_path: Path) -> None:
    """What decides whether a target may name the model's own metrics: a compile or load_model call in the entry
    point's module or a module of the experiments folder it imports; none anywhere is the built-in loop."""
    from tpuops.launch.usercode import may_compile

    (tmp_path / "plain.py").write_text("import tensorflow as tf\n"
                                       "def build(hparams):\n    return tf.keras.Sequential()\n")
    (tmp_path / "own.py").write_text("def build(hparams):\n    m = make()\n    m.compile(loss='mse')\n    return m\n")
    (tmp_path / "helpers.py").write_text("from tensorflow.keras.models import load_model\n"
                                         "def restore():\n    return load_model('x')\n")
    (tmp_path / "uses.py").write_text("from helpers import restore\ndef build(hparams):\n    return restore()\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "core.py").write_text("def finish(model):\n    model.compile('adam')\n")
    (tmp_path / "nested.py").write_text("import pkg.core\ndef build(hparams):\n    return pkg.core.finish(None)\n")
    assert not may_compile(tmp_path, "plain:build")
    assert may_compile(tmp_path, "own:build") and may_compile(tmp_path, "uses:build")
    (tmp_path / "pkg" / "models.py").write_text("from .core import finish\ndef build(hparams):\n    return finish(0)\n")
    (tmp_path / "pkg" / "bare.py").write_text("from . import helpers_absent\ndef build(hparams):\n    return 0\n")
    assert may_compile(tmp_path, "nested:build") and may_compile(tmp_path, "pkg.models:build")
    assert not may_compile(tmp_path, "pkg.bare:build")
    assert not may_compile(EXPERIMENTS, "models:digits_cnn") and may_compile(EXPERIMENTS, "regression:diabetes_mlp")
