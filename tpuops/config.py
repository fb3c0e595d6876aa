"""Configuration: ``tpuops.toml`` + environment, validated once into ``Settings``.

Precedence is environment (``TPUOPS_<KEY>``, ``GOOGLE_CLOUD_PROJECT``) > the file > defaults;
a command's own flags (``up --zone``) override them for that command only. This module is the
only place that reads the environment for settings; the library below it receives a
``Settings`` object and never looks at ``os.environ``.
A bad value becomes one ``UsageError`` line naming the key, the value, where it came
from and what is allowed.

Config knows no provider: which node providers exist, and which zones and accelerators the configured one
offers, are the providers' rules (``ProviderRules``), handed in by the caller (``tpuops.api.load_settings`` hands
``tpuops.providers.registry.RULES``). Without them only what holds for any provider is checked (a zone's shape).

One notion of provider: ``node_provider`` says which provider makes the nodes, and its connection settings say
where its cloud is: ``tpu_endpoint`` is ``local`` (this machine: the emulator, started on demand), ``gcp``
(Google's endpoints) or an address (``Settings.cloud`` tells which of the two it is). The old key
``provider = "local"|"gcp"`` (and ``TPUOPS_PROVIDER``) is read here, and only here, as the ``tpu_endpoint`` it
names (``OLD_KEY``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from tpuops.core.errors import UsageError, excerpt
from tpuops.core.guards import Guard
from tpuops.core.kinds import Capacity, Cloud
from tpuops.core.naming import CLOUD_RUN_JOB, SERVICE_ACCOUNT, check_zone_name, rule_in_words
from tpuops.core.notices import NotifySettings, NotifyTarget, check_webhook_url

T = TypeVar("T")
CONFIG_FILE = "tpuops.toml"
WEEK_S = 7 * 86400
MAX_USD = 1_000_000
"""The largest price or budget accepted (USD): a typo's guard, far above any real TPU bill here."""
RECOVERY_S = 900.0
"""ASSUMED cost of one move or preemption (the ``recovery_s`` setting's default): a cron pass to notice it
(300 s), create -> READY (about 120 s), setup and restore (about 150-300 s) and the work since the last save."""


ENV_PREFIX = "TPUOPS_"


def default_home(environ: Mapping[str, str]) -> Path:
    """Where local state lives (ledger, emulator): ``TPUOPS_HOME`` or ``~/.tpuops``."""
    return Path(environ.get("TPUOPS_HOME") or Path.home() / ".tpuops")


class ProviderRules(Protocol):
    """The node providers' rules for the settings: each check returns the value or raises ``UsageError`` (one line)."""

    def names(self) -> list[str]:
        """The registered node providers (``node_provider``)."""
        ...

    def check_zone(self, provider: str, zone: str) -> str:
        """``zone`` if ``provider`` offers TPUs there."""
        ...

    def check_accelerator(self, provider: str, accelerator: str) -> str:
        """``accelerator`` if ``provider`` has that type."""
        ...


RULES_CONTEXT = "provider_rules"
"""The key of the validation context under which ``ProviderRules`` reach the validators."""


def _rules(info: ValidationInfo) -> tuple[ProviderRules, str] | None:
    """The providers' rules and the configured provider, when the caller handed rules in and the provider is known."""
    rules = (info.context or {}).get(RULES_CONTEXT)
    provider = info.data.get("node_provider")
    return None if rules is None or provider is None else (rules, provider)


def check_store(store: str) -> str:
    """``store`` if it can be a store root (``gs://BUCKET[/PREFIX]`` or a local directory), else ``UsageError``."""
    scheme, sep, rest = store.partition("://")
    if not sep:
        return store
    if scheme != "gs":
        raise UsageError(f"{scheme}:// is not a store (expected gs://BUCKET/PREFIX, or a local directory)")
    if not rest.split("/", 1)[0] or ".." in rest.split("/"):
        raise UsageError("expected gs://BUCKET/PREFIX with a bucket name and no '..' in the prefix")
    return store


def _checked(check: Callable[[T], object], value: T) -> T:
    """A check that raises ``UsageError`` run as a pydantic validator: its message, one home for the rule."""
    try:
        check(value)
    except UsageError as err:
        raise ValueError(str(err)) from None
    return value


class Settings(BaseModel):
    """Everything a command needs to know about where and how to run."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False, allow_inf_nan=False)

    node_provider: str = "cloud-tpu"
    """Which registered node provider makes the nodes (``tpuops.providers.registry``); checked before the zones
    and the accelerator, which are its rules."""
    project: str = "tpuops-local"
    zones: list[str] = Field(default_factory=lambda: ["us-central1-a", "us-central1-b"], min_length=1)
    store: str = ""
    accelerator: str = "v3-8"
    capacity: Capacity = Capacity.SPOT
    labels: dict[str, str] = Field(default_factory=dict)
    service_account: str | None = Field(default=None, pattern=SERVICE_ACCOUNT)
    """The account TPU VMs run as (infra/'s ``vm_service_account``); none: the project's default account."""
    wake_job: str | None = Field(default=None, pattern=CLOUD_RUN_JOB)
    """The reconcile Cloud Run job (infra/'s ``wake_job``: ``projects/P/locations/R/jobs/J``) that a preempted
    node's agent starts after its save, so that recovery starts at once (``tpuops.agent.wake``); none: the
    node only leaves its wake marker in the store, for ``watch`` and the scheduled reconcile."""
    tpu_endpoint: str = Cloud.LOCAL.value
    """Where the node provider's cloud is (its connection): ``local``, ``gcp`` or the address of its API
    (``cloud``, ``endpoint_url``)."""
    tf_python: str | None = None
    """The local TF 2.9 runtime's interpreter (default: see ``tpuops.tfenv``)."""
    home: Path = Path("~/.tpuops")
    # Durations: positive and at most a week (DAY_S * 7); counts and money: finite, in the ranges below.
    poll_interval_s: float = Field(default=5.0, gt=0, le=3600)
    operation_timeout_s: float = Field(default=1800.0, gt=0, le=WEEK_S)
    api_deadline_s: float = Field(default=120.0, gt=0, le=3600)
    max_run_hours: float = Field(default=72.0, ge=0, le=24 * 365)
    max_restarts: int = Field(default=3, ge=0, le=10_000, strict=True)
    hang_after_s: float = Field(default=1800.0, gt=0, le=WEEK_S)
    boot_timeout_s: float = Field(default=900.0, gt=0, le=WEEK_S)
    unhealthy_grace_s: float = Field(default=120.0, gt=0, le=WEEK_S)
    """How long a READY slice may keep an unhealthy worker before the controller recreates it."""
    stockout_backoff_s: float = Field(default=300.0, ge=0, le=WEEK_S)
    orphan_grace_s: float = Field(default=600.0, ge=0, le=WEEK_S)
    lease_ttl_s: float = Field(default=120.0, gt=0, le=WEEK_S)
    launch_give_up_s: float = Field(default=300.0, gt=0, le=WEEK_S)
    """How long ``train``, ``infer`` and ``sweep start`` keep passing while the Cloud TPU API fails every request
    and no node was asked for yet (a few ``api_deadline_s`` retry windows by default); then they give up, and what
    they declared is withdrawn, so that no later pass launches it behind the user's back."""
    prices: dict[str, dict[str, Annotated[float, Field(ge=0, le=MAX_USD)]]] = Field(default_factory=dict)
    budget_usd: float | None = Field(default=None, ge=0, le=MAX_USD)
    spot_preemptions_per_hour: float = Field(default=0.1, ge=0, le=3600)
    """ASSUMPTION, not a measurement: the preemption rate (per READY node-hour) that planning uses for
    spot and preemptible capacity where the ledger has no READY time yet (Google publishes none)."""
    lost_work_per_hour: float = Field(default=0.05, gt=0, le=3600)
    """ASSUMPTION: how often a run loses the work since its last save for lack of a notice save (crashes, hangs,
    notice saves that did not fit), per running hour: what ``checkpoint: {every: auto}`` weighs save costs against."""
    recovery_s: float = Field(default=RECOVERY_S, gt=0, le=WEEK_S)
    """ASSUMPTION: what one preemption or capacity move costs a run (a pass to notice it, create -> READY, setup,
    restore, the work since the last save); the deadline policy keeps room for it (``tpuops.billing.deadline``)."""
    notify: NotifySettings = Field(default_factory=NotifySettings)
    """``[notify]``: where messages go and what is worth one (docs/notifications.md); its secrets are read from
    the environment or a file by ``load_settings``, never written anywhere."""

    @field_validator("project")
    @classmethod
    def _project_id(cls, value: str) -> str:
        if not value or any(c.isspace() or c == "/" for c in value):
            raise ValueError("expected a GCP project id such as 'my-project-123'")
        return value

    @field_validator("zones")
    @classmethod
    def _zone_names(cls, value: list[str], info: ValidationInfo) -> list[str]:
        asked = _rules(info)
        if asked is None:
            return [_checked(check_zone_name, zone) for zone in value]
        rules, provider = asked
        return [_checked(lambda z: rules.check_zone(provider, z), zone) for zone in value]

    @field_validator("store")
    @classmethod
    def _store_root(cls, value: str) -> str:
        return _checked(check_store, value)

    @field_validator("accelerator")
    @classmethod
    def _accelerator_type(cls, value: str, info: ValidationInfo) -> str:
        asked = _rules(info)
        if asked is None:
            return value
        rules, provider = asked
        return _checked(lambda acc: rules.check_accelerator(provider, acc), value)

    @field_validator("labels")
    @classmethod
    def _user_labels(cls, value: dict[str, str]) -> dict[str, str]:
        from tpuops.core.naming import labels_for

        return _checked(lambda labels: labels_for(user=labels), value)

    @field_validator("node_provider")
    @classmethod
    def _registered_provider(cls, value: str, info: ValidationInfo) -> str:
        import difflib

        rules: ProviderRules | None = (info.context or {}).get(RULES_CONTEXT)
        if rules is None:
            return value
        names = rules.names()
        if value not in names:
            close = difflib.get_close_matches(value, names, n=1)
            hint = f"did you mean {close[0]!r}?" if close else "expected one of " + ", ".join(names)
            raise ValueError(f"not a registered node provider ({hint})")
        return value

    @field_validator("tpu_endpoint", mode="before")
    @classmethod
    def _endpoint(cls, value: object) -> object:
        if value is None or value == "":
            return Cloud.LOCAL.value
        if isinstance(value, Cloud):
            return value.value
        if not isinstance(value, str) or not (value in _CLOUDS or value.startswith(("http://", "https://"))):
            raise ValueError("expected a URL such as 'http://127.0.0.1:8470', or 'local' (the emulator here) "
                             "or 'gcp' (Google's endpoints)")
        return value

    @property
    def cloud(self) -> Cloud:
        """Where the node provider's cloud is (``cloud_of`` its ``tpu_endpoint``)."""
        return cloud_of(self.tpu_endpoint)

    @property
    def endpoint_url(self) -> str | None:
        """The address ``tpu_endpoint`` gives; None: the cloud's own (the emulator, started on demand, or Google's)."""
        return None if self.tpu_endpoint in _CLOUDS else self.tpu_endpoint

    @property
    def store_root(self) -> str:
        """The store URI; it defaults to a directory under ``home``."""
        return self.store or str(self.home / "store")

    @property
    def ledger_path(self) -> Path:
        return self.home / "ledger.sqlite"

    @property
    def emulator_dir(self) -> Path:
        return self.home / "emulator"


_CLOUDS = {cloud.value for cloud in Cloud}


def cloud_of(endpoint: str) -> Cloud:
    """Where a ``tpu_endpoint`` value says the cloud is: ``local`` or ``gcp`` by name; an address over ``http://`` is
    this machine's (only a stand-in such as the emulator serves plain HTTP: Google's endpoints are HTTPS), one over
    ``https://`` Google's kind."""
    if endpoint in _CLOUDS:
        return Cloud(endpoint)
    return Cloud.LOCAL if endpoint.startswith("http://") else Cloud.GCP


OLD_KEY = "provider"
"""The key of older ``tpuops.toml`` files (and ``TPUOPS_PROVIDER``): ``local`` or ``gcp``, read as ``tpu_endpoint``."""
_LIST_KEYS = {"zones"}
_MAP_KEYS = {"labels"}
_FILE_ONLY_KEYS = {"prices", "notify"}


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if environ.get("GOOGLE_CLOUD_PROJECT"):
        values["project"] = environ["GOOGLE_CLOUD_PROJECT"]
    for key in (OLD_KEY, *Settings.model_fields):
        if key in _FILE_ONLY_KEYS:
            continue
        raw = environ.get(ENV_PREFIX + key.upper())
        if raw is None or raw == "":
            continue
        if key in _LIST_KEYS:
            values[key] = [part.strip() for part in raw.split(",") if part.strip()]
        elif key in _MAP_KEYS:
            values[key] = parse_labels(raw, f"{ENV_PREFIX}{key.upper()}")
        elif key in Settings.model_fields and Settings.model_fields[key].annotation is int \
                and raw.strip().lstrip("+-").isdigit():
            values[key] = int(raw)  # the environment is text; strict integers refuse `true` in a file, not "1" here
        else:
            values[key] = raw
    return values


def parse_labels(raw: str, where: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"{where}: {item!r} is not KEY=VALUE (expected e.g. 'team=ml,owner=ana')")
        labels[key.strip()] = value.strip()
    return labels


def find_config_file(start: Path | None = None, environ: Mapping[str, str] | None = None) -> Path | None:
    """``TPUOPS_CONFIG``, else the nearest ``tpuops.toml`` in the working directory or a parent."""
    environ = os.environ if environ is None else environ
    if environ.get("TPUOPS_CONFIG"):
        return Path(environ["TPUOPS_CONFIG"])
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / CONFIG_FILE
        if candidate.is_file():
            return candidate
    return None


def _read_file(path: Path) -> dict[str, Any]:
    from tpuops.core.documents import read_toml

    try:
        missing = not path.exists()
    except OSError:  # a name too long, say: reading it says what is wrong
        missing = False
    if missing:
        raise UsageError(f"{path}: no such config file (run 'tpuops init' to write one)")
    return read_toml(path, "config")


def load_settings(*, config_path: Path | None = None, environ: Mapping[str, str] | None = None,
                  rules: ProviderRules | None = None, starts: bool = False) -> Settings:
    """Merge defaults, the config file (``config_path``, else the nearest one) and the environment; validate,
    against the providers' ``rules`` when given (``tpuops.api.load_settings`` gives them).

    A notify target whose URL is malformed is the one thing a command decides on (the one place it is decided):
    one that ``starts`` new spending or exists to use a target (``train``, ``infer``, ``up``, ``sweep start``,
    ``notify test``) refuses it (``UsageError``, one line); any other (``watch``, ``reconcile``, ``stop``,
    ``down``, ``status``...) loads it held back (``NotifyTarget.held``, said by ``held_back_lines``) and goes on:
    nothing a notification target holds may stop a controller pass or the end of a run.
    """
    environ = os.environ if environ is None else environ
    path = config_path or find_config_file(environ=environ)
    layers: list[tuple[str, dict[str, Any]]] = [("default", {"home": str(default_home(environ))})]
    if path is not None:
        layers.append((str(path), _read_file(path)))
    layers.append(("environment", _from_env(environ)))
    merged: dict[str, Any] = {}
    source: dict[str, str] = {}
    for origin, values in layers:
        for key, value in _read_old_keys(values, origin, merged.get("tpu_endpoint")).items():
            merged[key] = value
            source[key] = origin
    try:
        settings = Settings.model_validate(merged, context={RULES_CONTEXT: rules})
    except ValidationError as err:
        raise UsageError(_one_line(err, merged, source)) from None
    loaded = _with_secrets(_finish(settings), environ)
    held = loaded.notify.held_back()
    if starts and held:
        raise UsageError(next(iter(held.values())))
    return loaded


def _read_old_keys(values: Mapping[str, Any], origin: str, below: object = None) -> dict[str, Any]:
    """One layer's values in the current shape: ``provider = "local"|"gcp"`` is the ``tpu_endpoint`` it names, unless
    the same layer gives an address there, or the layers ``below`` it gave an address at the cloud it names (as
    ``TPUOPS_PROVIDER=gcp`` over a file's ``https://`` endpoint, which stays that endpoint).

    Read per layer, so that the environment's old key still overrides the file's new one, and the reverse."""
    if OLD_KEY not in values:
        return dict(values)
    current = {key: value for key, value in values.items() if key != OLD_KEY}
    old = values[OLD_KEY]
    word = old.value if isinstance(old, Cloud) else old
    if not isinstance(word, str) or word not in _CLOUDS:
        raise UsageError(f"{origin}: provider = {excerpt(word)} is not allowed: expected 'local' or 'gcp' "
                         "(or, as tpuops.toml now says it, tpu_endpoint = 'local', 'gcp' or a URL)")
    kept = isinstance(below, str) and "://" in below and cloud_of(below).value == word
    if not current.get("tpu_endpoint") and not kept:
        current["tpu_endpoint"] = word
    return current


URL_CHECKED_AT_LOAD = Guard("notify.url_checked_at_load", "a webhook URL the HTTP client would refuse (in the file or "
                            "in a url_env variable) is found when the config is read: its target is held back (never "
                            "sent to) and a command that starts work refuses it in one line (issue 38's second defect)")


def _with_secrets(settings: Settings, environ: Mapping[str, str]) -> Settings:
    """Read each notify target's secret (``url_env``, ``password_env``, ``password_file``) into the settings.

    One missing is not an error here (a command that sends nothing needs none): the target says why when it
    is used (``tpuops notify test``, a delivery). A malformed URL (``_malformed``) holds its target back: what
    the command does about it is ``load_settings``'s decision.
    """
    if not settings.notify.targets:
        return settings
    targets = {}
    for name, target in settings.notify.targets.items():
        url = password = missing = None
        if target.url_env:
            url = environ.get(target.url_env) or None
            missing = None if url else f"the environment variable {target.url_env} (url_env) is not set"
        if target.password_env:
            password = environ.get(target.password_env) or None
            missing = None if password else f"the environment variable {target.password_env} (password_env) is not set"
        elif target.password_file:
            try:
                password = Path(target.password_file).expanduser().read_text().strip()
            except OSError as err:
                missing = f"password_file {target.password_file}: {err.strerror or err}"
        targets[name] = target.resolved(url, password, missing, held=_malformed(name, target, url))
    return settings.model_copy(update={"notify": settings.notify.model_copy(update={"targets": targets})})


def _malformed(name: str, target: NotifyTarget, url: str | None) -> str | None:
    """Why the target's webhook URL (``url``, read from its ``url_env``, else the file's) cannot be sent to, in
    one line naming the target and where the URL comes from, never the URL (a secret); None when it can."""
    value = url if url is not None else target.url.get_secret_value() if target.url is not None else None
    if value is None or not URL_CHECKED_AT_LOAD.on:
        return None
    try:
        check_webhook_url(value)
    except ValueError as err:
        if url is None:
            return f"notify.targets.{name}.url: {err}"
        return f"notify.targets.{name}: the environment variable {target.url_env} (url_env): {err}"
    return None


def held_back_lines(settings: Settings) -> list[str]:
    """What a command that goes on without them says of the targets held back, one line each (never a secret)."""
    return [f"{why}; held back: its messages wait, unsent, until the URL is fixed"
            for why in settings.notify.held_back().values()]


def _finish(settings: Settings) -> Settings:
    home = settings.home.expanduser()
    updates: dict[str, Any] = {"home": home}
    if settings.cloud is Cloud.GCP:
        if settings.project == "tpuops-local":
            raise UsageError("provider 'gcp' needs a project: pass --project to init, or set project in "
                             "tpuops.toml or GOOGLE_CLOUD_PROJECT")
        if not settings.store.startswith("gs://"):
            raise UsageError(f"store: {settings.store!r} is not allowed with provider 'gcp' "
                             "(expected a bucket URI such as 'gs://my-bucket/tpuops')")
    if settings.cloud is Cloud.LOCAL and "poll_interval_s" not in settings.model_fields_set:
        updates["poll_interval_s"] = 0.2
    return settings.model_copy(update=updates)


_FLAGS = {"zones": "--zone", "labels": "--label"}


def _one_line(err: ValidationError, merged: Mapping[str, Any], source: Mapping[str, str]) -> str:
    """The first problem, naming the key as the user wrote it: a flag of ``init``, or a key of its source."""
    import difflib

    first = err.errors()[0]
    loc = first.get("loc") or ("config",)
    key = str(loc[0])
    origin = source.get(key, "config")
    if key == "notify":  # it may hold a webhook URL: name where, never echo the value
        where = ".".join(str(part) for part in loc)
        return f"{origin}: {where}: {first.get('msg', 'invalid value').removeprefix('Value error, ')}"
    if first.get("type") == "extra_forbidden":
        close = difflib.get_close_matches(key, [*Settings.model_fields, OLD_KEY], n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"allowed keys: {', '.join(Settings.model_fields)}"
        return f"{origin}: unknown key {excerpt(key)} ({hint})"
    value = merged.get(key, first.get("input"))
    message = first.get("msg", "invalid value").removeprefix("Value error, ")
    if first.get("type") == "string_pattern_mismatch":
        message = rule_in_words(str(first.get("ctx", {}).get("pattern", "")))
    if first.get("type") == "enum":
        allowed = first.get("ctx", {}).get("expected", "")
        close = difflib.get_close_matches(str(value), [v.strip("' ") for v in allowed.replace(" or ", ",").split(",")],
                                          n=1)
        message = f"expected {allowed}" + (f" (did you mean {close[0]!r}?)" if close else "")
    if origin == "flag":
        return f"{_FLAGS.get(key, '--' + key.replace('_', '-'))} = {excerpt(value)} is not allowed: {message}"
    return f"{origin}: {key} = {excerpt(value)} is not allowed: {message}"


def render_toml(values: Mapping[str, Any]) -> str:
    """Write the flat subset of TOML that ``tpuops.toml`` uses (strings, numbers, lists, one table)."""
    lines: list[str] = []
    tables: list[tuple[str, Mapping[str, Any]]] = []
    for key, value in values.items():
        if isinstance(value, Mapping):
            tables.append((key, value))
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    for name, table in tables:
        lines.append("")
        lines.append(f"[{name}]")
        lines.extend(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in table.items())
    return "\n".join(lines) + "\n"


def _toml_key(key: str) -> str:
    bare = key.replace("-", "").replace("_", "").isalnum()
    return key if bare else _toml_value(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def write_config(path: Path, values: Mapping[str, Any], *, force: bool = False,
                 rules: ProviderRules | None = None) -> Settings:
    """Validate ``values`` as a config file (against the providers' ``rules`` when given) and write it atomically;
    refuse to overwrite unless ``force``.

    Everything is checked before the first byte is written (the values, the rules a command
    applies on load, the target's folder), so a refused config leaves no file behind.
    """
    try:
        is_dir, exists, folder = path.is_dir(), path.exists(), path.parent.is_dir()
    except OSError as err:
        raise UsageError(f"--path {excerpt(str(path))}: {err.strerror or err}") from None
    if is_dir:
        raise UsageError(f"--path {path}: is a directory (give a file path such as {path / CONFIG_FILE})")
    if exists and not force:
        raise UsageError(f"{path} exists already (pass --force to overwrite it)")
    if not folder:
        raise UsageError(f"--path {path}: no folder {path.parent} (create it first, or write elsewhere)")
    clean = _read_old_keys({k: v.value if isinstance(v, Enum) else v for k, v in values.items() if v is not None},
                           "flag")
    try:
        settings = _finish(Settings.model_validate(clean, context={RULES_CONTEXT: rules}))
    except ValidationError as err:
        raise UsageError(_one_line(err, clean, dict.fromkeys(clean, "flag"))) from None
    _write_atomically(path, render_toml(clean))
    return settings


def _write_atomically(path: Path, text: str) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"{path}: cannot write it: {err.strerror or err}") from None
    return path
