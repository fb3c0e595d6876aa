"""A node provider whose native vocabulary is not Cloud TPU's: TPUs on GKE, one JobSet manifest per node.

The proof that the seam (``tpuops.providers``) is neutral: this is one module, registered by one line
(``test_provider_contract.JOBSET``, which the tests put into ``tpuops.providers.registry.PROVIDERS`` with
``monkeypatch.setitem``), and nothing else in tpuops knows of it. It keeps every request as the manifest a
cluster would be sent (``apiVersion``/``kind``/``metadata``/``spec``): the accelerator and its topology are
node selectors (``cloud.google.com/gke-tpu-accelerator``, ``cloud.google.com/gke-tpu-topology``), spot is a
selector (``cloud.google.com/gke-spot``), the zone is the namespace and a selector, the runtime is the
container's image tag and the startup payload its command and environment.

A slice of H hosts is a JobSet of H pods (``parallelism``), each asking for its host's chips as
``google.com/tpu`` resources: a v4-16 is 2 pods of 4 chips on a ``2x2x2`` topology. What it offers it says itself
(``GkeOffers``, the class's ``offers``): GKE's rules (no v2 or v3 node pools), the runtime as an image tag, its
own price table and billing rule (no free first minute: a spot slice evicted at once is billed), and the slice
shapes of TPU hardware, which it takes from Cloud TPU's catalog by naming it (the chips are the same chips).

The cluster is a dict in this process: what a test does to it is said in its words (``pods_ready``,
``pod_fails``, ``evict``), and the adapter maps the JobSet and its pods onto the neutral words once: the
JobSet's status onto ``NodeState`` (``_state``), a failed pod of a running JobSet onto an unhealthy worker (its
completion index), a spot reclaim onto a preemption of the whole slice. ``exec`` is ``kubectl exec`` into the
worker's pod (``RunsCommands``: the arguments reach the container's process as given, no shell between); a pod
here is a folder of this machine with the completion index in its environment. Kubernetes has no long-running
operations: a create or a delete is done when answered, and the provider keeps a record of each so that
``operation`` can report it again.

Test-only: it lives under tests/, not in the package.
"""

from __future__ import annotations

import itertools
import re
import tempfile
import threading
from collections.abc import Mapping, Sequence
from datetime import date, datetime
from typing import Any, ClassVar

from tpuops.core.clock import UTC
from tpuops.core.errors import AlreadyExists, NotFound, UsageError
from tpuops.core.kinds import Capacity
from tpuops.core.naming import MetadataKey
from tpuops.providers.base import Connection
from tpuops.providers.cloud_tpu import catalog as tpu_hardware
from tpuops.providers.commands import WorkerRan, run_here
from tpuops.providers.nodes import NodeInfo, NodeRequest, NodeState, Operation
from tpuops.providers.offers import AcceleratorShape, Offers

ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY = "cloud.google.com/gke-tpu-topology"
SPOT = "cloud.google.com/gke-spot"
PREEMPTIBLE = "cloud.google.com/gke-preemptible"
ZONE = "topology.kubernetes.io/zone"
IMAGE = "us-docker.pkg.dev/tpuops/runtime:"
"""The runtime is the container image's tag."""
GKE_NAMES = {"v4": "tpu-v4-podslice", "v5e": "tpu-v5-lite-podslice", "v5p": "tpu-v5p-slice", "v6e": "tpu-v6e-slice"}
"""GKE's accelerator names by TPU generation; the others are spelled ``tpu-<generation>-slice`` here."""
PREEMPTED_REASON = "SpotPreemption"
INDEX = "batch.kubernetes.io/job-completion-index"
"""The pod's label that says which worker of the slice it is."""
DEFAULT_IMAGE_TAG = "tf-2.9.3"
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
PRICES: Mapping[str, Any] = {
    "source": "test-only: a GKE TPU price list of its own, so that a cost proves whose prices it used",
    "retrieved": date(2026, 12, 1), "currency": "USD", "base_region": "us-central1",
    "chip_hour": {"v4": {"on_demand": 3.0, "spot": 1.0}, "v5e": {"on_demand": 1.0, "spot": 0.5},
                  "v5p": {"on_demand": 4.0, "spot": 1.5}, "v6e": {"on_demand": 2.5, "spot": 1.0}},
}
"""USD per chip-hour, in the layout of ``tpuops.billing.pricing.Catalog.from_toml``."""


class GkeOffers:
    """What the JobSet provider offers (``Offers``): TPU slices of the generations GKE has node pools of."""

    def shape(self, accelerator: str) -> AcceleratorShape:
        spec = tpu_hardware.load().accelerators.get(accelerator)
        if spec is None or spec.generation not in GKE_NAMES:
            raise UsageError(f"accelerator {accelerator!r} has no GKE node pools (TPU {', '.join(GKE_NAMES)} do)")
        replicas = spec.chips * 2 if spec.counts_cores else spec.chips
        return AcceleratorShape(type=accelerator, generation=spec.generation, chips=spec.chips, hosts=spec.hosts,
                                replicas=replicas)

    def runtime_version(self, shape: AcceleratorShape, requested: str | None = None) -> str:
        if requested is None:
            return DEFAULT_IMAGE_TAG
        if not _TAG.fullmatch(requested):
            raise UsageError(f"runtime {requested!r} is not an image tag (e.g. {DEFAULT_IMAGE_TAG})")
        return requested

    def zones_offering(self, accelerator: str) -> list[str]:
        return tpu_hardware.load().zones_offering(accelerator)

    def price_table(self) -> Mapping[str, Any]:
        return PRICES

    def spot_priced(self) -> frozenset[str]:
        return frozenset({Capacity.SPOT.value, Capacity.PREEMPTIBLE.value})

    def preemption_is_free(self, capacity: str, created_s: float, preempted_s: float) -> bool:
        return False  # GKE bills a node pool's VMs from their start: no free first minute


GKE: Offers = GkeOffers()


def _gke_name(generation: str) -> str:
    return GKE_NAMES.get(generation, f"tpu-{generation}-slice")


def _rfc3339(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_rfc3339(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def manifest(zone: str, request: NodeRequest) -> dict[str, Any]:
    """The JobSet that runs ``request`` on a TPU slice in ``zone``: one pod per host, each on the slice's chips."""
    shape = tpu_hardware.load().accelerators[request.accelerator]  # what the settings' check let through
    selector = {ACCELERATOR: _gke_name(shape.generation), TOPOLOGY: shape.topology, ZONE: zone}
    if request.capacity is Capacity.SPOT:
        selector[SPOT] = "true"
    elif request.capacity is Capacity.PREEMPTIBLE:
        selector[PREEMPTIBLE] = "true"
    payload = dict(request.metadata)
    script = payload.pop(MetadataKey.STARTUP_SCRIPT.value, "")
    container = {"name": "tpuops", "image": IMAGE + request.runtime, "command": ["bash", "-c", script],
                 "env": [{"name": key.upper().replace("-", "_"), "value": value} for key, value in payload.items()],
                 "resources": {"limits": {"google.com/tpu": str(shape.chips // shape.hosts)}}}
    annotations = {"description": request.description}
    if request.service_account:
        annotations["iam.gke.io/gcp-service-account"] = request.service_account
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": request.name, "namespace": zone, "labels": dict(request.labels),
                     "annotations": annotations},
        "spec": {"replicatedJobs": [{"name": "workers", "replicas": 1, "template": {"spec": {
            "parallelism": shape.hosts, "completions": shape.hosts, "backoffLimit": 0,
            "template": {"spec": {"nodeSelector": selector, "restartPolicy": "Never",
                                  "tolerations": [{"key": "google.com/tpu", "operator": "Exists",
                                                   "effect": "NoSchedule"}],
                                  "containers": [container]}}}}}]},
    }


def _pods(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["replicatedJobs"][0]["template"]["spec"]


def _state(job: dict[str, Any], pods: list[dict[str, Any]]) -> NodeState:
    """The JobSet's status in the neutral words: a spot eviction is a preemption, any other failure the end; READY
    once every pod has started (a pod that failed since is an unhealthy worker, not a state of the slice)."""
    for condition in job["status"]["conditions"]:
        if condition["type"] == "Failed":
            return NodeState.PREEMPTED if condition["reason"] == PREEMPTED_REASON else NodeState.TERMINATED
    started = [pod for pod in pods if pod["status"]["phase"] in ("Running", "Failed")]
    return NodeState.READY if len(started) == _pods(job)["parallelism"] else NodeState.CREATING


def _unhealthy(job: dict[str, Any], pods: list[dict[str, Any]]) -> tuple[int, ...]:
    """The workers whose pod failed while the JobSet runs on (a failed JobSet's pods are its state, not workers)."""
    if any(condition["type"] == "Failed" for condition in job["status"]["conditions"]):
        return ()
    return tuple(sorted(int(pod["metadata"]["labels"][INDEX]) for pod in pods
                        if pod["status"]["phase"] == "Failed"))


def _node(project: str, job: dict[str, Any], pods: list[dict[str, Any]]) -> NodeInfo:
    meta, pod = job["metadata"], _pods(job)["template"]["spec"]
    selector = pod["nodeSelector"]
    generation = next((g for g, name in GKE_NAMES.items() if name == selector[ACCELERATOR]),
                      selector[ACCELERATOR].removeprefix("tpu-").removesuffix("-slice"))
    accelerator = next(a.name for a in tpu_hardware.load().accelerators.values()
                       if a.generation == generation and a.topology == selector[TOPOLOGY])
    capacity = (Capacity.SPOT if selector.get(SPOT) == "true" else
                Capacity.PREEMPTIBLE if selector.get(PREEMPTIBLE) == "true" else Capacity.ON_DEMAND)
    return NodeInfo(name=meta["name"], zone=meta["namespace"], project=project, accelerator=accelerator,
                    runtime=pod["containers"][0]["image"].removeprefix(IMAGE), capacity=capacity,
                    state=_state(job, pods), health="", labels=dict(meta["labels"]),
                    create_time=_parse_rfc3339(meta["creationTimestamp"]), uid=meta["uid"],
                    hosts=_pods(job)["parallelism"], unhealthy_workers=_unhealthy(job, pods))


class JobSetProvider:
    """TPU slices on a GKE cluster as JobSets (``NodeProvider``); the cluster is held in this process."""

    talks_to_emulator: ClassVar[bool] = False
    offers: ClassVar[Offers] = GKE

    def __init__(self, project: str, *, poll_interval_s: float = 0.01) -> None:
        self.project, self.poll_interval_s = project, poll_interval_s
        self.jobsets: dict[tuple[str, str], dict[str, Any]] = {}
        """(namespace, name) -> the JobSet as the cluster holds it (the manifest, with metadata and status filled)."""
        self.pods: dict[tuple[str, str], list[dict[str, Any]]] = {}
        """(namespace, JobSet name) -> its pods, by completion index (worker 0 first)."""
        self._operations: dict[str, Operation] = {}
        self._homes: dict[tuple[str, str, int], str] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    @classmethod
    def connect(cls, connection: Connection) -> JobSetProvider:
        return cls(connection.project, poll_interval_s=connection.poll_interval_s)

    @classmethod
    def create_body(cls, project: str, zone: str, request: NodeRequest) -> dict[str, Any]:
        """What ``create_node`` applies: the JobSet manifest."""
        return manifest(zone, request)

    @classmethod
    def check_zone(cls, zone: str) -> str:
        """A TPU zone (the cluster's node pools may sit in any)."""
        if zone not in tpu_hardware.load().zones:
            raise UsageError(f"zone {zone!r} has no TPU node pools on GKE")
        return zone

    @classmethod
    def check_accelerator(cls, accelerator: str) -> str:
        """GKE has TPU node pools of the generations it names (``GKE_NAMES``) only: no v2, no v3."""
        return GKE.shape(accelerator).type

    @classmethod
    def zones_for(cls, accelerator: str, zones: list[str]) -> list[str]:
        """A JobSet's slice comes from the cluster's node pools, whatever the zone: every configured zone."""
        return zones

    # -- the cluster, in its own words (what the tests do to it) ---------------------------------

    def pods_ready(self, zone: str, name: str) -> None:
        """Every pod of the JobSet is scheduled on the slice and running."""
        with self._lock:
            for pod in self.pods[(zone, name)]:
                pod["status"] = {"phase": "Running"}
            self.jobsets[(zone, name)]["status"]["replicatedJobsStatus"][0]["ready"] = len(self.pods[(zone, name)])

    def pod_fails(self, zone: str, name: str, worker: int) -> None:
        """The pod of one worker dies (its container exited, its host went bad); the JobSet runs on."""
        with self._lock:
            self.pods[(zone, name)][worker]["status"] = {"phase": "Failed", "reason": "Error"}
            self.jobsets[(zone, name)]["status"]["replicatedJobsStatus"][0]["ready"] -= 1

    def evict(self, zone: str, name: str) -> None:
        """GKE reclaimed the spot slice: every pod is evicted at once and the JobSet fails."""
        with self._lock:
            for pod in self.pods[(zone, name)]:
                pod["status"] = {"phase": "Failed", "reason": "Evicted"}
            job = self.jobsets[(zone, name)]
            job["status"]["replicatedJobsStatus"][0]["ready"] = 0
            job["status"]["conditions"].append({"type": "Failed", "reason": PREEMPTED_REASON})

    # -- RunsCommands --------------------------------------------------------------------------

    def run_on_worker(self, zone: str, node: str, worker: int, argv: Sequence[str], *,
                      timeout_s: float) -> WorkerRan:
        """``kubectl exec`` into pod ``worker`` of the JobSet: ``argv`` as given, in the pod's folder, with the
        environment a JobSet gives its pods; a pod that is not running answers as kubectl does (exit 1)."""
        with self._lock:
            pods = self.pods.get((zone, node))
            phase = None if pods is None or worker >= len(pods) else pods[worker]["status"]["phase"]
        if phase is None:
            raise UsageError(f"no pod {worker} of JobSet {node} in namespace {zone}")
        if phase != "Running":
            return WorkerRan(worker, 1, "", f"error: cannot exec into a container in a completed pod; current "
                                            f"phase is {phase}\n")
        home = self._homes.setdefault((zone, node, worker), tempfile.mkdtemp(prefix=f"{node}-{worker}-"))
        env = {"PATH": "/usr/bin:/bin", "HOME": home, "JOB_COMPLETION_INDEX": str(worker)}
        return run_here(worker, argv, cwd=home, env=env, timeout_s=timeout_s)

    # -- NodeProvider --------------------------------------------------------------------------

    def list_nodes(self, zone: str) -> list[NodeInfo]:
        with self._lock:
            return [_node(self.project, job, self.pods[key]) for key, job in self.jobsets.items() if key[0] == zone]

    def find_node(self, zone: str, name: str) -> NodeInfo | None:
        with self._lock:
            job = self.jobsets.get((zone, name))
            return None if job is None else _node(self.project, job, self.pods[(zone, name)])

    def create_node(self, zone: str, request: NodeRequest) -> Operation:
        job = manifest(zone, request)
        with self._lock:
            if (zone, request.name) in self.jobsets:
                raise AlreadyExists(f'jobsets.jobset.x-k8s.io "{request.name}" already exists in namespace {zone}')
            job["metadata"] |= {"uid": f"uid-{next(self._ids)}", "creationTimestamp": _rfc3339(datetime.now(UTC))}
            job["status"] = {"replicatedJobsStatus": [{"name": "workers", "ready": 0}], "conditions": []}
            self.pods[(zone, request.name)] = [
                {"metadata": {"name": f"{request.name}-workers-0-{index}", "labels": {INDEX: str(index)}},
                 "status": {"phase": "Pending"}} for index in range(_pods(job)["parallelism"])]
            self.jobsets[(zone, request.name)] = job
            return self._record(zone, request.name, "create")

    def delete_node(self, zone: str, name: str) -> Operation | None:
        with self._lock:
            if self.jobsets.pop((zone, name), None) is None:
                return None
            del self.pods[(zone, name)]
            return self._record(zone, name, "delete")

    def operation(self, zone: str, name: str) -> Operation:
        with self._lock:
            found = self._operations.get(name)
        if found is None:
            raise NotFound(f"operation {name} not found")
        return found

    def _record(self, zone: str, name: str, verb: str) -> Operation:
        """A request the cluster answered at once, kept so that ``operation`` reports it again."""
        now = datetime.now(UTC).replace(microsecond=0)
        operation = Operation(name=f"namespaces/{zone}/operations/{verb}-{next(self._ids)}", zone=zone, done=True,
                              target=f"namespaces/{zone}/jobsets/{name}", started=now, ended=now)
        self._operations[operation.name] = operation
        return operation
