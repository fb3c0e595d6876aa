"""Import the user's model entry point and build the model, blaming the user for what fails.

Everything that goes wrong between "import the module" and "the model accepts a batch of the
declared features" is a user error (never retried): the module does not import, the function
is missing, it raises, it returns something that is not a Keras model, or the model rejects
the inputs. The forward pass is traced, not run, so it costs no device time.
"""

import contextlib
import importlib
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import tensorflow as tf

from tpuops.contract.exits import UserError, cause_line
from tpuops.contract.runspec import RunSpec

log = logging.getLogger(__name__)

BuildFn = Callable[[Dict[str, Any]], Any]


def load_function(spec: RunSpec, name: str, what: str) -> Callable[..., Any]:
    """Import ``name`` ("module:function") from the experiments dir (or sys.path); ``what`` names it in errors."""
    if spec.experiments_dir:
        directory = os.path.abspath(spec.experiments_dir)
        if not os.path.isdir(directory):
            raise UserError(f"experiments_dir {directory!r} is not a directory")
        if directory not in sys.path:
            sys.path.insert(0, directory)
    module_name, function_name = name.split(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # whatever the user's module raises on import
        raise UserError(f"{what} {name}: cannot import {module_name!r}: {err}") from err
    function = getattr(module, function_name, None)
    if not callable(function):
        raise UserError(f"{what} {name}: {module_name!r} has no function {function_name!r}")
    return function


def load_entry_point(spec: RunSpec) -> BuildFn:
    """The model entry point ``build(hparams) -> tf.keras.Model``."""
    if spec.entry_point is None:
        raise UserError("spec.entry_point is not set")
    return load_function(spec, spec.entry_point, "entry point")


def user_roots(spec: RunSpec) -> List[Path]:
    """Where the user's code lives: tracebacks through these files are the user's errors."""
    roots = [Path(spec.experiments_dir)] if spec.experiments_dir else []
    for name in (spec.entry_point, spec.input_fn):
        module = sys.modules.get(name.split(":")[0]) if name else None
        module_file = getattr(module, "__file__", None)
        if module_file:
            roots.append(Path(module_file).parent)
    return roots


def is_compiled(model: tf.keras.Model) -> bool:
    """True when the user called ``compile()``: the agent then drives the model's own train_step."""
    return getattr(model, "optimizer", None) is not None


def build_model(build: BuildFn, spec: RunSpec, input_signature: Any, strategy: Any) -> tf.keras.Model:
    """Call the entry point and trace one replica's forward pass over ``input_signature``.

    Call it inside ``strategy.scope()`` so the variables are created where training needs them.
    """
    try:
        model = build(dict(spec.hparams))
    except Exception as err:
        raise UserError(f"entry point {spec.entry_point} raised while building the model: {cause_line(err)}") from err
    if not isinstance(model, tf.keras.Model):
        raise UserError(f"entry point {spec.entry_point} returned {type(model).__name__}, not a tf.keras.Model")
    check_accepts(model, input_signature, strategy, f"the model from {spec.entry_point}")
    log.info("model %s: %d parameters", model.name, model.count_params())
    return model


def check_accepts(model: tf.keras.Model, input_signature: Any, strategy: Any, what: str) -> None:
    """Trace one replica's forward pass of ``model`` over ``input_signature``; a model that rejects it is a UserError.

    ``what`` names the model in the message (an entry point, a SavedModel).
    """
    try:
        forward = tf.function(lambda inputs: strategy.run(model, args=(inputs,), kwargs={"training": False}))
        forward.get_concrete_function(input_signature)
    except Exception as err:
        raise UserError(f"{what} does not accept the features {input_signature}: {cause_line(err)}") from err


@contextlib.contextmanager
def blame_user(what: str) -> Iterator[None]:
    """Turn a ``ValueError``/``TypeError`` raised inside into a ``UserError`` saying ``what`` failed and why.

    Only around code whose such errors are the model's or the data's (module docstring): tracing a
    function over the model. The cause is one line (``exits.cause_line``), not TF's "in user code:".
    """
    try:
        yield
    except (ValueError, TypeError) as err:
        raise UserError(f"{what}: {cause_line(err)}") from err
