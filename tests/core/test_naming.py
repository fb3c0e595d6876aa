"""Node ids and labels are checked against GCP's rules before any API call."""

from __future__ import annotations

import pytest

from tpuops.core.errors import UsageError
from tpuops.core.naming import (
    CARRIED_KEYS,
    MAX_LABELS,
    check_label_key,
    check_label_value,
    check_labels,
    check_node_name,
    labels_for,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", ["a", "tpuops-run-1", "x" * 63, "a-b-c9", "n0"])
def test_valid_node_names(name: str) -> None:
    assert check_node_name(name) == name


@pytest.mark.parametrize("name", ["", "My_Node", "1node", "-node", "node-", "x" * 64, "node.name", "nöde",
                                  "node\n", "UPPER", "a b"])
def test_invalid_node_names(name: str) -> None:
    with pytest.raises(UsageError) as err:
        check_node_name(name)
    message = str(err.value)
    assert message.startswith(f"node name {name!r} is not allowed: use 1-63 lowercase letters")
    assert "\n" not in message


def test_node_name_message_matches_the_documented_line() -> None:
    with pytest.raises(UsageError) as err:
        check_node_name("My_Node")
    assert str(err.value) == (
        "node name 'My_Node' is not allowed: use 1-63 lowercase letters, digits and '-', "
        "starting with a letter and not ending with '-'"
    )


@pytest.mark.parametrize("key", ["a", "team", "cost_center", "k-1", "x" * 63])
def test_valid_label_keys(key: str) -> None:
    assert check_label_key(key) == key


@pytest.mark.parametrize("key", ["", "1team", "_team", "Team", "x" * 64, "ключ", "a.b", "a\nb"])
def test_invalid_label_keys(key: str) -> None:
    with pytest.raises(UsageError, match=r"^label key .* is not allowed") as err:
        check_label_key(key)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("value", ["", "ml", "0", "run_1-a", "x" * 63])
def test_valid_label_values(value: str) -> None:
    assert check_label_value(value, key="k") == value


@pytest.mark.parametrize("value", ["ML", "x" * 64, "a b", "a/b", "é", "$(x)"])
def test_invalid_label_values(value: str) -> None:
    with pytest.raises(UsageError, match=r"^label value .*\(key 'k'\) is not allowed"):
        check_label_value(value, key="k")


def test_at_most_64_labels() -> None:
    many = {f"k{i}": "v" for i in range(MAX_LABELS)}
    assert check_labels(many) == many
    with pytest.raises(UsageError, match="at most 64"):
        check_labels({**many, "one-more": "v"})


def test_labels_for_adds_managed_labels() -> None:
    assert labels_for() == {"managed-by": "tpuops"}
    assert labels_for(run_id="r-1", sweep_id="s-1", user={"team": "ml"}) == {
        "team": "ml",
        "managed-by": "tpuops",
        "tpuops-run": "r-1",
        "tpuops-sweep": "s-1",
    }


def test_a_runs_labels_leave_room_for_the_counts_its_nodes_carry() -> None:
    """A replacement carries ``tpuops-preemptions`` and ``tpuops-attempt`` on top (``CARRIED_KEYS``): labels that fill
    all 64 slots would have the cloud refuse the run's create, so the run is refused at declaration."""
    room = MAX_LABELS - 2 - len(CARRIED_KEYS)
    assert len(labels_for(run_id="r-1", user={f"k{i}": "v" for i in range(room)})) == MAX_LABELS - len(CARRIED_KEYS)
    with pytest.raises(UsageError, match=f"too many for a run: its nodes carry 4 of tpuops's.*give at most {room}"):
        labels_for(run_id="r-1", user={f"k{i}": "v" for i in range(room + 1)})
    assert len(labels_for(user={f"k{i}": "v" for i in range(MAX_LABELS - 1)})) == MAX_LABELS  # a bare node's


@pytest.mark.parametrize("key", ["managed-by", "tpuops-run", "tpuops-sweep", "tpuops-attempt", "tpuops-preemptions"])
def test_user_may_not_set_managed_labels(key: str) -> None:
    with pytest.raises(UsageError, match=f"label '{key}' is set by tpuops"):
        labels_for(run_id="r-1", user={key: "mine"})


def test_labels_for_checks_ids_and_user_labels() -> None:
    with pytest.raises(UsageError, match="RUN_1"):
        labels_for(run_id="RUN_1")
    with pytest.raises(UsageError, match="Team"):
        labels_for(user={"Team": "ml"})
    with pytest.raises(UsageError, match="too many"):
        labels_for(user={f"k{i}": "v" for i in range(MAX_LABELS)})
