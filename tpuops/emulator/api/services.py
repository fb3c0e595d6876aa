"""The project-level Google APIs ``tpuops doctor`` asks about, as the emulator stands in for them.

Under provider local there is no Service Usage, IAM or Resource Manager to ask, so the
emulator answers the three calls doctor makes, in their real shapes (all under ``/v1``):

- ``GET projects/{p}`` (cloudresourcemanager): the project, ACTIVE;
- ``GET projects/{p}/services/{service}`` (serviceusage): ``{name, state: ENABLED|DISABLED}``;
- ``POST projects/{p}:testIamPermissions`` (cloudresourcemanager): the subset granted;
- ``GET projects/{p}/serviceAccounts/{email}`` (iam): the account, or NOT_FOUND.

Everything is enabled, granted and present unless the faults say otherwise
(``disabled_services``, ``denied_permissions``, ``missing_service_accounts``), so a test can
make any doctor check fail for real.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpuops.emulator.apierror import invalid, not_found
from tpuops.emulator.cloud.catalog import project_number

if TYPE_CHECKING:
    from tpuops.emulator.cloud.wire import Request
    from tpuops.emulator.faults import Faults


class ProjectServices:
    """Answers for serviceusage, resource manager and IAM, shaped by the faults in force."""

    def __init__(self, faults: Faults) -> None:
        self._faults = faults

    def get_project(self, req: Request) -> dict[str, Any]:
        project = req.params["project"]
        return {"projectId": project, "projectNumber": project_number(project), "lifecycleState": "ACTIVE",
                "name": project}

    def get_service(self, req: Request) -> dict[str, Any]:
        project, service = req.params["project"], req.params["service"]
        disabled = service in self._faults.snapshot()["disabled_services"]
        return {
            "name": f"projects/{project_number(project)}/services/{service}",
            "parent": f"projects/{project_number(project)}",
            "state": "DISABLED" if disabled else "ENABLED",
        }

    def test_permissions(self, req: Request) -> dict[str, Any]:
        permissions = (req.body or {}).get("permissions") if isinstance(req.body, dict) else None
        if not isinstance(permissions, list) or not all(isinstance(p, str) for p in permissions):
            raise invalid("Invalid JSON payload received: permissions must be a list of strings.")
        denied = set(self._faults.snapshot()["denied_permissions"])
        granted = [p for p in permissions if p not in denied]
        return {"permissions": granted} if granted else {}

    def get_service_account(self, req: Request) -> dict[str, Any]:
        project, email = req.params["project"], req.params["account"]
        if email in self._faults.snapshot()["missing_service_accounts"] or "@" not in email:
            raise not_found(f"Service account projects/{project}/serviceAccounts/{email}")
        return {
            "name": f"projects/{project}/serviceAccounts/{email}",
            "projectId": project,
            "uniqueId": str(int(project_number(project)) * 7),
            "email": email,
        }
