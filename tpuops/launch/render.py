"""Render the TPU VM startup script (``templates/startup.sh.j2``) from typed values.

Invariant: every value reaches the script through the ``q`` filter (``shlex.quote``), so no
node name, label, path or job argument can be read by bash as code, whatever it contains.
Values are never interpolated into comments: a quoted value with a newline would end the
comment. ``q`` refuses ``None`` and NUL so that a missing value is a loud bug, not the word
"None" or a silently truncated argument on the VM; ``StrictUndefined`` does the same for a
variable the caller forgot.

Templates are package data (``tpuops.core.resources``): the repository's ``templates/`` folder,
next to the pin file that the startup script, ``tpuops runtime install`` and ``make setup``
install from.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache

import jinja2

from tpuops.core.naming import MetadataKey
from tpuops.core.resources import TF_VERSION_PREFIX, agent_pins, pin_file_text, template_text
from tpuops.runs.layout import LOGS, run_key
from tpuops.store.base import uri_under

STARTUP_TEMPLATE = "startup.sh.j2"


@dataclass(frozen=True)
class StartupContext:
    """Everything the startup script of one node needs; nothing else is interpolated."""

    node_name: str
    project: str
    zone: str
    accelerator_type: str
    store_root: str
    run_id: str | None = None
    job: Sequence[str] | None = None
    """The job's argv, run on worker 0 after boot; ``None`` boots a bare node."""
    labels: Mapping[str, str] = field(default_factory=dict)
    python: str = "python3"
    """The interpreter on the VM that must import TF 2.9."""
    tf_version_prefix: str = TF_VERSION_PREFIX
    pin_file: str = field(default_factory=pin_file_text)
    """The TF 2.9 pin file, byte for byte: the startup script writes it to disk and pip-installs it."""
    needs_agent_pins: bool = False
    """The job needs the pin file's agent pins beyond TF 2.9 (``tpuops.core.resources.agent_pins``; an ``infer``
    job): the startup script installs those it lacks also where the image has TF 2.9. False for a training
    job or a bare node, so that their boot needs no package index."""

    def __post_init__(self) -> None:
        if isinstance(self.job, str):
            raise TypeError("StartupContext.job is an argv list such as ['python3', 'x.py'], not a string")


def _quote(value: object) -> str:
    """Shell-quote a scalar, or each element of a list/tuple (joined by spaces)."""
    if isinstance(value, list | tuple):
        return " ".join(_quote(item) for item in value)
    if value is None:
        raise TypeError("refusing to quote None into a shell script: the template must handle it")
    text = str(value)
    if "\0" in text:
        raise ValueError(f"refusing to quote a value containing NUL into a shell script: {text!r}")
    return shlex.quote(text)


def _json(value: object) -> str:
    """One-line, ASCII-only JSON: safe to embed (after ``q``) and to splice into a JSON document."""
    return json.dumps(value, ensure_ascii=True, sort_keys=True)


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(template_text),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["q"] = _quote
    env.filters["json"] = _json
    return env


def render_template(name: str, values: Mapping[str, object]) -> str:
    """Render template ``name``; a variable missing from ``values`` raises ``jinja2.UndefinedError``."""
    return _environment().get_template(name).render(values)


def worker_logs_uri(store_root: str, run_id: str) -> str:
    """Where worker N >= 1 of the run's slice ships its log: this URI, ``/w<N>`` (``runs.layout.logs_prefix``)."""
    return uri_under(store_root, run_key(run_id, LOGS).rstrip("/"))


def render_startup_script(ctx: StartupContext) -> str:
    """The bash startup script of one node (metadata ``MetadataKey.STARTUP_SCRIPT``); the node metadata keys
    it reads come from ``MetadataKey`` (the template gets the enum as ``key``)."""
    context = {
        "project": ctx.project,
        "zone": ctx.zone,
        "accelerator_type": ctx.accelerator_type,
        "run_id": ctx.run_id,
        "store_root": ctx.store_root,
        "labels": dict(ctx.labels),
    }
    return render_template(
        STARTUP_TEMPLATE,
        {
            "node_name": ctx.node_name,
            "project": ctx.project,
            "zone": ctx.zone,
            "accelerator_type": ctx.accelerator_type,
            "run_id": ctx.run_id or "",
            "store_root": ctx.store_root,
            "python": ctx.python,
            "tf_version_prefix": ctx.tf_version_prefix,
            "pin_file": ctx.pin_file,
            "agent_pins": agent_pins(ctx.pin_file) if ctx.needs_agent_pins else [],
            "job": list(ctx.job or ()),
            "worker_logs": worker_logs_uri(ctx.store_root, ctx.run_id) if ctx.run_id else "",
            "ship_log": template_text("ship_log.py"),
            "context": context,
            "key": MetadataKey,
        },
    )
