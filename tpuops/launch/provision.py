"""The one node-request builder: what a node is asked for, resolved once, rendered in one place.

A node request is made of two parts. ``NodeBasis`` is what every node of one plan shares: the
accelerator, runtime, capacity and zones, resolved here and nowhere else (a flag, else the
experiment, else ``tpuops.toml``; the accelerator's shape and runtime are the configured provider's answer,
``ProviderClass.offers``, never a cloud's catalog), the user's labels, the limits put into metadata, the service
account, and the project and store root its startup script is rendered with. ``NodeBasis.node``
adds what carries a node's name (the node and run labels, the startup script) and returns an
``UpPlan``, which the ``Fleet`` (``tpuops.fleet``) makes real.

A basis comes from the config of the moment (``NodeBasis.of_settings``: ``up``, every run's
declaration) or from a request frozen earlier (``NodeBasis.of_frozen``: a sweep's later trials
are built from trial 0's frozen node, so editing ``tpuops.toml`` mid-sweep changes none of them).
Either way the request is built forward from typed values; a rendered script is never read back.

Invariant: a plan is validated before any API call, and its node metadata uses the keys of
``MetadataKey`` only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tpuops.config import Settings
from tpuops.core import naming
from tpuops.core.errors import UsageError
from tpuops.core.kinds import Capacity
from tpuops.core.naming import MetadataKey
from tpuops.launch.bundle import job_argv
from tpuops.providers.nodes import NodeRequest
from tpuops.providers.offers import check_sizes
from tpuops.providers.registry import provider_class
from tpuops.runs.models import NodeSpec, RunKind

if TYPE_CHECKING:
    from tpuops.launch.experiment import Experiment


@dataclass(frozen=True)
class UpPlan:
    """A validated node request, the zones to try in order, and its startup script."""

    request: NodeRequest
    zones: list[str]

    @property
    def startup_script(self) -> str:
        return self.request.metadata[MetadataKey.STARTUP_SCRIPT.value]

    def frozen(self) -> NodeSpec:
        """The request as a run's record freezes it (with its zones): every recreate makes exactly this."""
        return NodeSpec.of(self.request, self.zones)


@dataclass(frozen=True)
class NodeBasis:
    """What every node of one plan shares (see the module docstring); ``node`` builds one of them."""

    project: str
    store_root: str
    """The store root as the config named it, rendered into the startup script."""
    accelerator: str
    runtime: str
    capacity: Capacity
    zones: tuple[str, ...]
    labels: Mapping[str, str]
    """The node's labels but the run's: the user's, ``managed-by`` and the sweep's."""
    metadata: Mapping[str, str] = field(default_factory=dict)
    """The node's metadata but the startup script: the limits the config gave, ``keep``."""
    service_account: str | None = None

    @classmethod
    def of_settings(cls, settings: Settings, *, accelerator: str | None = None, capacity: Capacity | None = None,
                    experiment: Experiment | None = None, zone: str | None = None, runtime: str | None = None,
                    sweep_id: str | None = None, extra_metadata: Mapping[str, str] | None = None) -> NodeBasis:
        """The basis the config of the moment gives: the one place where accelerator and capacity are defaulted.

        Each is the flag (``accelerator``, ``capacity``) if given, else the experiment's, else tpuops.toml's.

        Raises:
            UsageError: an accelerator, runtime, zone or label that cannot be asked for.
        """
        sizes = experiment.sizes if experiment is not None else None
        wanted_capacity = experiment.capacity if experiment is not None else None
        rules = provider_class(settings.node_provider)
        if sizes and accelerator is None:
            check_sizes(rules.offers, sizes)
        acc = rules.offers.shape(accelerator or (sizes[0] if sizes else None) or settings.accelerator)
        metadata: dict[str, str] = {}
        if settings.max_run_hours:
            metadata[MetadataKey.MAX_RUN_SECONDS.value] = str(int(settings.max_run_hours * 3600))
        if settings.wake_job:
            metadata[MetadataKey.WAKE_JOB.value] = settings.wake_job
        metadata.update(extra_metadata or {})
        return cls(project=settings.project, store_root=settings.store_root, accelerator=acc.type,
                   runtime=rules.offers.runtime_version(acc, runtime),
                   capacity=capacity or wanted_capacity or settings.capacity,
                   zones=tuple(rules.zones_for(acc.type, [rules.check_zone(zone)] if zone else list(settings.zones))),
                   labels=naming.labels_for(sweep_id=sweep_id, user=settings.labels), metadata=metadata,
                   service_account=settings.service_account)

    def at_size(self, settings: Settings, accelerator: str) -> NodeBasis:
        """This basis for another size of an elastic run: its accelerator, the runtime and the configured zones
        the provider offers it in (a one-host size too: a stockout's failover must not land where the size is
        never offered); everything else the same.

        Raises:
            UsageError: no configured zone offers the size.
        """
        rules = provider_class(settings.node_provider)
        acc = rules.offers.shape(accelerator)
        zones = rules.zones_for(acc.type, list(settings.zones))
        offered = set(rules.offers.zones_offering(acc.type))
        usable = [zone for zone in zones if zone in offered]  # a size's zones are told apart, one host too
        if offered and not usable:
            raise UsageError(f"accelerator size {acc.type} is not offered in {', '.join(zones)} (it is in "
                             f"{', '.join(sorted(offered))}): add one of those zones to tpuops.toml, or drop the size")
        return dataclasses.replace(self, accelerator=acc.type, runtime=rules.offers.runtime_version(acc),
                                   zones=tuple(usable or zones))

    @classmethod
    def of_frozen(cls, node: NodeSpec, *, project: str, store_root: str) -> NodeBasis:
        """The basis a frozen node was built on (``project`` and ``store_root``: those its script was rendered
        with): ``of_frozen(n).node(n.name, ...)`` with the same run gives ``n`` back."""
        return cls(project=project, store_root=store_root, accelerator=node.accelerator, runtime=node.runtime,
                   capacity=node.capacity, zones=tuple(node.zones),
                   labels={k: v for k, v in node.labels.items() if k != naming.RUN_KEY},
                   metadata={k: v for k, v in node.metadata.items() if k != MetadataKey.STARTUP_SCRIPT.value},
                   service_account=node.service_account)

    def node(self, name: str, *, run_id: str | None = None, job: Sequence[str] | None = None,
             needs_agent_pins: bool = False) -> UpPlan:
        """The request of node ``name`` (its run ``run_id``, booting ``job``), validated, nothing called.

        ``needs_agent_pins``: the job needs packages beyond TF 2.9 (``StartupContext.needs_agent_pins``).
        """
        from tpuops.launch.render import (  # jinja2: only a plan needs it (status does not)
            StartupContext,
            render_startup_script,
        )

        naming.check_node_name(name)
        labels = dict(self.labels) if run_id is None else naming.check_labels({**self.labels, naming.RUN_KEY: run_id})
        script = render_startup_script(StartupContext(
            node_name=name, project=self.project, zone=self.zones[0], accelerator_type=self.accelerator,
            run_id=run_id, store_root=self.store_root, job=job, labels=labels, needs_agent_pins=needs_agent_pins,
        ))
        request = NodeRequest(name=name, accelerator=self.accelerator, runtime=self.runtime, capacity=self.capacity,
                              labels=labels, metadata={MetadataKey.STARTUP_SCRIPT.value: script, **self.metadata},
                              service_account=self.service_account)
        return UpPlan(request=request, zones=list(self.zones))

    def run_node(self, run_id: str, kind: RunKind, *, store_uri: str, bundle_sha256: str) -> UpPlan:
        """The node of a run: named for it, booting its job (``bundle.job_argv``) from its bundle in the store."""
        return self.node(run_id, run_id=run_id, job=job_argv(store_uri, bundle_sha256, run_id, kind.value),
                         needs_agent_pins=kind is RunKind.INFER)


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
    """``up``'s node (and any one-off node) from the config of the moment: ``NodeBasis.of_settings`` and ``node``."""
    naming.check_node_name(name)
    basis = NodeBasis.of_settings(settings, accelerator=accelerator, capacity=capacity, zone=zone, runtime=runtime,
                                  sweep_id=sweep_id, extra_metadata=extra_metadata)
    return basis.node(name, run_id=run_id, job=job, needs_agent_pins=needs_agent_pins)
