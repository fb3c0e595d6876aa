"""What the pages show of a run, a node and a cost report, as plain dicts for templates and the data API (pure)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from tpuops.core.clock import UTC
from tpuops.core.notices import Notice, State

if TYPE_CHECKING:
    from tpuops.dashboard.source import NodeRow
    from tpuops.runs import Run



def age_s(created: str, now: datetime) -> float | None:
    """Seconds since ``created`` (ISO-8601; naive is UTC); None when unknown or unreadable."""
    try:
        at = datetime.fromisoformat(created)
    except ValueError:
        return None
    return (now - (at if at.tzinfo else at.replace(tzinfo=UTC))).total_seconds()


def run_row(run: Run, now: datetime) -> dict[str, Any]:
    """One line of the Runs page: phase, step, examples/s, checkpoint, goodput, cost, age."""
    status = run.status
    return {
        "run_id": run.run_id, "sweep": run.record.sweep, "phase": run.phase, "damaged": run.damage_note() or None,
        "outcome": run.outcome.value if run.outcome else None,
        "step": status.step if status else 0, "total_steps": status.total_steps if status else None,
        "examples_per_sec": status.examples_per_sec if status else None,
        "checkpoint": status.last_checkpoint_step if status else None,
        "goodput": run.goodput.goodput if run.goodput else None,
        "usd": run.usd,
        "preemptions": run.memory.preemptions, "age_s": age_s(run.record.created, now),
    }


def node_row(row: NodeRow, now: datetime) -> dict[str, Any]:
    node = row.node
    return {"name": node.name, "zone": node.zone, "accelerator": node.accelerator, "hosts": node.hosts,
            "unhealthy_workers": list(node.unhealthy_workers), "capacity": node.capacity.value,
            "state": node.state.value, "run_id": row.run_id,
            "orphan": row.orphan, "damaged": row.damaged, "age_s": node.age_s(now)}


def notice_row(notice: Notice) -> dict[str, str]:
    """One notification of a run (``tpuops.notify``) as the run page lists it: target names and delivery states
    only (a target's URL or password is never in a notice)."""
    states = []
    for delivery in notice.deliveries:
        why = f" ({delivery.error})" if delivery.error and delivery.state is not State.SENT else ""
        states.append(f"{delivery.target}: {delivery.state}{why}")
    return {"at": datetime.fromtimestamp(notice.at, UTC).isoformat(timespec="seconds"), "kind": str(notice.kind),
            "title": notice.title, "deliveries": "; ".join(states)}
