"""Who may call the emulator: its owner's bearer token, or a node's own service account.

The emulator runs startup scripts as its owner, so an open port would let any local process
(another user of a shared machine or CI runner) run code as that user. Unless it was started
with ``--no-auth`` (for third-party clients such as gcloud), every API and admin request must
carry ``Authorization: Bearer <token>``:

- the owner's token (``control`` writes it to a 0600 file in the state directory, under
  ``$TPUOPS_HOME``) may do anything;
- a node's service-account token (what the node's metadata server hands its processes) may
  only get or delete that node and read operations of its project: the custom role that
  ``infra/`` gives the VMs' service account;
- anything else is 401 UNAUTHENTICATED (no or unknown token) or 403 PERMISSION_DENIED (a
  node token outside its scope).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping

from tpuops.emulator.apierror import ApiError
from tpuops.emulator.cloud.nodes import Node

UNAUTHENTICATED_MESSAGE = (
    "Request is missing a valid bearer token. This tpuops emulator requires the token that "
    "'tpuops emulator start' wrote to {token_file} (send 'Authorization: Bearer <token>'); "
    "start it with --no-auth to serve third-party clients without one."
)
_NODE_RPCS = frozenset({"GetNode", "DeleteNode"})


class Authenticator:
    """Check one request's credentials; ``token`` None means the emulator runs with --no-auth."""

    def __init__(self, token: str | None, token_file: str, node_for_token: Callable[[str], Node | None]) -> None:
        self._token = token
        self._token_file = token_file
        self._node_for_token = node_for_token

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def check(self, headers: Mapping[str, str], rpc: str | None, params: Mapping[str, str]) -> ApiError | None:
        """None if the request may proceed, else the error to answer with.

        ``rpc`` is the API method the request names (None for admin and unknown paths).
        """
        if self._token is None:
            return None
        presented = _bearer(headers.get("Authorization") or "")
        if presented and hmac.compare_digest(presented.encode(), self._token.encode()):
            return None
        node = self._node_for_token(presented) if presented else None
        if node is None:
            return ApiError("UNAUTHENTICATED", UNAUTHENTICATED_MESSAGE.format(token_file=self._token_file))
        if _in_scope(node, rpc, params):
            return None
        return ApiError(
            "PERMISSION_DENIED",
            f"The service account of node {node.name} may only get or delete that node and read its "
            f"project's operations; {rpc or 'this request'} is outside its role.",
        )


    def storage_caller(self, authorization: str) -> bool:
        """Whether a Cloud Storage request with this ``Authorization`` header may proceed (``gcs.front``).

        The owner's token, or a node's service-account token (the VM's account reads and writes
        the store, as ``infra/`` grants it); anyone when the emulator runs with --no-auth.
        """
        if self._token is None:
            return True
        presented = _bearer(authorization)
        if not presented:
            return False
        return hmac.compare_digest(presented.encode(), self._token.encode()) or \
            self._node_for_token(presented) is not None


def _bearer(header: str) -> str:
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def _in_scope(node: Node, rpc: str | None, params: Mapping[str, str]) -> bool:
    if params.get("project") != node.project:
        return False
    if rpc == "GetOperation":
        return True
    return rpc in _NODE_RPCS and params.get("zone") == node.zone and params.get("node") == node.node_id
