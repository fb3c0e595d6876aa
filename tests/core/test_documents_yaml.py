"""YAML as the documents mean it (``tpuops.core.documents``): word keys stay words, numbers with an exponent are
numbers, and values keep YAML 1.1's booleans (issue 38, defect 5)."""

from __future__ import annotations

import pytest

from tpuops.core.documents import WORD_KEYS, load_yaml
from tpuops.core.errors import UsageError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("word", sorted(WORD_KEYS | {w.upper() for w in WORD_KEYS} | {w.title() for w in WORD_KEYS}))
def test_a_word_key_stays_a_string_in_any_case(word: str) -> None:
    assert load_yaml(f"{word}: [failed]\n", "x.yaml") == {word: ["failed"]}


def test_notify_on_loads_as_documented_and_true_false_keys_stay_booleans() -> None:
    assert load_yaml("notify: {to: [team], on: [failed, budget]}", "x.yaml") == {
        "notify": {"to": ["team"], "on": ["failed", "budget"]}}
    assert load_yaml("true: 1\n", "x.yaml") == {True: 1}  # only the words above are keys as words


def test_word_values_stay_booleans_as_yaml_1_1_reads_them() -> None:
    assert load_yaml("keep: [yes, no, on, off, Yes, OFF]\n", "x.yaml") == {"keep": [True, False, True, False,
                                                                                    True, False]}


def test_a_quoted_and_a_plain_word_key_are_one_key_twice() -> None:
    with pytest.raises(UsageError, match="key 'on' appears twice"):
        load_yaml('on: 1\n"on": 2\n', "x.yaml")


@pytest.mark.parametrize(("text", "number"), [
    ("1.0e10", 1.0e10), ("1e10", 1e10), ("2E-3", 2e-3), ("-1.5e+3", -1.5e3), (".5e2", 50.0), ("1.0e+10", 1e10),
    ("1.5", 1.5), ("12", 12), ("1_000", 1000),
])
def test_numbers_with_an_exponent_are_numbers(text: str, number: float) -> None:
    value = load_yaml(f"v: {text}\n", "x.yaml")["v"]
    assert value == number and type(value) is type(number)


@pytest.mark.parametrize("text", ["1e", "e10", "1e10x", "'1e10'", "1.2.3e4"])
def test_what_is_not_a_number_stays_a_string(text: str) -> None:
    assert isinstance(load_yaml(f"v: {text}\n", "x.yaml")["v"], str)


def test_an_exponent_past_a_float_is_refused_as_not_finite() -> None:
    with pytest.raises(UsageError, match="not a finite number"):
        load_yaml("v: 1e999\n", "x.yaml")
