"""Names, labels and node metadata keys: checked against GCP's rules before any API call.

A bad node id or label otherwise comes back from the API as a 400 after a round trip (or,
inside a create operation, minutes later); here it is one ``UsageError`` line that names the
value and the rule.

Rules (Cloud TPU node ids follow RFC 1035; labels follow the Resource Manager rules):

- node id: 1-63 characters, ``[a-z0-9-]``, starting with a letter, not ending with ``-``;
- label key: 1-63 characters, ``[a-z0-9_-]``, starting with a letter;
- label value: 0-63 characters, ``[a-z0-9_-]``;
- at most 64 labels on a resource.

GCP also allows international lowercase letters in label keys and values; tpuops accepts
ASCII only, so that every label survives the filters, shells and file names it meets on
the way (``gcloud --filter``, the startup script, the ledger).

Every node tpuops creates carries the managed labels built by ``labels_for``; they are how
state is rebuilt from the cloud (docs/design.md, "Sources of truth"), so users may not set them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from tpuops.contract.wake import WAKE_JOB_ATTRIBUTE
from tpuops.core.errors import UsageError
from tpuops.core.kinds import ValueEnum

MAX_LABELS = 64

# Patterns that spec and config fields are declared with, and their rule in words: an error
# names the rule, never the regular expression (``rule_in_words``).
SPEC_NAME = r"^[a-z][a-z0-9-]{0,40}$"
"""Experiment and sweep names: they become run ids, node names (63 at most) and store folders."""
FUNCTION = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"
METRIC = r"^[A-Za-z_][\w.]*$"
SERVICE_ACCOUNT = r"^[^@\s]+@[^@\s]+\.iam\.gserviceaccount\.com$"
URL = r"^[a-z0-9+]+://"
CLOUD_RUN_JOB = r"^projects/[a-z][a-z0-9-]{4,28}[a-z0-9]/locations/[a-z]+-[a-z]+[0-9]+/jobs/[a-z][a-z0-9-]{0,62}$"
"""A Cloud Run job's full resource name, as infra/ outputs it (``wake_job``)."""
_RULES = {
    SPEC_NAME: "use 1-41 lowercase letters, digits and '-', starting with a letter (no '/', '.' or spaces)",
    FUNCTION: "write module:function, e.g. models:digits_cnn",
    METRIC: "a metric name such as accuracy or val_loss (letters, digits, '_' and '.')",
    SERVICE_ACCOUNT: "an account email such as runner@my-project.iam.gserviceaccount.com",
    URL: "a URL such as postgresql://user@host:5432/db",
    CLOUD_RUN_JOB: "a Cloud Run job name such as projects/my-project/locations/us-central1/jobs/tpuops-reconcile "
                   "(terraform output -raw wake_job)",
}


def rule_in_words(pattern: str) -> str:
    """What a value declared with ``pattern`` must look like, said in words."""
    return _RULES.get(pattern, "it does not have the expected form")

MANAGED_BY_KEY = "managed-by"
MANAGED_BY_VALUE = "tpuops"
RUN_KEY = "tpuops-run"
SWEEP_KEY = "tpuops-sweep"
PREEMPTIONS_KEY = "tpuops-preemptions"
"""A run's node carries how many preemptions the run had recovered from when the node was created: the count
is then in the cloud before the pass's memory write, and a pass that dies or fails between its create and that
write loses no preemption (the next pass takes the count back from the node, ``tpuops.controller.decide``)."""
ATTEMPT_KEY = "tpuops-attempt"
"""A run's node carries the attempt it was created for (``Memory.attempts`` then): a pass that finds a node of a later
attempt than its run's memory knows adopts it as the run's node, so that a pass that dies or fails between its create
and its memory write leaves no node of the run mistaken for the one before it (``tpuops.controller.preemptions``)."""
CARRIED_KEYS = (PREEMPTIONS_KEY, ATTEMPT_KEY)
"""The labels a run's node gets at its create on top of its run's (``labels_for`` leaves room for them)."""
PROBE_KEY = "tpuops-probe-for"
"""The label that makes a node an elastic run's probe (``tpuops.controller.probes``): its value is the node name of
the run it probes for, which is the run's id. A probe is labelled as a run of its own name (``RUN_KEY``, so that no
pass takes it for its run's node and no agent boots on it), but it is its run's: billed to it and reaped as its
(``run_of``)."""
MANAGED_KEYS = frozenset({MANAGED_BY_KEY, RUN_KEY, SWEEP_KEY, PROBE_KEY, *CARRIED_KEYS})


def run_of(labels: Mapping[str, str]) -> str | None:
    """The run a node belongs to, whose ledger lines and cost it counts in: a probe's, the run it probes for
    (``tpuops cost`` shows a run's probe time under the run, not under ``<run>-up``); any other's, its run label's."""
    return labels.get(PROBE_KEY) or labels.get(RUN_KEY)


def label_count(labels: Mapping[str, str], key: str) -> int:
    """The number a run's node was created with under ``key`` (one of ``CARRIED_KEYS``); 0 when it carries none."""
    value = labels.get(key, "")
    return int(value) if value.isdigit() else 0


class MetadataKey(ValueEnum):
    """Node metadata keys that tpuops writes at create time and the VM's startup script reads.

    The one list: ``templates/startup.sh.j2`` gets them from the renderer, a key spelled anywhere else is a
    bug. A provider carries them as the node's startup payload (``NodeRequest.metadata``) in its own way.
    The agent, which imports nothing of tpuops, reads ``WAKE_JOB`` by the constant it is made from.
    """

    STARTUP_SCRIPT = "startup-script"
    MAX_RUN_SECONDS = "tpuops-max-run-seconds"
    """The dead-man's switch: past this many seconds the job is stopped and the node deletes itself."""
    KEEP_NODE = "tpuops-keep-node"
    """Set ("true"): the node stays up after its job ends (``--keep``)."""
    TPU_API = "tpuops-tpu-api"
    """A non-default API endpoint (the emulator) the node deletes itself through."""
    WAKE_JOB = WAKE_JOB_ATTRIBUTE
    """The Cloud Run job (``projects/P/locations/R/jobs/J``) the agent starts after its save on a preemption
    notice (``tpuops.agent.wake``; setting ``wake_job``)."""

_NODE_NAME = re.compile(r"[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?")
_LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")


def check_node_name(name: str, what: str = "node name") -> str:
    """Return ``name`` if it is a valid TPU node id (``what`` names it: a run id is one too), else ``UsageError``."""
    if not _NODE_NAME.fullmatch(name):
        raise UsageError(
            f"{what} {name!r} is not allowed: use 1-63 lowercase letters, digits and '-', "
            "starting with a letter and not ending with '-'"
        )
    return name


def check_sweep_name(name: str) -> str:
    """Return ``name`` if it may name a sweep (``SPEC_NAME``), else one ``UsageError`` line with the rule."""
    if not re.fullmatch(SPEC_NAME, name):
        raise UsageError(f"sweep name {name!r} is not allowed: {rule_in_words(SPEC_NAME)}")
    return name


def check_label_key(key: str) -> str:
    """Return ``key`` if it is a valid label key, else raise ``UsageError``."""
    if not _LABEL_KEY.fullmatch(key):
        raise UsageError(
            f"label key {key!r} is not allowed: use 1-63 lowercase letters, digits, '_' and '-', "
            "starting with a letter"
        )
    return key


def check_label_value(value: str, *, key: str) -> str:
    """Return ``value`` if it is a valid value for label ``key``, else raise ``UsageError``."""
    if not _LABEL_VALUE.fullmatch(value):
        raise UsageError(
            f"label value {value!r} (key {key!r}) is not allowed: "
            "use 0-63 lowercase letters, digits, '_' and '-'"
        )
    return value


def check_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """Check every key and value and the count; return the labels as a new dict."""
    if len(labels) > MAX_LABELS:
        raise UsageError(f"{len(labels)} labels are too many: GCP allows at most {MAX_LABELS} on a node")
    return {check_label_key(key): check_label_value(value, key=key) for key, value in labels.items()}


def labels_for(
    run_id: str | None = None,
    sweep_id: str | None = None,
    user: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The labels of a node tpuops creates: the user's, plus ``managed-by=tpuops`` and run/sweep ids (a run's nodes
    get ``CARRIED_KEYS`` too at their create: the count leaves room for them).

    Raises:
        UsageError: a user label uses a managed key, or any key, value or the count breaks GCP's rules.
    """
    user = dict(user or {})
    reserved = sorted(MANAGED_KEYS.intersection(user))
    if reserved:
        raise UsageError(
            f"label {reserved[0]!r} is set by tpuops and may not be given "
            f"(reserved keys: {', '.join(sorted(MANAGED_KEYS))})"
        )
    labels = {**user, MANAGED_BY_KEY: MANAGED_BY_VALUE}
    if run_id is not None:
        labels[RUN_KEY] = run_id
    if sweep_id is not None:
        labels[SWEEP_KEY] = sweep_id
    if run_id is not None and len(labels) + len(CARRIED_KEYS) > MAX_LABELS:
        ours = len(labels) - len(user) + len(CARRIED_KEYS)
        raise UsageError(f"{len(user)} labels are too many for a run: its nodes carry {ours} of tpuops's, and GCP "
                         f"allows at most {MAX_LABELS} on a node (give at most {MAX_LABELS - ours})")
    return check_labels(labels)


def is_zone_name(zone: str) -> bool:
    """GCP zone names are region-letter: 'us-central1-a', 'europe-west4-b'."""
    parts = zone.split("-")
    return len(parts) == 3 and all(parts) and len(parts[2]) == 1 and parts[1][-1:].isdigit()


def check_zone_name(zone: str) -> str:
    """``zone`` if it is shaped as a zone name, else one ``UsageError`` line (which zones exist: a provider's rule)."""
    if not is_zone_name(zone):
        raise UsageError(f"zone {zone!r} is not a zone name such as 'us-central1-a'")
    return zone
