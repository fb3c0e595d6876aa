"""``runs/<run>/status.json``: what the agent is doing, rewritten whole and often; its one schema.

The control plane reads this file to follow a run and to decide what to do when the node goes
away; it never talks to the agent otherwise. Fields (times are UTC ISO 8601)::

    run_id, command ("train" | "infer"), attempt (1, 2, ... one per agent start),
    phase        starting | loading | training | checkpointing | evaluating | saving |
                 predicting | done  ("done" exactly when exit_class is set)
    step, total_steps, examples_per_sec, global_batch, replicas, device ("TPU" | "CPU"),
    accumulation  micro-batches per optimizer step on this attempt's slice: global_batch =
                 per_replica_batch_size x replicas x accumulation (1 when the slice takes the global
                 batch at once); null before the runtime is chosen, in script mode and from older agents
    examples_seen  training examples consumed by the steps done (step x global_batch, whatever slice
                 sizes trained them): the data position a resume continues from; null before the
                 checkpoint is restored and from older agents
    deterministic  whether TF op determinism is on for this attempt (the spec's choice, or its
                 ``auto`` rule: on without a TPU), null before the runtime is chosen and in script mode
    resumed_from_step   null on a fresh start, else the checkpoint step this attempt resumed from
    recomputed_steps    steps trained again over the whole run: on each resume, how far the attempt
                 before had gone past the checkpoint resumed from (as its last status says: steps
                 after its last write are not counted)
    last_checkpoint_step  the newest checkpoint known to be whole in the store (a resumed attempt
                 never starts before it), null before the first; written once its copy is complete
    checkpoint_in_flight  the step of the checkpoint being written in the background, else null
    checkpoint_every_s  the periodic checkpoint interval in use (``every: auto``: re-chosen after each save)
    last_save_s  the last checkpoint's cost in seconds, from its snapshot to whole in the store (what
                 ``every: auto`` weighs; a forecast learns an experiment's save cost from it), null before the first
    metrics      {"train": {...}, "eval": {...}, "predicted": n}; "train": the training metrics' means over
                 the steps "first_step" to "step" (both in it): the window of ``steps_per_call`` steps
                 ending at a multiple of it (or at the last step), whenever the agent read it, so a slice
                 and one host report the same quantity at a step; shorter only when an attempt resumed
                 inside a window or a compiled model's evaluation reset its metrics (in script mode: the
                 program's Keras logs as it last reported them); "eval": the last evaluation's, at "step"
    input_wait_ms  mean time a training step waited for its batch over the last call (the
                 starvation measure: near 0 when the input pipeline keeps up), null before
    evals        [{"step": int, "metrics": {name: float}}, ...] every evaluation of the run in
                 step order, the periodic ones and the final one, carried over from earlier
                 attempts (an evaluation at a step replaces the ones at that step and later,
                 which a resumed attempt redoes); names are the model's for compiled models
    attempts     [{...}, ...] one entry per attempt of the run, in order, carried over like evals:
                 where its seconds went (setup, productive, recomputed, checkpoint, eval, save,
                 input wait) and when it started and ended (fields in ``timing``);
                 [] in script mode, where the agent does not see the program's steps
    started, heartbeat  heartbeat is refreshed at least every spec.heartbeat_seconds while alive
    exit_class   null while running, else succeeded | user-error | diverged | preempted | stopped | crashed
    ended        null while running, else when the agent finished (set with exit_class, to the
                 microsecond): unless the VM is being preempted or the node is kept, the startup
                 script deletes the node right after (the dead-man's switch); the control plane
                 dates the end of its billing from that delete's operation, not from here (an API that fails
                 then keeps the node READY, and billed, until a delete gets through)
    exit_code, message  one line saying why (for every non-success)
    traceback    the last lines of the traceback for user-error and crashed

A heartbeat older than a few intervals with ``exit_class`` null means the agent hung or died
(SIGKILL, the VM vanished): the controller treats that as a crash.

The writer is the agent's ``tpuops.agent.status.Status``, which starts from ``new_document`` and refuses
a field not in it; the reader is the control plane's ``tpuops.runs.models.AgentStatus``. ``FIELDS`` says
what JSON each field may hold, and tests/contract/test_contract.py checks the reader against it field by field.
"""

from datetime import datetime, timezone
from typing import Any, Dict, List, Optional, Tuple

from tpuops.contract.exits import ExitClass, Phase

NULL = type(None)
FIELDS: Dict[str, Tuple[type, ...]] = {
    "run_id": (str,),
    "command": (str,),
    "attempt": (int,),
    "phase": (str,),
    "step": (int,),
    "total_steps": (int, NULL),
    "examples_per_sec": (float, NULL),
    "global_batch": (int, NULL),
    "replicas": (int, NULL),
    "accumulation": (int, NULL),
    "examples_seen": (int, NULL),
    "device": (str, NULL),
    "deterministic": (bool, NULL),
    "resumed_from_step": (int, NULL),
    "recomputed_steps": (int,),
    "last_checkpoint_step": (int, NULL),
    "checkpoint_in_flight": (int, NULL),
    "checkpoint_every_s": (float, NULL),
    "last_save_s": (float, NULL),
    "metrics": (dict,),
    "input_wait_ms": (float, NULL),
    "evals": (list,),
    "attempts": (list,),
    "started": (str,),
    "heartbeat": (str,),
    "exit_class": (str, NULL),
    "ended": (str, NULL),
    "exit_code": (int, NULL),
    "message": (str, NULL),
    "traceback": (str, NULL),
}
"""Every field of the document, in the order above, with the JSON types its value may have."""
COMMANDS = ("train", "infer")
"""The values of ``command``."""
PHASES = tuple(phase.value for phase in Phase)
"""The values of ``phase`` (a newer agent may add one: a reader keeps what it does not know as text)."""
EXIT_CLASSES = tuple(exit_class.value for exit_class in ExitClass)
"""The values of ``exit_class`` once set."""
EVAL_FIELDS = ("step", "metrics")
"""The fields of an ``evals`` entry: the step, and ``{name: float}``."""


def utc_now() -> str:
    """Now, as ``started`` and ``heartbeat`` write it (UTC ISO 8601 to the second)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def ended_now() -> str:
    """Now, as ``ended`` writes it: to the microsecond, since the control plane dates a node's end by it."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def new_document(
    run_id: str, command: str, attempt: int, recomputed_steps: int = 0, evals: Optional[List[Dict[str, Any]]] = None
) -> Dict[str, Any]:
    """The document an attempt starts with: every field of ``FIELDS``, nothing done yet (null where it may be)."""
    now = utc_now()
    document: Dict[str, Any] = dict.fromkeys(FIELDS)
    document.update(
        run_id=run_id,
        command=command,
        attempt=attempt,
        phase=Phase.STARTING.value,
        step=0,
        recomputed_steps=recomputed_steps,
        metrics={},
        evals=list(evals or []),
        attempts=[],
        started=now,
        heartbeat=now,
    )
    return document
