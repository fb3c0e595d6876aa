"""What a run's node runs on worker 0: the bootstrap that fetches, checks and starts the run's bundle.

Its arguments are URIs under the store root (the bundle, the run spec, the agent's status) and the
agent's command. It takes the store's URI, not the store, so that a sweep's frozen trial template
renders it for each trial without opening anything.
"""

from __future__ import annotations

from tpuops.launch.bundle import bootstrap_source
from tpuops.runs.layout import spec_key, status_key
from tpuops.store.base import uri_under


def job_argv(store_uri: str, bundle_sha256: str, run_id: str, command: str) -> list[str]:
    """The startup script's job for run ``run_id``: ``python3 -c <bootstrap> BUNDLE SHA256 SPEC STATUS COMMAND``."""
    return ["python3", "-c", bootstrap_source(), uri_under(store_uri, f"bundles/{bundle_sha256}.tar.gz"),
            bundle_sha256, uri_under(store_uri, spec_key(run_id)), uri_under(store_uri, status_key(run_id)), command]
