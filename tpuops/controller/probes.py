"""An elastic run's probes: how the controller learns that a larger size has capacity again.

``decide`` asks for a probe (``ActionKind.PROBE``) while the run is READY on a smaller size, every
``probe_every_s``; this module carries it out and reads where it stands. A probe is a create of a bare node of
the larger size: the run's frozen request of that size without its startup script (so no job boots) under
``probe_node_name``, labelled as a run of that name, which the store does not know, and with ``PROBE_KEY`` naming
the run it probes for: a node of that name without that label (a user's run may be called ``x-up`` too) is
never judged, taken or deleted as a probe. Cloud TPU answers a
stocked-out zone within seconds (the request or its operation fails RESOURCE_EXHAUSTED), which costs nothing; a
probe that gets capacity is deleted at once (``ActionKind.UNPROBE``), billed for the minute or two it lived, and
the run moves up through a checkpoint. One a controller dying mid-pass left behind is an orphan to the orphan
reaper (``orphan_grace_s``).

Imports: ``tpuops.core``, ``tpuops.fleet``, ``tpuops.providers`` (values), ``tpuops.runs`` and
``tpuops.controller.decide`` (its actions).
"""

from __future__ import annotations

from typing import Any

from tpuops.controller.decide import Action, ActionKind
from tpuops.core.create_result import CreateResult
from tpuops.core.errors import NotFound, TpuopsError
from tpuops.core.naming import PROBE_KEY, RUN_KEY, MetadataKey
from tpuops.fleet import Fleet, Listing
from tpuops.providers.nodes import NodeState
from tpuops.runs import Memory, RunRecord

PROBE_SUFFIX = "-up"


def probe_node_name(name: str) -> str:
    """The name of the probe node of the run whose node is ``name``: ``name-up``, cut to fit 63 characters."""
    return name[:63 - len(PROBE_SUFFIX)].rstrip("-") + PROBE_SUFFIX


def probe_observed(nodes: Fleet, record: RunRecord, memory: Memory, listed: Listing) -> dict[str, Any]:
    """Where the run's probe stands, as ``decide.Observed``'s ``probe_*`` fields (none without a probe)."""
    probe = memory.probe
    if probe is None:
        return {}
    if probe.error is not None:
        return {"probe_result": probe.error, "probe_message": probe.message}
    found = listed.get(probe.zone, {}).get(probe_node_name(record.node_name))
    if found is not None and found.labels.get(PROBE_KEY) != record.node_name:
        found = None  # another run's node of that name: no evidence about the probe
    result, message = None, ""
    if probe.operation:
        try:
            operation = nodes.operation(probe.zone, probe.operation)
            result, message = operation.result, operation.message
        except NotFound:  # the provider forgot the operation: the listing says whether a node was made
            result = CreateResult.OK if found is not None else CreateResult.RETRY
        except TpuopsError:
            result = CreateResult.RUNNING
    return {"probe_result": result, "probe_message": message,
            "probe_ready": found is not None and found.state is NodeState.READY}


def apply_probe(nodes: Fleet, record: RunRecord, memory: Memory, action: Action, now: float) -> None:
    """Create the run's probe node (``PROBE``) or delete it (``UNPROBE``); a failure goes into the memory."""
    name = probe_node_name(record.node_name)
    if action.kind is ActionKind.UNPROBE:
        try:
            found = nodes.find(action.zone, name)
            if found is not None and found.labels.get(PROBE_KEY) == record.node_name:
                nodes.delete(action.zone, name)
        except NotFound:
            pass
        except TpuopsError as err:  # the orphan reaper deletes it later
            memory.event(now, "probe", f"could not delete the probe node {name}: {err}")
        return
    size = record.sizes[min(memory.probe_size, len(record.sizes) - 1)]
    labels = {**size.labels, RUN_KEY: name, PROBE_KEY: record.node_name}
    metadata = {k: v for k, v in size.metadata.items() if k != MetadataKey.STARTUP_SCRIPT.value}
    request = size.model_copy(update={"name": name, "labels": labels, "metadata": metadata,
                                      "capacity": memory.capacity or size.capacity})
    try:
        operation = nodes.create(action.zone, request)
    except TpuopsError as err:
        if memory.probe is not None:
            memory.probe.error, memory.probe.message = CreateResult.of(err), str(err)
        return
    if memory.probe is not None:
        memory.probe.operation = operation.name
