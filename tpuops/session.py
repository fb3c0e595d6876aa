"""Wiring: turn ``Settings`` into the live collaborators a command needs.

Kept apart from the modules it wires so each of them takes its collaborators as
arguments (tests build them directly), and so that starting the local emulator on demand
happens in exactly one place.

Where the cloud is comes from the node provider's connection settings (``Settings.cloud``, from ``tpu_endpoint``),
never from a second notion of provider. With a local cloud and a ``gs://`` store, the emulator also serves the
store's bucket through fake-gcs-server (nodes reach it as storage.googleapis.com). Invariant: on a local cloud no
store opened here reaches public Cloud Storage: ``open_uri`` (which ``store`` and
the ``data`` commands use) sends the store's bucket to the emulator, and refuses it when the
running emulator does not serve it (its ``gcs.json`` lists the buckets it serves); other
buckets go only to a fake-gcs-server named by ``STORAGE_EMULATOR_HOST``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tpuops.billing.ledger import Ledger
from tpuops.config import Settings
from tpuops.core.errors import UsageError
from tpuops.core.kinds import Cloud

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tpuops.fleet import Fleet
    from tpuops.providers.base import NodeProvider
    from tpuops.providers.commands import RunsCommands, WorkerRan
    from tpuops.store import Store


def with_reachable_store(settings: Settings, warn: Callable[[str], None]) -> Settings:
    """``settings``, with the local store instead of a ``gs://`` one that a local cloud cannot serve here.

    The emulator serves a bucket to its nodes only where they get private mount namespaces (root,
    ``unshare``); elsewhere this falls back to the local store under ``home`` and says why in one
    line through ``warn``. Asked once per command, before anything reads ``store_root``, so that
    every part of the command (run specs, the store, the emulator) agrees on the store.
    """
    if settings.cloud is not Cloud.LOCAL or not settings.store.startswith("gs://"):
        return settings
    from tpuops.emulator import unavailable_reason

    reason = unavailable_reason()
    if reason is None:
        return settings
    warn(f"{reason}: using the local store {settings.home / 'store'} instead of {settings.store}")
    return settings.model_copy(update={"store": ""})


def emulated_buckets(settings: Settings) -> list[str]:
    """The buckets the local emulator serves: the store's, when a local cloud has a ``gs://`` store."""
    if settings.cloud is Cloud.LOCAL and settings.store_root.startswith("gs://"):
        from tpuops.store import split_gcs_uri

        return [split_gcs_uri(settings.store_root)[0]]
    return []


def tpu_endpoint(settings: Settings) -> str | None:
    """The Cloud TPU API endpoint: the configured address, else the local emulator (started if needed) on a local
    cloud, else None (Google's)."""
    if settings.endpoint_url:
        return settings.endpoint_url
    if settings.cloud is Cloud.LOCAL:
        from tpuops.emulator import ensure_running

        return ensure_running(settings.emulator_dir, image_python=emulated_image_python(settings),
                              gcs_buckets=emulated_buckets(settings)).endpoint
    return None


def emulated_image_python(settings: Settings) -> str:
    """The interpreter that plays the TPU VM image's python3 on the emulator: the local TF 2.9 runtime.

    Raises ``UsageError`` (one line: how to get one) when there is none (``tpuops.tfenv``).
    """
    from tpuops.tfenv.locate import require

    return str(require(settings))


def connect(settings: Settings) -> NodeProvider:
    """The configured node provider (``node_provider``, default Cloud TPU) on the configured endpoint.

    A local endpoint's bearer token (the emulator's) is looked up here, the one place that knows
    about the emulator, and handed to the provider.
    """
    from tpuops.providers.base import Connection
    from tpuops.providers.registry import open_provider, provider_class

    # a provider that keeps its own world (memory, simulated) never starts the emulator
    endpoint = tpu_endpoint(settings) if provider_class(settings.node_provider).talks_to_emulator else \
        settings.endpoint_url
    token = None
    if endpoint and endpoint.startswith("http://"):
        from tpuops.emulator import token_for

        token = token_for(endpoint)
    return open_provider(settings.node_provider, Connection(
        settings.project, endpoint=endpoint, token=token, deadline_s=settings.api_deadline_s,
        poll_interval_s=settings.poll_interval_s))


def worker_commands(settings: Settings, provider: NodeProvider) -> RunsCommands:
    """How this machine runs commands on the workers of ``provider``'s nodes (``exec``): the local emulator's
    workers directly when it serves the provider, else the provider's own ``RunsCommands``.

    Raises:
        UsageError: one line, when the provider cannot reach its workers (``providers.commands.commands_of``).
    """
    from tpuops.providers.commands import commands_of
    from tpuops.providers.registry import provider_class

    if settings.cloud is Cloud.LOCAL and provider_class(settings.node_provider).talks_to_emulator:
        return EmulatedWorkers(tpu_endpoint(settings) or "", settings.project)
    return commands_of(provider, settings.node_provider)


class EmulatedWorkers:
    """``RunsCommands`` on the emulator's workers, which are processes of this machine: a command runs as a
    login on that worker would run it (``gcloud ... ssh`` hands its line to the worker's shell): with bash,
    in the worker's directory (its HOME), with its metadata server, its line quoted once (``command_line``)."""

    def __init__(self, endpoint: str, project: str) -> None:
        self.endpoint, self.project = endpoint, project

    def run_on_worker(self, zone: str, node: str, worker: int, argv: Sequence[str], *,
                      timeout_s: float) -> WorkerRan:
        import os

        from tpuops.emulator import AdminClient
        from tpuops.providers.commands import command_line, run_here

        name = f"projects/{self.project}/locations/{zone}/nodes/{node}"
        described = next((n for n in AdminClient(self.endpoint).nodes() if n["name"] == name), None)
        host = next((w for w in (described or {}).get("workers", []) if w["worker"] == worker), None)
        if host is None:
            raise UsageError(f"the emulator has no worker {worker} of node {name}")
        env = {key: value for key, value in os.environ.items() if not key.startswith("TPUOPS_")}
        env.update(HOME=host["sandbox"], GCE_METADATA_HOST=host["metadata_host"] or "")
        os.makedirs(host["sandbox"], exist_ok=True)  # a VM has its home before any script ran there
        return run_here(worker, ["bash", "-c", command_line(argv)], cwd=host["sandbox"], env=env,
                        timeout_s=timeout_s)


def open_ledger(settings: Settings) -> Ledger:
    settings.home.mkdir(parents=True, exist_ok=True)
    return Ledger(settings.ledger_path)


def fleet(settings: Settings, progress: Callable[[str], None] | None = None) -> Fleet:
    """The configured project's nodes: the one holder of the provider (``up``, ``down``, ``status``, the controller)."""
    from tpuops.fleet import Fleet

    return Fleet(connect(settings), settings, open_ledger(settings), progress or (lambda _text: None))


def emulated_storage(settings: Settings) -> str:
    """The control plane's endpoint of the emulator's Cloud Storage (the emulator is started if needed).

    Also sets ``STORAGE_EMULATOR_HOST`` to it, so that every store opened from a URI in this process
    (datasets, sweeps) reaches the emulator too and never the public endpoint.

    Raises:
        UsageError: the running emulator does not serve every bucket the settings need (it was
            started while the store was local, or for another bucket).
    """
    import os

    from tpuops.emulator import storage_endpoint

    tpu_endpoint(settings)
    require_served(settings)
    endpoint = storage_endpoint(settings.emulator_dir)
    if endpoint is None:
        raise UsageError("the emulator's Cloud Storage stopped: tpuops emulator stop, then start")
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    return endpoint


def require_served(settings: Settings) -> None:
    """Refuse (``UsageError``, one line) when the running emulator does not serve a bucket the settings need."""
    from tpuops.emulator import served_buckets

    served = served_buckets(settings.emulator_dir)
    missing = [bucket for bucket in emulated_buckets(settings) if bucket not in served]
    if missing:
        raise UsageError(f"the emulator runs without Cloud Storage for gs://{missing[0]}: "
                         "tpuops emulator stop, then start")


def open_uri(settings: Settings, uri: str) -> Store:
    """The store at ``uri`` (a dataset, a sweep, the store root), never public Cloud Storage on a local cloud.

    On a local cloud a ``gs://`` URI is served by the emulator when its bucket is the store's
    (``emulated_storage``), or by the fake-gcs-server the user named with ``STORAGE_EMULATOR_HOST``;
    any other is refused (``UsageError``, one line) rather than sent to Google with the machine's credentials.
    """
    import os

    from tpuops.store import open_store, split_gcs_uri

    if settings.cloud is not Cloud.LOCAL or not uri.startswith("gs://"):
        return open_store(uri)
    bucket = split_gcs_uri(uri)[0]
    if bucket in emulated_buckets(settings):
        return open_store(uri, gcs_endpoint=emulated_storage(settings))
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        return open_store(uri)
    raise UsageError(f"provider local serves no Cloud Storage for gs://{bucket}: set store = 'gs://{bucket}/...' "
                     "(the emulator then serves it) or STORAGE_EMULATOR_HOST to a fake-gcs-server")


def store(settings: Settings) -> Store:
    """The store root (a local directory is created by its first write, so a refused command leaves none)."""
    return open_uri(settings, settings.store_root)
