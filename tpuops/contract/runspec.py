"""The run spec: the one JSON document that tells the agent what to do.

The control plane writes it to ``<store>/runs/<run>/spec.json`` (immutable once written); the
agent is started as ``python -m tpuops.agent train|infer SPEC`` where SPEC is a local path or a
``gs://`` URI. Parsing is strict: an unknown key anywhere, a missing required key or a value of
the wrong type is a ``SpecError`` (exit class user-error), so that a typo never silently falls
back to a default.

Schema (version 1; "=" gives the default of an optional key)::

    {
      "version": 1,                      = 1; any other value is rejected
      "run_id": "digits-0001",           [A-Za-z0-9][A-Za-z0-9._-]*, names runs/<run_id>/
      "store_root": "gs://b/prefix",     the store root: gs://... on a VM, a local directory
                                         under the emulator; read and written with tf.io.gfile only
      "entry_point": "models:digits_cnn",  "module:function"; required for train (unless "script"
                                         is set) and for infer from a checkpoint ("Entry points")
      "input_fn": "inputs:tokens",       = null; "module:function" building the input pipeline
                                         instead of the built-in parser ("Input functions")
      "experiments_dir": "experiments",  = null; a LOCAL directory put first on sys.path so the
                                         entry point module imports (relative: to the working
                                         directory); null: the module must already be importable
      "hparams": {...},                  = {}; JSON object passed whole to the entry point; the
                                         agent itself reads "optimizer" (adam | sgd | momentum |
                                         rmsprop, = adam), "learning_rate" (= 0.001) and
                                         "momentum" (= 0.9, for momentum and rmsprop)
      "seed": 0,                         = 0; weights init and the data order
      "mixed_precision": false,          = false; true: Keras policy mixed_bfloat16 on a TPU
                                         (ignored with a warning on the CPU, which has no
                                         bfloat16 convolutions in TF 2.9)
      "deterministic": null,             = null (auto: on without a TPU, off on a TPU); true turns on
                                         tf.config.experimental.enable_op_determinism(): a resumed
                                         run is then bit-identical to an uninterrupted one; false
                                         gives that up (same data order, but not the same sums)
      "allow_cpu_fallback": false,       = false; without a TPU the agent refuses to run unless true
      "heartbeat_seconds": 10,           = 10; status.json is rewritten at least this often
      "script": {                        = null; script mode: `train` runs the user's own program
                                         instead of the built-in loop (see ``script``)
        "command": ["python", "train.py", "--epochs", "5"],  argv, run in experiments_dir
        "hparams_as_flags": false,       = false; true appends --name=value per hparam
        "checkpoint_every_steps": 1000,  = 1000; for the helper callback (TPUOPS_CHECKPOINT_EVERY_STEPS)
        "checkpoint_every_seconds": 600, = 600; likewise (TPUOPS_CHECKPOINT_EVERY_SECONDS)
        "keep_checkpoints": 3,           = 3; likewise (TPUOPS_KEEP_CHECKPOINTS)
        "total_steps": null              = null; shown as status.total_steps when known
      },
      "dataset": {
        "features": {                    name -> {"dtype": float32 | int64 | string | uint8,
                                         "shape": [ints] = [], "encoding": null | "raw" = null};
                                         fixed-length tf.train.Example features, see "Features"
          "image": {"dtype": "float32", "shape": [8, 8, 1]},
          "label": {"dtype": "int64"},
          "tokens": {"dtype": "int64", "shape": [-1]}   variable length: input_fn or script only
        },
        "label": "label",                = null; the feature that is the target (required to
                                         train); every other feature is model input: the model
                                         gets the tensor itself when there is one input feature,
                                         else a dict name -> tensor
        "train": ["gs://b/data/x/train-*.tfrecord"],  = []; TFRecord file patterns
        "eval": ["gs://b/data/x/test-*.tfrecord"],    = []; no eval when empty
        "shuffle_buffer": 10000,         = 10000; 0 or 1 disables shuffling
        "cache": false                   = false; keep the raw training records in host memory
      },
      "train": {                         required by `train`
        "per_replica_batch_size": 128,   examples a replica takes per forward pass (its micro-batch)
        "global_batch": null,            = null: per_replica_batch_size x replicas, no accumulation;
                                         else the examples of every optimizer step on any slice
                                         size (elastic runs): each step accumulates
                                         global_batch / (per_replica_batch_size x replicas)
                                         micro-batches, which must divide exactly ("Global batch")
        "steps": 5000,                   total optimizer steps of the run (across resumes)
        "steps_per_call": 50,            = 50; steps run inside one tf.function call
        "checkpoint_every_steps": 1000,  = 1000; 0: only by time, on preemption and at the end
        "checkpoint_every_seconds": 600, = 600; 0: never by time
        "checkpoint_loss_rate_per_hour": null,  = null; a rate: `every: auto`, the interval is
                                         re-chosen after each save (contract/interval.py)
        "keep_checkpoints": 3,           = 3; CheckpointManager max_to_keep
        "eval_every_steps": 0,           = 0; 0: evaluate once, at the end
        "eval_steps": null,              = null; null: the whole eval set, else at most N batches
        "metrics": ["accuracy", "loss"], = ["accuracy", "loss"]; subset of accuracy, loss,
                                         top5_accuracy (ignored for a compiled model)
        "loss": "sparse_categorical_crossentropy",  = that; or
                                         "sparse_categorical_crossentropy_from_logits" (ignored
                                         for a compiled model)
        "profile_at_step": null,         = null; a TensorFlow profile window from this step
        "profile_steps": 0               = 0; ... this many steps long (``profiles``)
      },
      "infer": {                         required by `infer`
        "input": ["gs://b/data/x/test-*.tfrecord"],   TFRecord patterns, same features
                                         (the label feature may be absent)
        "model": "gs://b/prefix/runs/digits-0001/model",  a SavedModel directory (has
                                         saved_model.pb) or a checkpoint directory (ckpt/)
        "output_prefix": null,           = null: <store>/runs/<run_id>/predictions
        "num_shards": 1,                 = 1
        "batch_size": 256,               = 256; global batch of the prediction loop
        "latency": false                 = false; true: one batch per call, each batch's results
                                         written as soon as they exist (small batches, someone
                                         waiting; off a TPU the input, up to 512 MB parsed, is
                                         read ahead before the first batch); false: ~4096
                                         examples per call (throughput)
      }
    }

Entry points: ``entry_point`` names a function ``build(hparams: dict) -> tf.keras.Model`` that
returns an unbuilt or built Keras model whose input matches the non-label features. The agent
calls it inside the distribution strategy's scope, after the mixed precision policy is set.
For sparse categorical losses the model outputs class probabilities (or logits with
``..._from_logits``) in float32; with mixed_bfloat16 give the last layer ``dtype="float32"``.
A model that draws random numbers in its forward pass (dropout) trains fine, but exact resume
is only guaranteed for models whose training step is a deterministic function of weights,
optimizer state and data.

Compiled models: when the entry point returns a model on which it called ``compile()``
(inside the strategy scope the agent calls it in), the agent trains with the model's own
``train_step``/``test_step``, so compile()'s loss, loss weights, metrics and optimizer and an
overridden ``train_step`` apply; hparams "optimizer"/"learning_rate" and train.loss/metrics
are then not used, and the metric names in status are the model's (``compiled``).

Input functions: ``input_fn`` names ``input_fn(file_patterns, batch_size, *, training, seed,
input_context) -> tf.data.Dataset`` yielding ``(inputs, labels)`` or ``(inputs, labels,
sample_weights)`` batches of exactly ``batch_size`` (the global batch) with static shapes;
the built-in parser and dataset.features/label are then not used to read data
(``userinput`` documents what the function must respect for exact resume).

Global batch: a run that may move between slice sizes (``accelerator: [v3-32, v3-8]``) fixes
``train.global_batch``, so every optimizer step sees the same examples whatever the slice: on 32
replicas with ``per_replica_batch_size`` 16 a global batch of 512 is one micro-batch, on 8 replicas
it is 4 accumulated micro-batches (``per_replica x replicas x accumulation = global``). The
accumulation is derived by the agent from the slice it runs on, never written here; a slice whose
``per_replica x replicas`` does not divide the global batch is a user error, and so is a resume
whose global batch differs from the one its checkpoint was trained with.

Features: without ``encoding`` a feature is a list of ``prod(shape)`` values of its dtype in
the Example (``float_list``, ``int64_list``, ``bytes_list``). ``"encoding": "raw"`` is what
``tpuops data convert --format images`` writes, e.g. ``{"dtype": "uint8", "shape": [32, 32, 3],
"encoding": "raw"}``: one ``bytes_list`` entry per record holding a C-order, little-endian array
of that dtype and shape, a quarter the size of float32 pixels and with no decoding cost. uint8
exists only raw (an Example has no uint8 list); string is never raw. The model gets uint8
features as float32 with the values unchanged (pixels 0..255: rescaling is the model's job),
because Keras layers and the TPU compute in floats. A raw record of another byte length is a
user error naming the feature.
"""

import dataclasses
import json
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, TypeVar

from tpuops.contract.exits import UserError

SPEC_VERSION = 1
FEATURE_DTYPES = ("float32", "int64", "string", "uint8")
ENCODINGS = ("raw",)
METRICS = ("accuracy", "loss", "top5_accuracy")
LOSSES = ("sparse_categorical_crossentropy", "sparse_categorical_crossentropy_from_logits")
OPTIMIZERS = ("adam", "sgd", "momentum", "rmsprop")

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ENTRY_POINT = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
VARLEN = -1  # a first shape dimension of -1: a variable-length feature
_MISSING = object()
_T = TypeVar("_T")


class SpecError(UserError):
    """The run spec is not valid JSON or does not match the schema above."""


def _fields(obj: Any, cls: type, where: str) -> Mapping[str, Any]:
    """Check that ``obj`` is a JSON object whose keys all name fields of ``cls``."""
    if not isinstance(obj, dict):
        raise SpecError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    known = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(obj) - known)
    if unknown:
        raise SpecError(f"{where}: unknown key(s) {unknown} (known: {sorted(known)})")
    return obj


def _get(obj: Mapping[str, Any], key: str, kind: Tuple[type, ...], where: str, default: Any = _MISSING) -> Any:
    """Read ``obj[key]`` checking its JSON type; ``default`` makes the key optional."""
    if key not in obj:
        if default is _MISSING:
            raise SpecError(f"{where}: missing required key {key!r}")
        return default
    value = obj[key]
    if value is None and default is None:
        return None
    # bool is an int in Python; a JSON true where a number belongs is still a mistake.
    if isinstance(value, bool) and bool not in kind:
        raise SpecError(f"{where}.{key}: expected {_names(kind)}, got a boolean")
    if not isinstance(value, kind):
        raise SpecError(f"{where}.{key}: expected {_names(kind)}, got {type(value).__name__}")
    return value


def _names(kind: Tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in kind)


def _positive(value: int, where: str, zero_ok: bool = False) -> int:
    if value < 0 or (value == 0 and not zero_ok):
        raise SpecError("{}: must be {} 0, got {}".format(where, ">=" if zero_ok else ">", value))
    return value


def _str_list(obj: Mapping[str, Any], key: str, where: str, default: Any = _MISSING) -> List[str]:
    values = _get(obj, key, (list,), where, default)
    if not all(isinstance(v, str) and v for v in values):
        raise SpecError(f"{where}.{key}: expected a list of non-empty strings")
    return list(values)


def _choice(value: str, choices: Tuple[str, ...], where: str) -> str:
    if value not in choices:
        raise SpecError(f"{where}: {value!r} is not one of {list(choices)}")
    return value


def _check_optimizer_hparams(hparams: Mapping[str, Any], where: str) -> None:
    """The hparams the agent itself reads (the optimizer's) must be valid; the rest is the model's."""
    _choice(_get(hparams, "optimizer", (str,), where, OPTIMIZERS[0]), OPTIMIZERS, where + ".optimizer")
    for key in ("learning_rate", "momentum"):
        if _get(hparams, key, (int, float), where, 0.0) < 0:
            raise SpecError(f"{where}.{key}: must be >= 0")


def _optional_section(obj: Mapping[str, Any], key: str, parse: Callable[[Any, str], _T]) -> Optional[_T]:
    return None if obj.get(key) is None else parse(obj[key], key)


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """One fixed-length feature of a tf.train.Example: a list of values, or one raw array."""

    dtype: str
    shape: Tuple[int, ...] = ()
    encoding: Optional[str] = None

    @classmethod
    def from_json(cls, obj: Any, where: str) -> "FeatureSpec":
        obj = _fields(obj, cls, where)
        dtype = _choice(_get(obj, "dtype", (str,), where), FEATURE_DTYPES, where + ".dtype")
        shape = _get(obj, "shape", (list,), where, [])
        if not all(
            isinstance(d, int) and not isinstance(d, bool) and (d > 0 or (i == 0 and d == VARLEN))
            for i, d in enumerate(shape)
        ):
            raise SpecError(f"{where}.shape: expected a list of positive integers (first may be -1: varlen)")
        encoding = _get(obj, "encoding", (str,), where, None)
        if encoding is not None:
            _choice(encoding, ENCODINGS, where + ".encoding")
        if dtype == "uint8" and encoding != "raw":
            raise SpecError(f'{where}.dtype: uint8 needs "encoding": "raw" (an Example holds no uint8 list)')
        if dtype == "string" and encoding == "raw":
            raise SpecError(f"{where}.encoding: raw needs a numeric dtype, not string")
        if encoding == "raw" and VARLEN in shape:
            raise SpecError(f"{where}.shape: a raw feature has a fixed shape")
        return cls(dtype=dtype, shape=tuple(shape), encoding=encoding)

    @property
    def variable_length(self) -> bool:
        return VARLEN in self.shape


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """Where the TFRecords are and what their examples hold."""

    features: Dict[str, FeatureSpec]
    label: Optional[str] = None
    train: List[str] = dataclasses.field(default_factory=list)
    eval: List[str] = dataclasses.field(default_factory=list)
    shuffle_buffer: int = 10000
    cache: bool = False

    @property
    def inputs(self) -> List[str]:
        """The model's input features, in a stable order."""
        return sorted(name for name in self.features if name != self.label)

    @classmethod
    def from_json(cls, obj: Any, where: str) -> "DatasetSpec":
        obj = _fields(obj, cls, where)
        raw = _get(obj, "features", (dict,), where)
        features = {name: FeatureSpec.from_json(f, f"{where}.features.{name}") for name, f in raw.items()}
        label = _get(obj, "label", (str,), where, None)
        if label is not None and label not in features:
            raise SpecError(f"{where}.label: {label!r} is not one of the features {sorted(features)}")
        if not [name for name in features if name != label]:
            raise SpecError(f"{where}.features: no input feature besides the label")
        return cls(
            features=features,
            label=label,
            train=_str_list(obj, "train", where, []),
            eval=_str_list(obj, "eval", where, []),
            shuffle_buffer=_positive(
                _get(obj, "shuffle_buffer", (int,), where, cls.shuffle_buffer), where + ".shuffle_buffer", zero_ok=True
            ),
            cache=_get(obj, "cache", (bool,), where, False),
        )


@dataclasses.dataclass(frozen=True)
class TrainSpec:
    """How long to train, in what batches, and how often to checkpoint and evaluate."""

    per_replica_batch_size: int
    steps: int
    global_batch: Optional[int] = None
    """Examples per optimizer step on every slice size; None: ``per_replica_batch_size`` x replicas ("Global batch")."""
    steps_per_call: int = 50
    checkpoint_every_steps: int = 1000
    checkpoint_every_seconds: float = 600.0
    checkpoint_loss_rate_per_hour: Optional[float] = None
    """Set by ``checkpoint: {every: auto}``: the interval follows the measured save cost (``contract/interval.py``)."""
    keep_checkpoints: int = 3
    eval_every_steps: int = 0
    eval_steps: Optional[int] = None
    metrics: Tuple[str, ...] = ("accuracy", "loss")
    loss: str = LOSSES[0]
    profile_at_step: Optional[int] = None
    """The experiment's profile window: from this step (``profiles``), ``profile_steps`` long; None: none."""
    profile_steps: int = 0

    @classmethod
    def from_json(cls, obj: Any, where: str) -> "TrainSpec":
        obj = _fields(obj, cls, where)

        def count(key: str, default: Any = _MISSING, zero_ok: bool = False) -> int:
            return _positive(_get(obj, key, (int,), where, default), f"{where}.{key}", zero_ok)

        eval_steps = _get(obj, "eval_steps", (int,), where, None)
        global_batch = _get(obj, "global_batch", (int,), where, None)
        metrics = _str_list(obj, "metrics", where, list(cls.metrics))
        for metric in metrics:
            _choice(metric, METRICS, where + ".metrics")
        seconds = _get(obj, "checkpoint_every_seconds", (int, float), where, cls.checkpoint_every_seconds)
        if seconds < 0:
            raise SpecError(f"{where}.checkpoint_every_seconds: must be >= 0")
        rate = _get(obj, "checkpoint_loss_rate_per_hour", (int, float), where, None)
        if rate is not None and not 0 < rate < float("inf"):
            raise SpecError(f"{where}.checkpoint_loss_rate_per_hour: must be a number > 0")
        profile_at = _get(obj, "profile_at_step", (int,), where, None)
        if profile_at is not None and profile_at < 0:
            raise SpecError(f"{where}.profile_at_step: must be >= 0")
        return cls(
            profile_at_step=profile_at,
            profile_steps=count("profile_steps", cls.profile_steps, zero_ok=True),
            per_replica_batch_size=count("per_replica_batch_size"),
            global_batch=None if global_batch is None else _positive(global_batch, where + ".global_batch"),
            checkpoint_loss_rate_per_hour=None if rate is None else float(rate),
            steps=count("steps"),
            steps_per_call=count("steps_per_call", cls.steps_per_call),
            checkpoint_every_steps=count("checkpoint_every_steps", cls.checkpoint_every_steps, zero_ok=True),
            checkpoint_every_seconds=float(seconds),
            keep_checkpoints=count("keep_checkpoints", cls.keep_checkpoints),
            eval_every_steps=count("eval_every_steps", cls.eval_every_steps, zero_ok=True),
            eval_steps=None if eval_steps is None else _positive(eval_steps, where + ".eval_steps"),
            metrics=tuple(metrics),
            loss=_choice(_get(obj, "loss", (str,), where, cls.loss), LOSSES, where + ".loss"),
        )


@dataclasses.dataclass(frozen=True)
class InferSpec:
    """Batch prediction: which model, over which records, written where."""

    input: List[str]
    model: str
    output_prefix: Optional[str] = None
    num_shards: int = 1
    batch_size: int = 256
    latency: bool = False

    @classmethod
    def from_json(cls, obj: Any, where: str) -> "InferSpec":
        obj = _fields(obj, cls, where)
        inputs = _str_list(obj, "input", where)
        if not inputs:
            raise SpecError(f"{where}.input: needs at least one file pattern")
        return cls(
            input=inputs,
            model=_get(obj, "model", (str,), where),
            output_prefix=_get(obj, "output_prefix", (str,), where, None),
            num_shards=_positive(_get(obj, "num_shards", (int,), where, 1), where + ".num_shards"),
            batch_size=_positive(_get(obj, "batch_size", (int,), where, 256), where + ".batch_size"),
            latency=_get(obj, "latency", (bool,), where, False),
        )


@dataclasses.dataclass(frozen=True)
class ScriptSpec:
    """Script mode: the user's own program, run unchanged with the tpuops environment."""

    command: List[str]
    hparams_as_flags: bool = False
    checkpoint_every_steps: int = 1000
    checkpoint_every_seconds: float = 600.0
    keep_checkpoints: int = 3
    total_steps: Optional[int] = None

    @classmethod
    def from_json(cls, obj: Any, where: str) -> "ScriptSpec":
        obj = _fields(obj, cls, where)
        command = _str_list(obj, "command", where)
        if not command:
            raise SpecError(f"{where}.command: needs at least the program to run")
        seconds = _get(obj, "checkpoint_every_seconds", (int, float), where, cls.checkpoint_every_seconds)
        if seconds < 0:
            raise SpecError(f"{where}.checkpoint_every_seconds: must be >= 0")
        total = _get(obj, "total_steps", (int,), where, None)
        return cls(
            command=command,
            hparams_as_flags=_get(obj, "hparams_as_flags", (bool,), where, False),
            checkpoint_every_steps=_positive(
                _get(obj, "checkpoint_every_steps", (int,), where, cls.checkpoint_every_steps),
                where + ".checkpoint_every_steps",
                zero_ok=True,
            ),
            checkpoint_every_seconds=float(seconds),
            keep_checkpoints=_positive(
                _get(obj, "keep_checkpoints", (int,), where, cls.keep_checkpoints), where + ".keep_checkpoints"
            ),
            total_steps=None if total is None else _positive(total, where + ".total_steps"),
        )


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """The whole run spec; see the module docstring for the JSON form."""

    run_id: str
    store_root: str
    dataset: DatasetSpec
    entry_point: Optional[str] = None
    input_fn: Optional[str] = None
    experiments_dir: Optional[str] = None
    hparams: Dict[str, Any] = dataclasses.field(default_factory=dict)
    seed: int = 0
    mixed_precision: bool = False
    deterministic: Optional[bool] = None
    allow_cpu_fallback: bool = False
    heartbeat_seconds: float = 10.0
    train: Optional[TrainSpec] = None
    infer: Optional[InferSpec] = None
    script: Optional[ScriptSpec] = None
    version: int = SPEC_VERSION

    @classmethod
    def from_json(cls, obj: Any, where: str = "spec") -> "RunSpec":
        obj = _fields(obj, cls, where)
        version = _get(obj, "version", (int,), where, SPEC_VERSION)
        if version != SPEC_VERSION:
            raise SpecError(f"{where}.version: this agent reads version {SPEC_VERSION}, got {version}")
        run_id = _get(obj, "run_id", (str,), where)
        if not _RUN_ID.match(run_id):
            raise SpecError(f"{where}.run_id: {run_id!r} must match {_RUN_ID.pattern}")
        entry_point = _get(obj, "entry_point", (str,), where, None)
        input_fn = _get(obj, "input_fn", (str,), where, None)
        for key, value in (("entry_point", entry_point), ("input_fn", input_fn)):
            if value is not None and not _ENTRY_POINT.match(value):
                raise SpecError(f"{where}.{key}: {value!r} is not 'module:function'")
        store_root = _get(obj, "store_root", (str,), where)
        if not store_root:
            raise SpecError(f"{where}.store_root: must not be empty")
        heartbeat = _get(obj, "heartbeat_seconds", (int, float), where, cls.heartbeat_seconds)
        if heartbeat <= 0:
            raise SpecError(f"{where}.heartbeat_seconds: must be > 0")
        hparams = _get(obj, "hparams", (dict,), where, {})
        _check_optimizer_hparams(hparams, where + ".hparams")
        return cls(
            run_id=run_id,
            store_root=store_root.rstrip("/"),
            dataset=DatasetSpec.from_json(_get(obj, "dataset", (dict,), where), "dataset"),
            entry_point=entry_point,
            input_fn=input_fn,
            experiments_dir=_get(obj, "experiments_dir", (str,), where, None),
            hparams=dict(hparams),
            seed=_get(obj, "seed", (int,), where, 0),
            mixed_precision=_get(obj, "mixed_precision", (bool,), where, False),
            deterministic=_get(obj, "deterministic", (bool,), where, None),
            allow_cpu_fallback=_get(obj, "allow_cpu_fallback", (bool,), where, False),
            heartbeat_seconds=float(heartbeat),
            train=_optional_section(obj, "train", TrainSpec.from_json),
            infer=_optional_section(obj, "infer", InferSpec.from_json),
            script=_optional_section(obj, "script", ScriptSpec.from_json),
        )

    def require_train(self) -> TrainSpec:
        """The train section, checked for what the built-in loop needs beyond the schema."""
        if self.train is None:
            raise SpecError("spec: `train` needs a 'train' section (or a 'script' section)")
        if not self.dataset.train:
            raise SpecError("dataset.train: `train` needs at least one file pattern")
        if self.entry_point is None:
            raise SpecError("spec.entry_point: `train` needs a model entry point")
        if self.input_fn is None:
            if self.dataset.label is None:
                raise SpecError("dataset.label: `train` needs a label feature (or an input_fn)")
            varlen = sorted(name for name, f in self.dataset.features.items() if f.variable_length)
            if varlen:
                raise SpecError(
                    f"dataset.features: {varlen} are variable-length: the built-in parser reads fixed-length "
                    "features only; name an input_fn that parses and pads them"
                )
        return self.train

    def require_infer(self) -> InferSpec:
        """The infer section."""
        if self.infer is None:
            raise SpecError("spec: `infer` needs an 'infer' section")
        return self.infer


def parse_spec(text: str) -> RunSpec:
    """Parse the JSON text of a run spec; raises SpecError with the path of the first problem."""
    try:
        obj = json.loads(text)
    except ValueError as err:
        raise SpecError(f"spec: not valid JSON: {err}") from err
    return RunSpec.from_json(obj)
