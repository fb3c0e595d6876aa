"""The seam's vocabulary is no cloud's: Cloud TPU's wire format lives in its adapter, and only there.

``tpuops/providers/nodes.py`` (what the domain imports) holds no REST body, no v2 state and no import of the agent;
the Cloud TPU adapter turns a neutral request into its CreateNode body and maps every v2 state of the official
client (``google.cloud.tpu_v2``) onto the neutral ``NodeState`` (``tests/providers/test_tpu_adapter.py`` does the same
against the emulator).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tpuops
from tpuops.core.kinds import Capacity
from tpuops.core.naming import MetadataKey
from tpuops.providers.cloud_tpu.adapter import _node_info, node_body
from tpuops.providers.nodes import NodeRequest, NodeState

pytestmark = pytest.mark.unit

PACKAGE = Path(tpuops.__file__).parent
NODES = PACKAGE / "providers" / "nodes.py"
CLOUD_TPU = "tpuops.providers.cloud_tpu"
MAY_NAME_CLOUD_TPU = ("providers/cloud_tpu/", "providers/memory.py", "providers/simulated.py",
                      "providers/cloud_model.py", "emulator/")
"""Who may import Cloud TPU's package: itself, the in-process worlds that model Cloud TPU (by name), and the
emulator, which plays Cloud TPU. Everything else asks the configured provider (``registry.offers_of``)."""


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports, a name taken from a package counted as its submodule too."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found += [node.module or "", *(f"{node.module}.{alias.name}" for alias in node.names)]
    return found


def test_what_a_node_is_comes_from_the_provider_never_from_cloud_tpus_catalog() -> None:
    reaching = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                      if not str(path.relative_to(PACKAGE)).startswith(MAY_NAME_CLOUD_TPU)
                      and any(module.startswith(CLOUD_TPU) for module in _imports(path)))
    assert reaching == [], f"these reach past the seam into {CLOUD_TPU}: ask registry.offers_of instead"


@pytest.mark.parametrize("neutral", ["base.py", "offers.py", "registry.py", "nodes.py"])
def test_the_protocol_and_the_neutral_values_import_no_catalog(neutral: str) -> None:
    assert [m for m in _imports(PACKAGE / "providers" / neutral) if m.startswith(CLOUD_TPU)] == []


def test_the_neutral_vocabulary_imports_neither_the_agent_nor_an_adapter() -> None:
    imported = [node.module or "" for node in ast.walk(ast.parse(NODES.read_text(encoding="utf-8")))
                if isinstance(node, ast.ImportFrom)]
    assert [m for m in imported if m.startswith(("tpuops.agent", "tpuops.providers.cloud_tpu", "google"))] == []
    assert not hasattr(NodeRequest, "body")


def _v2_node(state: str, **fields: object) -> object:
    from google.cloud import tpu_v2

    return tpu_v2.Node(name="projects/p-1/locations/us-central1-b/nodes/n-1", accelerator_type="v3-8",
                       runtime_version="tpu-vm-tf-2.9.3", state=tpu_v2.Node.State[state], **fields)


EXPECTED = {
    "STATE_UNSPECIFIED": NodeState.UNSPECIFIED, "CREATING": NodeState.CREATING, "READY": NodeState.READY,
    "RESTARTING": NodeState.RESTARTING, "REIMAGING": NodeState.RESTARTING, "DELETING": NodeState.DELETING,
    "REPAIRING": NodeState.REPAIRING, "STOPPED": NodeState.STOPPED, "STOPPING": NodeState.STOPPING,
    "STARTING": NodeState.STARTING, "PREEMPTED": NodeState.PREEMPTED, "TERMINATED": NodeState.TERMINATED,
    "HIDING": NodeState.UNKNOWN, "HIDDEN": NodeState.UNKNOWN, "UNHIDING": NodeState.STARTING,
    "UNKNOWN": NodeState.UNKNOWN,
}
"""Every v2 state and the neutral one it means (a reimage restarts the VM, an unhide starts it)."""


@pytest.mark.parametrize(("v2", "neutral"), sorted(EXPECTED.items()))
def test_every_v2_state_of_the_official_client_maps_onto_a_neutral_one(v2: str, neutral: NodeState) -> None:
    assert _node_info(_v2_node(v2)).state is neutral


def test_the_table_names_every_state_the_official_client_has() -> None:
    from google.cloud import tpu_v2

    assert {state.name for state in tpu_v2.Node.State} == set(EXPECTED)  # a new v2 state is mapped on purpose


@pytest.mark.parametrize(("capacity", "scheduling"), [
    (Capacity.SPOT, {"spot": True}), (Capacity.PREEMPTIBLE, {"preemptible": True}), (Capacity.ON_DEMAND, {}),
])
def test_capacity_goes_to_scheduling_and_comes_back(capacity: Capacity, scheduling: dict[str, bool]) -> None:
    from google.cloud import tpu_v2

    request = NodeRequest(name="n-1", accelerator="v3-8", runtime="tpu-vm-tf-2.9.3", capacity=capacity,
                          metadata={MetadataKey.STARTUP_SCRIPT.value: "#!/bin/sh\n"})
    body = node_body(request)
    assert body["schedulingConfig"] == scheduling and body["acceleratorType"] == "v3-8"
    assert body["metadata"] == {"startup-script": "#!/bin/sh\n"}
    node = _v2_node("READY", scheduling_config=tpu_v2.SchedulingConfig(**scheduling))
    assert _node_info(node).capacity is capacity
