"""Where a run's files are in the store, who writes each one, and when: the one place that says it.

Every key below is relative to the store root (docs/design.md, "The store is the message bus")::

    runs/<run>/run.json       the run record (``RunRecord``): kind, the frozen node request, bundle,
                              limits, sweep. Written once by ``declare`` (compare-and-swap on
                              generation 0), never rewritten.
    runs/<run>/spec.json      the agent's run spec (schema: ``tpuops/contract/runspec.py``). Written once
                              by ``declare`` before run.json; read by the agent at every start.
    runs/<run>/status.json    the agent's status (``AgentStatus``): rewritten whole by the agent at
                              every phase change and heartbeat, and by the node's bootstrap when it
                              refuses a bundle (in a simulation, by the simulated agent,
                              ``tpuops.sim.agent``). The control plane only reads it.
    runs/<run>/memory.json    the controller's memory of the run (``Memory``): written with
                              compare-and-swap by the lease holder after a pass that changed it,
                              and by ``reopen``. A run of a store from before this name has its
                              memory in ``control.json``: read there until the memory is next
                              written (as memory.json), then left like the run's other files (a
                              run's files outlive it). Nothing writes control.json any more, so
                              their number cannot grow: not a leak, and not worth a delete per save.
    runs/<run>/stop.json      a request to stop the run (``StopRequest``): written by ``tpuops stop`` (and
                              ``down`` of the run's node, the dashboard), by anyone, no lease needed; its
                              index marker is rewritten after it, so the controller holding the run's lease
                              reads it at its next pass, and that controller finishes the run STOPPED and
                              deletes its node. Deleted by ``reopen`` (``train --resume``).
    runs/<run>/<name>.damaged a damaged memory.json, control.json or status.json as it was, kept by
                              ``tpuops runs repair`` before it replaced it (``tpuops.runs.repair``).
    runs/<run>/logs/<writer>-NNNNNN.log  the agent's log chunks, each written whole, once, named by
                              its writer (its start time) and number, so name order is write order and
                              no attempt writes over another's (``tpuops/agent/logs.py``): worker 0's log
                              (the agent runs there on a slice, as on one host).
    runs/<run>/logs/w<N>/<writer>-NNNNNN.log  worker N's log on a slice (N >= 1), in the same chunks,
                              shipped by that worker (``templates/ship_log.py``) until it is stopped;
                              ``tpuops logs RUN --worker N`` reads it.
    runs/<run>/ckpt/ tb/ model/ predictions/   the agent's checkpoints, TensorBoard events,
                              final SavedModel and default inference output.
    runs/<run>/profile.json   a request for a TensorFlow profile (``{id, steps | seconds, requested_at}``):
                              written by ``tpuops profile`` (``tpuops.api.profiles``), rewritten by the next
                              request, read by the agent every heartbeat (``tpuops.agent.profiles``, which
                              defines the names).
    runs/<run>/profiles/<attempt>-step<N>/   one capture: TensorBoard's ``plugins/profile/<session>/
                              <host>.xplane.pb`` (a slice's from each worker) and ``record.json``, written last
                              by the agent: complete, failed or discarded (the attempt ended inside the window).
                              A folder without a complete record is not a profile.
    index/runs/<run>          empty marker of every run: written by ``declare`` after run.json, so
                              listing runs costs one object per run, not every file of its history.
    index/active/<run>        empty marker of an unfinished run: written by ``declare``,
                              ``reopen`` and a stop request, deleted by the controller once the run is finished and
                              its node gone. A controller pass lists this prefix only, so its cost
                              grows with the runs still going, not with history.
    index/built               written once the two indexes cover every run (a store from before
                              the index is indexed on first use by scanning ``runs/``).
    leases/<run>              a controller's lease on the run (``tpuops.store.lease``).
    wake/<run>                the wake marker: written by the agent after its save on a preemption
                              notice (``tpuops.contract.wake``, which defines the prefix: the agent
                              cannot import this module), JSON ``{run_id, attempt, at}``. Deleted
                              by the controller that hurried for it, or found stale
                              (``tpuops.controller.wake``), and with the run's active marker.

A run exists once its run.json does; the markers are derived from the run documents and can be
rebuilt from them (``rebuild_index``), except that ``tpuops runs forget`` takes a damaged run out of
both indexes and leaves its files: a rebuild of the index lists it again.
"""

from __future__ import annotations

from tpuops.contract.wake import WAKE_PREFIX as WAKE

RUNS = "runs/"
INDEX_RUNS = "index/runs/"
INDEX_ACTIVE = "index/active/"
INDEX_BUILT = "index/built"

RECORD = "run.json"
SPEC = "spec.json"
STATUS = "status.json"
MEMORY = "memory.json"
STOP = "stop.json"
LEGACY_MEMORY = "control.json"
"""Where the memory was kept before it was named after what it is; read only."""
LOGS = "logs/"


def run_key(run_id: str, name: str) -> str:
    """The key of one of the run's files, e.g. ``run_key("r1", STATUS)``."""
    return f"{RUNS}{run_id}/{name}"


def record_key(run_id: str) -> str:
    return run_key(run_id, RECORD)


def spec_key(run_id: str) -> str:
    return run_key(run_id, SPEC)


def status_key(run_id: str) -> str:
    return run_key(run_id, STATUS)


def memory_key(run_id: str) -> str:
    return run_key(run_id, MEMORY)


def stop_key(run_id: str) -> str:
    return run_key(run_id, STOP)


def logs_prefix(run_id: str, worker: int = 0) -> str:
    """Where worker ``worker``'s log chunks are: worker 0's directly under ``logs/``, worker N's in ``logs/wN/``."""
    return run_key(run_id, LOGS if worker == 0 else f"{LOGS}w{worker}/")


def wake_key(run_id: str) -> str:
    return f"{WAKE}{run_id}"


def run_of(key: str, prefix: str) -> str:
    """The run id a marker key names (``index/active/r1`` -> ``r1``)."""
    return key[len(prefix):]
