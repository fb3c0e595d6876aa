"""The one input boundary for files: every document tpuops reads (experiment and sweep YAML, ``tpuops.toml``,
dataset manifests) is parsed here, under the same limits, before any model sees it.

Invariants of a document that gets through (each refusal is one ``UsageError`` line,
``WHERE:LINE:COLUMN: what is wrong (what would be right)`` where the position is known):

- at most ``MAX_BYTES`` bytes, read with one bounded read (a bigger file is not read further);
- UTF-8 text (a UTF-8 byte order mark is allowed); Latin-1, UTF-16 or binary are refused at the first bad byte;
- nested at most ``MAX_DEPTH`` levels of mappings and lists;
- a YAML document expands (every alias counted at its full size) to at most ``MAX_NODES`` nodes,
  so an anchor bomb is refused before anything is built from it;
- no key twice in one mapping (YAML and JSON; TOML forbids it itself);
- every number finite (no NaN, no infinity) and every integer within ``MAX_INT`` in magnitude;
- every string at most ``MAX_STRING`` characters, none with a NUL character (YAML's ``"\\0"`` escape);
- YAML uses the safe tags only (no Python objects);
- YAML keys ``on``, ``off``, ``yes``, ``no`` (any case) are strings, as the documents mean them (``notify: {on:
  [...]}``), and ``1e10``, ``1.0e10`` are numbers, as YAML 1.2 and JSON read them (``WORD_KEYS``, ``_EXPONENT``).

Models built on top (``Settings``, ``Experiment``, ``SweepSpec``, ``Manifest``) then check meaning; the user's
own documents share one strict base (``StrictModel``).
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from tpuops.core.errors import UsageError, excerpt

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib


class StrictModel(BaseModel):
    """The base of a user document's models (``Experiment``, ``SweepSpec``): an unknown key is refused (a typo
    must not pass silently), a parsed document is frozen, and no number may be NaN or infinite."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


MAX_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_NODES = 100_000
MAX_INT = 2**63 - 1
MAX_STRING = 10_000


def read_text(path: Path, what: str) -> str:
    """The file's text, refused as one line when it is missing, not a file, too big or not UTF-8."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, not a {what} file") from None
    except PermissionError:
        raise UsageError(f"{path}: not readable (permission denied)") from None
    except OSError as err:
        raise UsageError(f"{path}: cannot read the {what}: {err.strerror or err}") from None
    return decode(data, str(path))


def decode(data: bytes, where: str) -> str:
    """UTF-8 text of at most MAX_BYTES, or one line naming the first bad byte's line and column."""
    if len(data) > MAX_BYTES:
        raise UsageError(f"{where}: larger than {MAX_BYTES // 1024} KiB (a spec or config file is a few KiB)")
    if b"\x00" in data:
        line, column = _position(data[: data.index(b"\x00")].decode("utf-8", errors="replace"))
        raise UsageError(f"{where}:{line}:{column}: a NUL byte: a binary file (or UTF-16), not UTF-8 text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line, column = _position(data[: err.start].decode("utf-8", errors="replace"))
        raise UsageError(f"{where}:{line}:{column}: not UTF-8 text (byte 0x{data[err.start]:02x}); "
                         "save the file as UTF-8") from None


def _position(before: str) -> tuple[int, int]:
    lines = before.split("\n")
    return len(lines), len(lines[-1]) + 1


# ----- YAML --------------------------------------------------------------------------------------


def load_yaml(text: str, where: str) -> Any:
    """The one YAML document in ``text``, within the limits of this module."""
    import yaml

    try:
        loader = _limited_loader()(text)
    except yaml.reader.ReaderError as err:
        raise _unreadable(err, text, where) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node, where)
        value = loader.construct_document(node)
    except _Refused as err:
        raise UsageError(f"{where}:{err.line}:{err.column}: {err.what}") from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        at = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = " ".join(str(err.problem or err.context).split())
        problem = problem if len(problem) <= 120 else problem[:100] + "..."
        raise UsageError(f"{where}{at}: not valid YAML: {problem}") from None
    except yaml.reader.ReaderError as err:
        raise _unreadable(err, text, where) from None
    except yaml.YAMLError as err:
        raise UsageError(f"{where}: not valid YAML: {str(err).splitlines()[0]}") from None
    finally:
        loader.dispose()
    _check_values(value, where, "")
    return value


def _unreadable(err: Any, text: str, where: str) -> UsageError:
    """PyYAML's reader refuses control characters (checked as it reads, so before and while parsing)."""
    line, column = _position(text[: err.position])
    return UsageError(f"{where}:{line}:{column}: character {err.character:#x} is not allowed in YAML "
                      "(a control character: is this a binary file?)")


class _Refused(Exception):
    def __init__(self, mark: Any, what: str) -> None:
        super().__init__(what)
        self.line, self.column, self.what = mark.line + 1, mark.column + 1, what


def _limited_loader() -> type:
    """A SafeLoader that counts depth while composing and refuses duplicate keys and non-finite numbers."""
    import yaml

    class Limited(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.MappingStartEvent, yaml.SequenceStartEvent):
                self.depth += 1
                if self.depth > MAX_DEPTH:
                    raise _Refused(self.peek_event().start_mark, f"nested deeper than {MAX_DEPTH} levels")
                try:
                    return super().compose_node(parent, index)
                finally:
                    self.depth -= 1
            return super().compose_node(parent, index)

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _value in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    if key_node.value in seen:
                        raise _Refused(key_node.start_mark, f"key {key_node.value!r} appears twice in one "
                                       "mapping (keep one)")
                    seen.add(key_node.value)
                    if key_node.tag == _BOOL and key_node.value.lower() in WORD_KEYS:
                        key_node.tag = _STR  # `on:` is the key "on" (notify's), not True
            return super().construct_mapping(node, deep=deep)

        def construct_yaml_float(self, node: Any) -> float:
            value = super().construct_yaml_float(node)
            if not math.isfinite(value):
                raise _Refused(node.start_mark, f"{node.value!r} is not a finite number (write a number such as 1.5)")
            return value

        def construct_yaml_int(self, node: Any) -> int:
            digits = node.value.lstrip("+-").replace("_", "")
            if len(digits) > 20:
                raise _Refused(node.start_mark, f"integer of {len(digits)} digits: at most {MAX_INT} is allowed")
            value = super().construct_yaml_int(node)
            if abs(value) > MAX_INT:
                raise _Refused(node.start_mark, f"{value} is out of range: at most {MAX_INT} is allowed")
            return value

    Limited.add_constructor("tag:yaml.org,2002:float", Limited.construct_yaml_float)
    Limited.add_constructor("tag:yaml.org,2002:int", Limited.construct_yaml_int)
    Limited.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT, list("-+0123456789."))
    return Limited


_BOOL, _STR = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:str"

WORD_KEYS = frozenset({"on", "off", "yes", "no", "y", "n"})
"""Keys that YAML 1.1 would read as booleans (``on``, ``yes``...; ``y`` and ``n`` PyYAML already keeps as
strings) and a document means as words: as keys they stay strings, in any case. As values they stay booleans
(``keep: yes`` is true), as YAML 1.1 and every PyYAML user expect; ``true``/``false`` stay booleans everywhere."""

_EXPONENT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")
"""A number with an exponent as YAML 1.2 and JSON write it (``1e10``, ``1.0e10``, ``2E-3``): PyYAML's YAML 1.1
resolver needs a dot and a signed exponent (``1.0e+10``) and reads the others as strings."""


def _check_expansion(root: Any, where: str) -> None:
    """Refuse a document whose aliases expand it past MAX_NODES values or MAX_DEPTH levels.

    Sizes and heights are memoised per node, so a bomb is measured without being expanded; the
    depth bound also ends a recursive alias (a node that contains itself has no height).
    """
    import yaml

    measured: dict[int, tuple[int, int]] = {}

    def measure(node: Any, depth: int) -> tuple[int, int]:
        if depth > MAX_DEPTH:
            raise _Refused(node.start_mark, f"aliases nest this document deeper than {MAX_DEPTH} levels "
                           "(or an alias refers to a node that contains it)")
        known = measured.get(id(node))
        if known is not None:
            if depth + known[1] > MAX_DEPTH:
                raise _Refused(node.start_mark, f"aliases nest this document deeper than {MAX_DEPTH} levels")
            return known
        children: list[Any] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        parts = [measure(child, depth + 1) for child in children]
        size, height = 1 + sum(p[0] for p in parts), 1 + max((p[1] for p in parts), default=0)
        if size > MAX_NODES:
            raise _Refused(node.start_mark, f"aliases expand this document past {MAX_NODES} values "
                           "(an anchor bomb?); write the values out, or use fewer aliases")
        measured[id(node)] = (size, height)
        return size, height

    measure(root, 0)


def read_yaml_mapping(path: Path, what: str, keys: str) -> dict[str, Any]:
    """A YAML file that must hold a mapping (``keys`` lists a few, for the message)."""
    raw = load_yaml(read_text(path, what), str(path))
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: expected a mapping of keys ({keys}, ...)")
    return raw


# ----- TOML --------------------------------------------------------------------------------------


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """A TOML file as a mapping, within the limits of this module."""
    text = read_text(path, what)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"{path}: not valid TOML: {err}") from None
    except RecursionError:
        raise UsageError(f"{path}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as err:  # an integer of more digits than Python converts
        raise UsageError(f"{path}: not valid TOML: {err}") from None
    _check_values(data, str(path), "")
    return data


# ----- JSON --------------------------------------------------------------------------------------


def parse_json(data: bytes, where: str) -> Any:
    """A JSON document, within the limits of this module (strict: NaN and Infinity are not JSON)."""
    text = decode(data, where)

    def refuse_constant(constant: str) -> Any:
        raise ValueError(f"{constant} is not a JSON number")

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for key, value in pairs:
            if key in found:
                raise ValueError(f"key {key!r} appears twice in one object")
            found[key] = value
        return found

    try:
        value = json.loads(text, parse_constant=refuse_constant, object_pairs_hook=no_duplicates,
                           parse_int=_bounded_int)
    except json.JSONDecodeError as err:
        raise UsageError(f"{where}:{err.lineno}:{err.colno}: not valid JSON: {err.msg}") from None
    except ValueError as err:
        raise UsageError(f"{where}: not valid JSON: {err}") from None
    except RecursionError:
        raise UsageError(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    _check_values(value, where, "")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 20 or abs(int(text)) > MAX_INT:
        raise ValueError(f"integer {text[:24]}{'...' if len(text) > 24 else ''} is out of range (at most {MAX_INT})")
    return int(text)


def _check_values(value: Any, where: str, key: str, depth: int = 0) -> None:
    """Depth, finiteness and integer range of parsed values (for formats that parse before we can look)."""
    if depth > MAX_DEPTH:
        raise UsageError(f"{where}: {key or 'the document'} is nested deeper than {MAX_DEPTH} levels")
    children: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        names = {k: str(k) if str(k).isprintable() and len(str(k)) <= 60 else excerpt(k) for k in value}
        children = [(f"{key}.{names[k]}" if key else names[k], v) for k, v in value.items()]
    elif isinstance(value, list):
        children = [(f"{key}[{i}]", v) for i, v in enumerate(value)]
    elif isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"{where}: {key} = {value} is not a finite number (write a number such as 1.5)")
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        raise UsageError(f"{where}: {key} is out of range (an integer of at most {MAX_INT})")
    elif isinstance(value, str) and len(value) > MAX_STRING:
        raise UsageError(f"{where}: {key or 'a value'} is {len(value)} characters long (at most {MAX_STRING})")
    elif isinstance(value, str) and "\x00" in value:
        raise UsageError(f"{where}: {key or 'a value'} contains a NUL character (\\0): no name or path can")
    for child_key, child in children:
        _check_values(child, where, child_key, depth + 1)

