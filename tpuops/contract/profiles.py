"""A profile request and its captures: ``runs/<run>/profile.json`` the control plane writes, the captures the agent
writes under ``runs/<run>/profiles/`` with their ``record.json`` (``tpuops.agent.profiles`` serves them,
``tpuops.api.profiles`` asks and shows them)."""

REQUEST = "profile.json"
"""The request's name under ``runs/<run>/`` (written by the control plane, read here)."""
PROFILES = "profiles"
"""The captures' folder under ``runs/<run>/``."""
RECORD = "record.json"
"""A capture's record, written last, in its folder."""
EXPERIMENT_REQUEST = "experiment"
"""The request id of the experiment's own window."""
COMPLETE, FAILED, DISCARDED = "complete", "failed", "discarded"
ANSWERED = (COMPLETE, FAILED)
"""Record states after which a request is not served again."""
