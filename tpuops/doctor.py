"""``tpuops doctor``: is this machine and project ready to run tpuops? One line per check, with the fix.

Each check returns a ``Check`` (OK, WARN or FAIL, what was found, and for WARN/FAIL the fix).
The same checks run against real Google Cloud (a ``gcp`` cloud, ``Settings.cloud``: ADC, Service Usage, Resource
Manager, IAM, Cloud Storage, the Cloud TPU API) and against the local stand-ins (a ``local``
cloud: the emulator answers the serviceusage / testIamPermissions / service-account calls,
fake-gcs-server or a local directory is the store). Nothing is created or started: doctor
never starts the emulator, it reports whether it is reachable. Independent checks run in
parallel so the whole report takes about one round trip per API.

Invariants: a check never raises (an unexpected error becomes its FAIL line); ``exit_code``
is 1 when any check FAILed.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

from tpuops.config import Settings
from tpuops.core.errors import TpuopsError
from tpuops.core.kinds import Cloud
from tpuops.core.resources import TF_VERSION_PREFIX
from tpuops.providers.registry import offers_of

OK, WARN, FAIL = "OK", "WARN", "FAIL"

TPU_PERMISSIONS = (
    "tpu.nodes.create", "tpu.nodes.delete", "tpu.nodes.get", "tpu.nodes.list", "tpu.nodes.start",
    "tpu.nodes.stop", "tpu.operations.get", "tpu.queuedResources.create", "tpu.queuedResources.delete",
    "tpu.queuedResources.get", "tpu.queuedResources.list", "iam.serviceAccounts.actAs",
)
"""Exactly the project permissions tpuops' calls need (nodes, operations, queued resources, the VM account)."""

STORE_PERMISSIONS = ("storage.objects.create", "storage.objects.delete", "storage.objects.get",
                     "storage.objects.list", "storage.buckets.get")
"""Exactly the bucket permissions the store needs."""

REQUIRED_APIS = ("tpu.googleapis.com", "storage.googleapis.com")
GOOGLE_APIS = {"serviceusage": "https://serviceusage.googleapis.com",
               "cloudresourcemanager": "https://cloudresourcemanager.googleapis.com",
               "iam": "https://iam.googleapis.com", "tpu": "https://tpu.googleapis.com"}
SKEW_WARN_S, SKEW_FAIL_S = 30.0, 300.0
_HTTP_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""


def vm_service_account(settings: Settings) -> str:
    """The account the TPU VMs run as: the one ``infra/`` creates."""
    return f"tpuops-vm@{settings.project}.iam.gserviceaccount.com"


class _Apis:
    """HTTP access to the Google APIs doctor asks, or to the emulator standing in for them."""

    def __init__(self, settings: Settings) -> None:
        import requests

        self.settings = settings
        self.local = settings.cloud is Cloud.LOCAL
        self.emulator = self._find_emulator()
        self.session: Any = requests.Session()
        self.credentials_error: str | None = None
        self.account = ""
        if self.local:
            token = self.emulator.token if self.emulator else None
            if token:
                self.session.headers["Authorization"] = f"Bearer {token}"
        else:
            self._adc()

    def _find_emulator(self) -> Any:
        if not self.local:
            return None
        from tpuops.emulator import EmulatorInfo, status, token_for

        url = self.settings.endpoint_url
        if url:
            return EmulatorInfo(url, 0, self.settings.emulator_dir, token_for(url))
        return status(self.settings.emulator_dir)

    def _adc(self) -> None:
        try:
            import google.auth
            from google.auth.transport.requests import AuthorizedSession

            credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
            self.session = AuthorizedSession(credentials)
            self.account = (getattr(credentials, "service_account_email", None)
                            or getattr(credentials, "account", None) or "an account gcloud knows")
        except Exception as err:
            self.credentials_error = str(err).splitlines()[0]

    def base(self, api: str) -> str | None:
        """Where ``api`` is served: Google, or the emulator (None when it is not running)."""
        if not self.local:
            url = self.settings.endpoint_url
            return url if api == "tpu" and url else GOOGLE_APIS[api]
        return self.emulator.endpoint.rstrip("/") if self.emulator else None

    def call(self, api: str, method: str, path: str, body: Any = None) -> tuple[int, Any, Any]:
        """(HTTP status, JSON body, response). Raises ``_Unreachable`` when there is no server."""
        base = self.base(api)
        if base is None or self.credentials_error:
            raise _Unreachable(api)
        import requests

        try:
            response = self.session.request(method, f"{base}/{path}", json=body, timeout=_HTTP_TIMEOUT_S)
        except requests.RequestException as err:
            raise _Unreachable(api, str(err)) from err
        try:
            payload = response.json()
        except ValueError:
            payload = {}
        return response.status_code, payload, response


class _Unreachable(Exception):
    def __init__(self, api: str, reason: str = "") -> None:
        super().__init__(api)
        self.api = api
        self.reason = reason


def _error_message(payload: Any) -> str:
    return (payload or {}).get("error", {}).get("message", "") if isinstance(payload, dict) else ""


# ----- the checks ---------------------------------------------------------------------------

def check_credentials(apis: _Apis) -> Check:
    if apis.local:
        token_file = apis.settings.emulator_dir / "token"
        if apis.emulator is None:
            return Check("credentials", FAIL, "the local emulator is not running, so there is no token to use",
                         "tpuops emulator start")
        if apis.emulator.token is None:
            return Check("credentials", WARN, f"the emulator at {apis.emulator.endpoint} runs without auth: any "
                         "local process may create nodes that run code as you",
                         "tpuops emulator stop && tpuops emulator start (without --no-auth)")
        mode = stat.S_IMODE(token_file.stat().st_mode) if token_file.exists() else None
        if mode is not None and mode & 0o077:
            return Check("credentials", FAIL, f"{token_file} is readable by others ({oct(mode)})",
                         f"chmod 600 {token_file}")
        return Check("credentials", OK, f"emulator bearer token in {token_file} (mode 0600)")
    if apis.credentials_error:
        return Check("credentials", FAIL, f"no Application Default Credentials: {apis.credentials_error}",
                     "gcloud auth application-default login")
    return Check("credentials", OK, f"Application Default Credentials for {apis.account}")


def check_project(apis: _Apis) -> Check:
    project = apis.settings.project
    code, payload, _ = apis.call("cloudresourcemanager", "GET", f"v1/projects/{project}")
    if code != 200:
        return Check("project", FAIL, f"project {project} cannot be read ({code}): {_error_message(payload)}",
                     "tpuops init --project MY-PROJECT (a project you can use)")
    where = "on the emulator" if apis.local else "on Google Cloud"
    return Check("project", OK, f"{project} (number {payload.get('projectNumber', '?')}, {where})")


def check_apis(apis: _Apis) -> Check:
    project = apis.settings.project
    disabled = []
    for service in REQUIRED_APIS:
        code, payload, _ = apis.call("serviceusage", "GET", f"v1/projects/{project}/services/{service}")
        if code != 200:
            return Check("apis", FAIL, f"cannot read whether {service} is enabled ({code}): {_error_message(payload)}",
                         "grant serviceusage.services.get, or check the project id")
        if payload.get("state") != "ENABLED":
            disabled.append(service)
    if disabled:
        return Check("apis", FAIL, f"not enabled: {', '.join(disabled)}",
                     f"gcloud services enable {' '.join(disabled)} --project {project}")
    return Check("apis", OK, "Cloud TPU and Cloud Storage APIs enabled")


def check_permissions(apis: _Apis) -> Check:
    project = apis.settings.project
    code, payload, _ = apis.call("cloudresourcemanager", "POST", f"v1/projects/{project}:testIamPermissions",
                                 {"permissions": list(TPU_PERMISSIONS)})
    if code != 200:
        return Check("permissions", FAIL, f"testIamPermissions failed ({code}): {_error_message(payload)}",
                     "check the project id and that you may use it")
    missing = sorted(set(TPU_PERMISSIONS) - set(payload.get("permissions", [])))
    if missing:
        return Check("permissions", FAIL, f"missing on project {project}: {', '.join(missing)}",
                     "grant the role in infra/README.md (laptop user) to your account")
    return Check("permissions", OK, f"all {len(TPU_PERMISSIONS)} Cloud TPU permissions tpuops uses")


def check_service_account(apis: _Apis) -> Check:
    email = vm_service_account(apis.settings)
    code, payload, _ = apis.call("iam", "GET", f"v1/projects/{apis.settings.project}/serviceAccounts/{email}")
    if code == 404:
        return Check("vm-service-account", FAIL, f"{email} does not exist",
                     "terraform apply in infra/ (it creates the account and its custom role)")
    if code != 200:
        return Check("vm-service-account", FAIL, f"cannot read {email} ({code}): {_error_message(payload)}",
                     "grant iam.serviceAccounts.get, or apply infra/")
    return Check("vm-service-account", OK, f"{email} exists")


def _zone_lists(apis: _Apis, zone: str, what: str, field: str, key: str) -> list[str]:
    code, payload, _ = apis.call("tpu", "GET",
                                 f"v2/projects/{apis.settings.project}/locations/{zone}/{what}?pageSize=1000")
    if code != 200:
        raise TpuopsError(f"{what} in {zone}: HTTP {code} {_error_message(payload)}")
    return [item.get(key, "") for item in payload.get(field, [])]


def check_accelerator(apis: _Apis) -> Check:
    accelerator = apis.settings.accelerator
    lacking = [zone for zone in apis.settings.zones
               if accelerator not in _zone_lists(apis, zone, "acceleratorTypes", "acceleratorTypes", "type")]
    if lacking:
        offering = offers_of(apis.settings.node_provider).zones_offering(accelerator)
        return Check("accelerator", FAIL, f"{accelerator} is not offered in {', '.join(lacking)}",
                     f"use zones that offer it ({', '.join(offering) or 'none'}) or another accelerator")
    return Check("accelerator", OK, f"{accelerator} offered in {', '.join(apis.settings.zones)}")


def check_runtime(apis: _Apis) -> Check:
    try:
        offers = offers_of(apis.settings.node_provider)
        runtime = offers.runtime_version(offers.shape(apis.settings.accelerator))
    except TpuopsError as err:
        return Check("tf-runtime", FAIL, str(err), "use a v2, v3 or v4 accelerator")
    lacking = [zone for zone in apis.settings.zones
               if runtime not in _zone_lists(apis, zone, "runtimeVersions", "runtimeVersions", "version")]
    if lacking:
        return Check("tf-runtime", FAIL, f"{runtime} is not available in {', '.join(lacking)}",
                     "use zones that list it (gcloud compute tpus tpu-vm versions list --zone Z)")
    return Check("tf-runtime", OK, f"{runtime} available in every zone")


def check_clock(apis: _Apis) -> Check:
    sent = time.time()
    _, _, response = apis.call("tpu", "GET", f"v2/projects/{apis.settings.project}/locations/{apis.settings.zones[0]}")
    date = response.headers.get("Date")
    if not date:
        return Check("clock", WARN, "the API answered without a Date header; skew unknown", "check NTP (timedatectl)")
    skew = parsedate_to_datetime(date).timestamp() - (sent + time.time()) / 2
    detail = f"skew {skew:+.1f} s against the Cloud TPU API"
    if abs(skew) >= SKEW_FAIL_S:
        return Check("clock", FAIL, detail, "sync the clock (timedatectl set-ntp true): tokens and leases need it")
    if abs(skew) >= SKEW_WARN_S:
        return Check("clock", WARN, detail, "sync the clock (timedatectl set-ntp true)")
    return Check("clock", OK, detail)


def check_emulator(apis: _Apis) -> Check:
    if not apis.local:
        return Check("emulator", OK, "not used (provider gcp)")
    if apis.emulator is None:
        return Check("emulator", FAIL, f"no emulator runs for {apis.settings.emulator_dir}", "tpuops emulator start")
    from tpuops.emulator import AdminClient

    try:
        health = AdminClient(apis.emulator.endpoint, timeout_s=_HTTP_TIMEOUT_S, token=apis.emulator.token).health()
    except TpuopsError as err:
        return Check("emulator", FAIL, f"the emulator at {apis.emulator.endpoint} does not answer: {err}",
                     "tpuops emulator stop && tpuops emulator start")
    return Check("emulator", OK, f"{apis.emulator.endpoint} (pid {health['pid']}, {health['nodes']} nodes)")


def check_data_plane(apis: _Apis) -> Check:
    from tpuops.tfenv.locate import find, home_runtime, tensorflow_version

    status = FAIL if apis.local else WARN
    found = find(apis.settings)
    if found is None:
        where = apis.settings.tf_python or home_runtime(apis.settings)
        return Check("data-plane", status, f"no TF {TF_VERSION_PREFIX} runtime found ({where})",
                     "tpuops runtime install, or set tf_python in tpuops.toml")
    version = tensorflow_version(found.python)
    if not version or not version.startswith(TF_VERSION_PREFIX + "."):
        what = f"TensorFlow {version}" if version else "no TensorFlow"
        return Check("data-plane", status, f"{found.python} has {what}, not {TF_VERSION_PREFIX}",
                     "tpuops runtime install --force, or point tf_python at a TF 2.9 venv")
    return Check("data-plane", OK, f"TensorFlow {version} in {found.python} ({found.source})")


def check_store(apis: _Apis) -> list[Check]:
    """The store: a local directory (writable), or a bucket (exists, region of the zones, permissions)."""
    root = apis.settings.store_root
    if not root.startswith("gs://"):
        path = Path(root).expanduser()
        parent = next((p for p in (path, *path.parents) if p.exists()), None)
        if parent is None or not os.access(parent, os.W_OK):
            return [Check("store", FAIL, f"{path} cannot be created or written", f"mkdir -p {path}")]
        return [Check("store", OK, f"local directory {path}")]
    from tpuops.store import gcs_client, split_gcs_uri

    bucket_name, _ = split_gcs_uri(root)
    if apis.local and _emulator_serves_storage(apis):
        return [_node_storage(apis, bucket_name)]
    try:
        client = gcs_client(project=apis.settings.project)
        bucket = client.lookup_bucket(bucket_name, timeout=_HTTP_TIMEOUT_S)
    except Exception as err:
        return [Check("store", FAIL, f"cannot reach gs://{bucket_name}: {str(err).splitlines()[0]}",
                      "check Cloud Storage access (and STORAGE_EMULATOR_HOST for fake-gcs-server)")]
    if bucket is None:
        return [Check("store", FAIL, f"bucket gs://{bucket_name} does not exist",
                      "terraform apply in infra/ (or gcloud storage buckets create)")]
    return [_bucket_region(apis, bucket), _bucket_permissions(bucket), _vm_store_access(apis, bucket)]


def _emulator_serves_storage(apis: _Apis) -> bool:
    from tpuops.emulator import storage_front

    return storage_front(apis.settings.emulator_dir) is not None


def _node_storage(apis: _Apis, bucket: str) -> Check:
    """Provider local with a gs:// store: the path an emulated node takes to the bucket, end to end."""
    from tpuops.emulator import storage_problem, unavailable_reason

    token = apis.emulator.token if apis.emulator else None
    problem = unavailable_reason() or storage_problem(apis.settings.emulator_dir, bucket, token)
    if problem:
        return Check("store", FAIL, problem, "run as root, then tpuops emulator stop && tpuops emulator start")
    return Check("store", OK, f"gs://{bucket} served by fake-gcs-server; nodes reach it as "
                 "https://storage.googleapis.com with the emulator's CA")


def _bucket_region(apis: _Apis, bucket: Any) -> Check:
    location = (bucket.location or "").lower()
    regions = sorted({zone.rsplit("-", 1)[0] for zone in apis.settings.zones})
    far = [region for region in regions if not (location == region or region.startswith(location + "-")
                                                or (location in ("us", "eu", "asia") and region.startswith(location)))]
    if far:
        return Check("store-region", FAIL,
                     f"gs://{bucket.name} is in {location or 'an unknown location'}, the zones in {', '.join(far)}: "
                     "TPU VMs would read data across regions (slow, billed as egress)",
                     f"create the store bucket in {far[0]} (infra/: -var region={far[0]})")
    return Check("store-region", OK, f"gs://{bucket.name} in {location}, with the zones")


def _bucket_permissions(bucket: Any) -> Check:
    try:
        granted = set(bucket.test_iam_permissions(list(STORE_PERMISSIONS), timeout=_HTTP_TIMEOUT_S))
    except Exception as err:
        return Check("store-permissions", WARN, f"testIamPermissions on gs://{bucket.name} is not answered here "
                     f"({str(err).splitlines()[0][:80]}); it only applies on GCP", "")
    missing = sorted(set(STORE_PERMISSIONS) - granted)
    if missing:
        return Check("store-permissions", FAIL, f"missing on gs://{bucket.name}: {', '.join(missing)}",
                     "grant roles/storage.objectAdmin on the bucket to your account")
    return Check("store-permissions", OK, f"all {len(STORE_PERMISSIONS)} storage permissions on gs://{bucket.name}")


_WRITER_ROLES = ("roles/storage.objectAdmin", "roles/storage.objectUser", "roles/storage.objectCreator",
                 "roles/storage.admin")


def _vm_store_access(apis: _Apis, bucket: Any) -> Check:
    """Whether the VM account holds a role on the bucket that lets it write objects."""
    member = f"serviceAccount:{vm_service_account(apis.settings)}"
    try:
        policy = bucket.get_iam_policy(requested_policy_version=3, timeout=_HTTP_TIMEOUT_S)
    except Exception as err:
        return Check("vm-store-access", WARN, f"the IAM policy of gs://{bucket.name} is not answered here "
                     f"({str(err).splitlines()[0][:80]}); it only applies on GCP", "")
    roles = [b["role"] for b in policy.bindings if member in b.get("members", ())]
    if any(role in _WRITER_ROLES or role.endswith("/tpuopsVmObjects") for role in roles):
        return Check("vm-store-access", OK, f"{member.split(':', 1)[1]} may write gs://{bucket.name}")
    return Check("vm-store-access", FAIL, f"{member.split(':', 1)[1]} has no role that writes gs://{bucket.name}",
                 "terraform apply in infra/ (grants tpuopsVmObjects on the store prefix)")


_API_CHECKS: tuple[tuple[str, Callable[[_Apis], Check]], ...] = (
    ("project", check_project),
    ("apis", check_apis),
    ("permissions", check_permissions),
    ("vm-service-account", check_service_account),
    ("accelerator", check_accelerator),
    ("tf-runtime", check_runtime),
    ("clock", check_clock),
)


def _guarded(name: str, check: Callable[[_Apis], Any], apis: _Apis) -> list[Check]:
    try:
        result = check(apis)
    except _Unreachable as err:
        where = "the emulator is not running" if apis.local else ((apis.credentials_error and "no credentials")
                                                                  or f"{err.api} unreachable: {err.reason}")
        return [Check(name, WARN, f"not checked: {where}", "fix the checks above first")]
    except Exception as err:
        return [Check(name, FAIL, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
                      "see the message")]
    return result if isinstance(result, list) else [result]


def run_checks(settings: Settings, *, parallel: bool = True) -> list[Check]:
    """Every check, in a fixed order; API round trips run in parallel (``parallel=False``: one by one)."""
    apis = _Apis(settings)
    plan: list[tuple[str, Callable[[_Apis], Any]]] = [
        ("credentials", check_credentials), *_API_CHECKS,
        ("store", check_store), ("emulator", check_emulator), ("data-plane", check_data_plane),
    ]
    with ThreadPoolExecutor(max_workers=len(plan) if parallel else 1) as pool:
        results = list(pool.map(lambda item: _guarded(item[0], item[1], apis), plan))
    return [check for group in results for check in group]


def exit_code(checks: list[Check]) -> int:
    return 1 if any(check.status == FAIL for check in checks) else 0


def to_json(checks: list[Check]) -> str:
    return json.dumps({"ok": exit_code(checks) == 0, "checks": [asdict(check) for check in checks]}, indent=2)


@dataclass(frozen=True)
class Checkup:
    """What ``tpuops doctor`` found: every check in order, the exit code and the JSON form."""

    checks: list[Check]

    @property
    def exit_code(self) -> int:
        return exit_code(self.checks)

    def to_json(self) -> str:
        return to_json(self.checks)
