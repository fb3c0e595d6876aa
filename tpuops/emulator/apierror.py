"""API errors as the real service reports them: a gRPC status name, its code and HTTP status.

The same error appears in two shapes: as an HTTP error body ``{"error": {code, message,
status}}`` for a failed call, and as ``google.rpc.Status`` ``{code, message, details}``
inside a failed operation. Both are built here so the numbers never drift apart.
"""

from __future__ import annotations

from typing import Any

# status name -> (gRPC code, HTTP status)
_CODES: dict[str, tuple[int, int]] = {
    "CANCELLED": (1, 499),
    "UNKNOWN": (2, 500),
    "INVALID_ARGUMENT": (3, 400),
    "DEADLINE_EXCEEDED": (4, 504),
    "NOT_FOUND": (5, 404),
    "ALREADY_EXISTS": (6, 409),
    "PERMISSION_DENIED": (7, 403),
    "RESOURCE_EXHAUSTED": (8, 429),
    "FAILED_PRECONDITION": (9, 400),
    "ABORTED": (10, 409),
    "OUT_OF_RANGE": (11, 400),
    "UNIMPLEMENTED": (12, 501),
    "INTERNAL": (13, 500),
    "UNAVAILABLE": (14, 503),
    "UNAUTHENTICATED": (16, 401),
}


class ApiError(Exception):
    """A failed RPC; ``status`` is a gRPC status name such as ``NOT_FOUND``."""

    def __init__(self, status: str, message: str) -> None:
        if status not in _CODES:
            raise ValueError(f"unknown status {status}")
        super().__init__(message)
        self.status = status
        self.message = message

    @property
    def grpc_code(self) -> int:
        return _CODES[self.status][0]

    @property
    def http_status(self) -> int:
        return _CODES[self.status][1]

    def http_body(self) -> dict[str, Any]:
        """The JSON body of an HTTP error response."""
        return {"error": {"code": self.http_status, "message": self.message, "status": self.status}}

    def rpc_status(self) -> dict[str, Any]:
        """The ``google.rpc.Status`` of a failed operation."""
        return {"code": self.grpc_code, "message": self.message, "details": []}


def not_found(what: str) -> ApiError:
    return ApiError("NOT_FOUND", f"{what} not found.")


def invalid(message: str) -> ApiError:
    return ApiError("INVALID_ARGUMENT", message)


def precondition(message: str) -> ApiError:
    return ApiError("FAILED_PRECONDITION", message)
