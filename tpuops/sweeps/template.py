"""A sweep's frozen trial template: every trial's run, made from what ``sweep start`` froze and nothing else.

``sweep start`` plans trial 0 as ``jobs.plan_train`` plans any run, from the config of that moment,
and freezes the result here: its run record (the node request: accelerator, runtime, capacity,
zones, labels, service account, metadata), its run spec, and the two config values its startup
script was rendered with that the record does not hold (project, store root). ``for_trial`` makes
trial N's run from these alone, with no ``Settings``: editing ``tpuops.toml`` mid-sweep changes
no later trial, as editing it changes no declared run.

Trial N differs from trial 0 only in what carries its name: the run id, the node name, the run
label and the startup script, plus the trial's params over the experiment's hparams. Its node is
built by the one node-request builder (``tpuops.launch.provision.NodeBasis``) on the basis of
trial 0's frozen node, as ``jobs`` builds any run's. ``for_trial(0, {})`` gives back trial 0's node
exactly (a test holds it to that).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Annotated, Any, NamedTuple

from pydantic import BaseModel, ConfigDict, PlainSerializer, PlainValidator, field_validator

from tpuops.contract.runspec import RunSpec, SpecError
from tpuops.core.clock import UTC
from tpuops.launch.provision import NodeBasis
from tpuops.runs import NodeSpec, RunRecord, spec_json


def trial_run_id(sweep: str, number: int) -> str:
    """The run of trial ``number``: ``<sweep>-tNNNN``."""
    return f"{sweep}-t{number:04d}"


def _parse_run_spec(value: Any) -> RunSpec:
    if isinstance(value, RunSpec):
        return value
    try:
        return RunSpec.from_json(value)
    except SpecError as err:
        raise ValueError(str(err)) from None


FrozenRunSpec = Annotated[RunSpec, PlainValidator(_parse_run_spec), PlainSerializer(spec_json)]
"""A ``RunSpec`` in a pydantic document: checked by the agent's own parser, written as ``spec.json`` is."""


class TrialRun(NamedTuple):
    """One trial's run: what ``runs.declare`` writes."""

    record: RunRecord
    spec: RunSpec


class TrialTemplate(BaseModel):
    """What every trial's run copies (see the module docstring)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    record: RunRecord
    spec: FrozenRunSpec
    project: str
    store_root: str
    """The store root as the config named it when the startup script was rendered."""

    @field_validator("record")
    @classmethod
    def _of_a_sweep(cls, record: RunRecord) -> RunRecord:
        if not record.sweep:
            raise ValueError("the template's run record names no sweep")
        return record

    @property
    def sweep(self) -> str:
        return self.record.sweep or ""

    def for_trial(self, number: int, params: dict[str, Any]) -> TrialRun:
        """Trial ``number``'s run with ``params`` over the hparams: a function of the template and these only
        (but for the record's ``created``, the moment it was made)."""
        run_id = trial_run_id(self.sweep, number)
        def renamed(node: NodeSpec) -> NodeSpec:  # each size of trial 0's node, for this trial's run
            basis = NodeBasis.of_frozen(node, project=self.project, store_root=self.store_root)
            return basis.run_node(run_id, self.record.kind, store_uri=self.spec.store_root,
                                  bundle_sha256=self.record.bundle_sha256 or "").frozen()

        record = self.record.model_copy(update={"run_id": run_id, "node": renamed(self.record.node),
                                                "smaller": [renamed(size) for size in self.record.smaller],
                                                "created": datetime.now(UTC).isoformat(timespec="seconds")})
        spec = dataclasses.replace(self.spec, run_id=run_id, hparams={**self.spec.hparams, **params})
        return TrialRun(record, spec)
