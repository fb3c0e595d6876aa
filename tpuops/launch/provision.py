"""Plan a node: validate everything a create needs and render its request, without calling anything.

``plan_up`` is what ``up`` (and ``--dry-run``) and every run's declaration use; the ``Fleet``
(``tpuops.fleet``, which defines ``UpPlan``, its input) makes the plan real. Invariant: a plan is
validated before any API call, and its node metadata uses the keys of ``MetadataKey`` only.
"""

from __future__ import annotations

from tpuops.config import Settings
from tpuops.core import naming
from tpuops.core.kinds import Capacity
from tpuops.core.naming import MetadataKey
from tpuops.fleet import UpPlan
from tpuops.providers import accelerators
from tpuops.providers.nodes import NodeRequest
from tpuops.providers.registry import provider_class


def plan_up(
    settings: Settings,
    name: str,
    *,
    accelerator: str | None = None,
    capacity: Capacity | None = None,
    zone: str | None = None,
    runtime: str | None = None,
    run_id: str | None = None,
    sweep_id: str | None = None,
    job: list[str] | None = None,
    extra_metadata: dict[str, str] | None = None,
    needs_agent_pins: bool = False,
) -> UpPlan:
    """Validate everything a create needs, without calling anything; ``needs_agent_pins``: the job needs
    packages beyond TF 2.9 (``StartupContext.needs_agent_pins``)."""
    from tpuops.launch.render import (  # jinja2: only a plan needs it (status does not)
        StartupContext,
        render_startup_script,
    )

    naming.check_node_name(name)
    acc = accelerators.parse_accelerator(accelerator or settings.accelerator)
    runtime_version = accelerators.resolve_runtime_version(acc, runtime)
    labels = naming.labels_for(run_id=run_id, sweep_id=sweep_id, user=settings.labels)
    rules = provider_class(settings.node_provider)
    zones = rules.zones_for(acc.type, [rules.check_zone(zone)] if zone else list(settings.zones))
    script = render_startup_script(StartupContext(
        node_name=name, project=settings.project, zone=zones[0], accelerator_type=acc.type,
        run_id=run_id, store_root=settings.store_root, job=job, labels=labels,
        needs_agent_pins=needs_agent_pins,
    ))
    metadata = {MetadataKey.STARTUP_SCRIPT.value: script}
    if settings.max_run_hours:
        metadata[MetadataKey.MAX_RUN_SECONDS.value] = str(int(settings.max_run_hours * 3600))
    if settings.wake_job:
        metadata[MetadataKey.WAKE_JOB.value] = settings.wake_job
    metadata.update(extra_metadata or {})
    request = NodeRequest(name=name, accelerator=acc.type, runtime=runtime_version,
                          capacity=capacity or settings.capacity, labels=labels, metadata=metadata,
                          service_account=settings.service_account)
    return UpPlan(request=request, zones=zones)
