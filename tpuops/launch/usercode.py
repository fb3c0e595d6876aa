"""Check before launch that the user code an experiment names exists in its bundle, without importing it.

The control plane cannot import the user's modules (they import TensorFlow 2.9, which does
not run here), so it reads them with ``ast``: the module file must be in the experiments
directory (what the bundle ships), the function must be defined at its top level, and an
input function must accept ``(file_patterns, batch_size, *, training, seed, input_context)``.
A script's ``.py`` file must be in the experiments directory too. Every failure is one
``UsageError`` line, raised before anything is uploaded or created.

What ``ast`` cannot see is left to the agent, which checks again at run time: a function
made by assignment or decorator, a module that only exists in the VM's site-packages.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tpuops.core.errors import UsageError
from tpuops.launch.experiment import Experiment

INPUT_FN_KEYWORDS = ("training", "seed", "input_context")
_PYTHONS = ("python", "python3")


def _module_file(experiments_dir: Path, module: str) -> Path | None:
    base = experiments_dir.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _parse(source: Path, where: str) -> ast.Module:
    """The module's syntax tree; one ``UsageError`` line (with the line when known) for anything else.

    Parsed from bytes, as Python reads a module: UTF-8 unless a PEP 263 coding line says otherwise.
    """
    try:
        data = source.read_bytes()
    except OSError as err:
        raise UsageError(f"{where}: cannot read {source}: {err.strerror or err}") from None
    if b"\x00" in data:
        line = data[: data.index(b"\x00")].count(b"\n") + 1
        raise UsageError(f"{where}: {source} is not Python source: a NUL byte (line {line})")
    try:
        return ast.parse(data, filename=str(source))
    except (SyntaxError, ValueError) as err:
        message, line = (err.msg, err.lineno) if isinstance(err, SyntaxError) else (str(err), None)
        at = f" (line {line})" if line else ""
        raise UsageError(f"{where}: {source} does not parse: {message}{at}") from None


def find_function(experiments_dir: Path, name: str, what: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The top-level definition of ``name`` ("module:function"); None when it is bound another way.

    Raises:
        UsageError: the module is not in ``experiments_dir``, does not parse, or never binds the name.
    """
    module, function = name.split(":")
    source = _module_file(experiments_dir, module)
    if source is None:
        raise UsageError(f"{what} {name}: no module {module!r} in {experiments_dir} (the bundle ships that folder)")
    tree = _parse(source, f"{what} {name}")
    bound = False
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == function:
            return node
        targets = node.targets if isinstance(node, ast.Assign) else []
        names = {t.id for t in targets if isinstance(t, ast.Name)}
        if isinstance(node, ast.ClassDef | ast.ImportFrom | ast.Import):
            names |= {node.name} if isinstance(node, ast.ClassDef) else {a.asname or a.name for a in node.names}
        bound = bound or function in names
    if not bound:
        raise UsageError(f"{what} {name}: {source.name} defines no function {function!r}")
    return None


_COMPILING = frozenset({"compile", "load_model"})
"""Calls that can hand back a compiled Keras model (``model.compile(...)``, ``tf.keras.models.load_model``)."""


def may_compile(experiments_dir: Path, name: str) -> bool:
    """Whether the model entry point ``name`` ("module:function") may come back compiled, which makes its metric
    names its own: its module, or a module of the experiments folder it imports (transitively), calls
    ``compile`` or ``load_model``. Read with ``ast``, erring towards True: a module that does not parse, or a
    call not seen here (code outside the folder), is no reason to refuse a run.
    """
    pending, seen = [name.split(":")[0]], set()
    while pending:
        module = pending.pop()
        source = _module_file(experiments_dir, module)
        if module in seen or source is None:
            continue
        seen.add(module)
        try:
            tree = ast.parse(source.read_bytes(), filename=str(source))
        except (OSError, SyntaxError, ValueError):
            return True
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if called in _COMPILING:
                    return True
            elif isinstance(node, ast.Import):
                pending.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _imported_from(module, source, node)
                pending.extend([base, *(f"{base}.{alias.name}" for alias in node.names)] if base else [])
    return False


def _imported_from(module: str, source: Path, node: ast.ImportFrom) -> str:
    """The module a ``from X import ...`` in ``module`` (read from ``source``) names, relative ones resolved."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if source.name == "__init__.py" else module.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, *([node.module] if node.module else [])])


def check_input_fn(experiments_dir: Path, name: str) -> None:
    """``name`` must be callable as ``fn(file_patterns, batch_size, training=, seed=, input_context=)``."""
    node = find_function(experiments_dir, name, "input")
    if node is None:
        return
    args = node.args
    positional = [a.arg for a in args.posonlyargs + args.args]
    keywords = set(positional[2:]) | {a.arg for a in args.kwonlyargs}
    missing = [k for k in INPUT_FN_KEYWORDS if k not in keywords] if args.kwarg is None else []
    if (len(positional) < 2 and args.vararg is None) or missing:
        signature = ", ".join(positional + [a.arg for a in args.kwonlyargs])
        raise UsageError(f"input {name}: has the signature ({signature}); expected "
                         "input_fn(file_patterns, batch_size, *, training, seed, input_context)")


def check_program(experiments_dir: Path, argv: list[str]) -> None:
    """A script run as ``python X.py`` (or ``./X``) must be a file in the experiments directory."""
    program = argv[1] if argv[0] in _PYTHONS and len(argv) > 1 else argv[0]
    if argv[0] in _PYTHONS and len(argv) > 1 and program.startswith("-"):
        return  # python -m module / -c code: nothing to look for
    looks_like_file = program.endswith(".py") or "/" in program
    if looks_like_file and not (experiments_dir / program).is_file():
        raise UsageError(f"command: {program} is not in {experiments_dir} (the bundle ships that folder; "
                         "the command runs there)")


def check_experiment(experiment: Experiment, experiments_dir: Path) -> None:
    """Every piece of user code the experiment names, by mode (see ``tpuops.launch.experiment``)."""
    program = experiment.program
    if program is not None:
        check_program(experiments_dir, program)
        return
    assert experiment.model is not None
    find_function(experiments_dir, experiment.model, "model")
    if experiment.input:
        check_input_fn(experiments_dir, experiment.input)
