"""The one failure taxonomy of tpuops (docs/design.md, "Failure taxonomy").

Every error that leaves a library function is one of these classes. SDK exceptions
(google-api-core, google-cloud-storage, OS errors) are converted exactly once, at the
adapter that called the SDK, with ``raise ... from err``; nothing above an adapter
inspects an SDK exception. The CLI turns a ``TpuopsError`` into one line on stderr and
``exit_code``; anything else is a bug and keeps its traceback.

It imports nothing from tpuops, so that every module may raise these classes.
"""

from __future__ import annotations


def excerpt(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters: a refusal echoes what it refused, on one line, not 5,000 digits."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 12]}...{text[-9:]}"


class TpuopsError(Exception):
    """Base class: a failure the user can read and act on.

    ``retryable`` tells the one retry policy (``tpuops.core.retry``) whether trying the same
    call again can help.
    """

    exit_code = 1
    retryable = False
    retry_window_s: float | None = None
    """For a retryable error: the longest it is worth retrying, whatever the caller's deadline (None: no cap)."""


class UsageError(TpuopsError):
    """Bad input caught before anything was called: config value, name, spec, flag."""

    exit_code = 2


class InvalidRequest(TpuopsError):
    """The API rejected the request as malformed or impossible (HTTP 400, bad accelerator for zone)."""

    exit_code = 2


class TransientError(TpuopsError):
    """UNAVAILABLE, DEADLINE_EXCEEDED, HTTP 429/500/503, a dropped connection: retry with backoff."""

    retryable = True


class Unreachable(TransientError):
    """Nothing answers at an endpoint (connection refused, unknown host): retried briefly, then one line naming it.

    A server being restarted comes back within seconds; one that is not there never does, and a
    command must not wait out a two-minute deadline to say so.
    """

    retry_window_s = 5.0


class CapacityError(TpuopsError):
    """RESOURCE_EXHAUSTED stockout inside a create operation: try the next zone, then back off."""

    def __init__(self, message: str, zone: str | None = None) -> None:
        super().__init__(message)
        self.zone = zone


class QuotaError(TpuopsError):
    """A quota limit was hit: retrying will not help until the quota changes."""


class PermissionDenied(TpuopsError):
    """HTTP 401/403: the credentials may not do this."""


class NotFound(TpuopsError):
    """The named resource does not exist (HTTP 404)."""


class AlreadyExists(TpuopsError):
    """A resource with this name exists already (HTTP 409) and is not one we can adopt."""


class PreconditionFailed(TpuopsError):
    """A compare-and-swap lost: the object's generation was not the expected one (leases, run state)."""


class LeaseLost(PreconditionFailed):
    """A call of an action decided under a lease that is not ours any more, or could not be renewed
    (``tpuops.core.acting``): it was not sent. Worth trying again, by the next pass (which takes the lease and
    decides afresh), never at once: a create that met it is retried then, not failed."""

    retryable = True
    retry_window_s = 0.0


class IntegrityError(TpuopsError):
    """Bytes do not match their checksum (a local file changed, or a stored object is corrupt)."""


class DamagedDocument(TpuopsError):
    """A document tpuops keeps in the store (a run's ``run.json``, ``memory.json`` or ``status.json``, a sweep's
    ``sweep.json`` or ``state.json``) cannot be read: not JSON, or a value of the wrong type.

    A failure of the world (exit 1), not of the user's input: the documents loader (``tpuops.core.documents``) is for
    files a user gives, whose errors are usage errors. The message names the object and what is wrong. Only
    that one run or sweep is damaged: listings show it so and go on, a controller pass drives every other run
    (docs/design.md, "Failure taxonomy"), and ``tpuops runs repair`` / ``forget`` deal with it.
    """

    def __init__(self, message: str, *, where: str) -> None:
        super().__init__(message)
        self.where = where
        """The URI of the damaged document."""


class UserJobError(TpuopsError):
    """The user's job raised or its spec is wrong: never retried."""


class StudyError(TpuopsError):
    """Optuna failed on a sweep's study: its sampler or pruner raised (user-supplied code, in the end), or its
    storage holds what Optuna cannot read. That sweep waits for the next pass; every other sweep and run goes on."""


class Timeout(TpuopsError):
    """A bounded wait ran out (operation, node state, server start)."""


class Interrupted(TpuopsError):
    """The user pressed Ctrl-C; whatever was half-made has been cleaned up."""

    exit_code = 130
