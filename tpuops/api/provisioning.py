"""Nodes by hand: ``up`` (and its dry runs: the request, the provider's create body, the queued call) and
``down``, which stops a run still going on the node rather than deleting it under its controller.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from tpuops.api.callbacks import Say, _quiet
from tpuops.api.control import _stop
from tpuops.config import Settings
from tpuops.core.kinds import Capacity

if TYPE_CHECKING:
    from tpuops.fleet import DownResult, UpResult
    from tpuops.launch.provision import UpPlan
    from tpuops.providers.nodes import NodeInfo
    from tpuops.runs import Run


def up(settings: Settings, name: str, *, accelerator: str | None = None, capacity: Capacity | None = None,
       zone: str | None = None, runtime: str | None = None, wait: bool = True, queued: bool = False,
       valid_for_s: float | None = None, progress: Say = _quiet) -> UpResult:
    """``tpuops up NAME``: create (or adopt) a node and wait until it is READY."""
    from tpuops.launch.provision import plan_up
    from tpuops.session import fleet

    plan = plan_up(settings, name, accelerator=accelerator, capacity=capacity, zone=zone, runtime=runtime)
    nodes = fleet(settings, progress)
    return nodes.up_queued(plan, valid_for_s=valid_for_s, wait=wait) if queued else nodes.up(plan, wait=wait)


def plan_up(settings: Settings, name: str, *, accelerator: str | None = None, capacity: Capacity | None = None,
            zone: str | None = None, runtime: str | None = None) -> UpPlan:
    """``tpuops up NAME --dry-run``: the CreateNode request, the zones in order and the startup script; no call."""
    from tpuops.launch.provision import plan_up as plan

    return plan(settings, name, accelerator=accelerator, capacity=capacity, zone=zone, runtime=runtime)


def create_body(settings: Settings, plan: UpPlan) -> dict[str, Any]:
    """What the configured node provider's create would send for ``plan`` (a dry run shows it); no call.

    Cloud TPU's is the REST body of a CreateNode; each provider says its own (``create_body`` of its class)."""
    from tpuops.providers.registry import provider_class

    return provider_class(settings.node_provider).create_body(settings.project, plan.zones[0], plan.request)


def plan_up_queued(settings: Settings, name: str, *, accelerator: str | None = None,
                   capacity: Capacity | None = None, zone: str | None = None, runtime: str | None = None,
                   valid_for_s: float | None = None) -> dict[str, Any]:
    """``tpuops up NAME --queued --dry-run``: the CreateQueuedResource call (zone, id, REST body); no call.

    Refused (``UsageError``) as ``up --queued`` itself is when the configured provider has no queued resources.
    """
    from tpuops.providers.base import QueuesNodes, require_queues
    from tpuops.providers.registry import provider_class

    provider = cast(type[QueuesNodes], provider_class(settings.node_provider))
    require_queues(provider)
    plan = plan_up(settings, name, accelerator=accelerator, capacity=capacity, zone=zone, runtime=runtime)
    return {"zone": plan.zones[0], "queued_resource_id": name,
            "body": provider.queued_body(settings.project, plan.zones[0], plan.request, valid_until_s=valid_for_s)}


def down(settings: Settings, names: list[str] | None, *, wait: bool = True, progress: Say = _quiet,
         confirm_stop: Callable[[list[str]], bool] | None = None) -> list[DownResult]:
    """``tpuops down NAMES | --all``: delete nodes (``None``: every tpuops node in view).

    The node of a run still going is not simply deleted (its controller would make it again): its run is
    stopped as ``stop`` stops it, when ``confirm_stop`` (given those runs) says yes; otherwise ``UsageError``
    naming ``tpuops stop``, and nothing is deleted.
    """
    from tpuops import runs
    from tpuops.core.errors import UsageError
    from tpuops.core.naming import RUN_KEY, check_node_name
    from tpuops.fleet import Deleted, DownResult
    from tpuops.session import fleet, store

    for name in names or []:
        check_node_name(name)  # before the ledger or the API is touched
    nodes = fleet(settings, progress)
    root = store(settings)
    found = nodes.status() if names is None else [n for name in names for n in nodes.locate(name)]
    owned: dict[str, tuple[NodeInfo, Run]] = {}
    for node in found:
        run_id = node.labels.get(RUN_KEY)
        if node.managed and run_id is not None and runs.run_exists(root, run_id):
            run = runs.open_run(root, run_id)
            if not run.finished and run.record.node_name == node.name:
                owned[node.name] = (node, run)
    if not owned:
        return nodes.down(names, wait=wait)
    ids = sorted({run.run_id for _, run in owned.values()})
    if confirm_stop is None or not confirm_stop(ids):
        raise UsageError(f"{', '.join(sorted(owned))}: the node(s) of run(s) still going ({', '.join(ids)}), which "
                         f"their controller would make again; 'tpuops stop {' '.join(ids)}' stops them (each "
                         "checkpoints, then its node is deleted), as 'tpuops down --yes' does; nothing deleted")
    stopped = {s.run_id: s for s in _stop(settings, [run for _, run in owned.values()], "tpuops down of its node",
                                          wait=wait, progress=progress)}
    results = [DownResult(name, node.zone, Deleted.REQUESTED if stopped[run.run_id].outcome is None
                          else Deleted.STOPPED) for name, (node, run) in owned.items()]
    rest = [name for name in (names if names is not None else [n.name for n in found if n.managed])
            if name not in owned]
    return results + (nodes.down(rest, wait=wait) if rest else [])
