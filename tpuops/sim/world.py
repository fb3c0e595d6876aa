"""The simulated world: the cloud and the workload on it, on one virtual clock, owned by the simulation.

A simulation stands in for two things only: Cloud TPU (``tpuops.providers.simulated.SimulatedCloud``)
and the agents on its nodes (one ``SimulatedAgent`` per run). ``SimWorld`` holds both and the
``VirtualClock`` they share. What runs on top of it is production's: the controller, the sweep
passes and the ``Fleet`` see only ``SimWorld.provider``, the node-provider protocol, as they see
the emulator or Google Cloud. Everything else a simulation needs of its world (moving its clock,
its next event, the preemption notices ahead, its billing truth) is asked of ``SimWorld`` by the
simulation loop (``tpuops.sim.engine``), never through the provider.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from tpuops import runs
from tpuops.core.clock import VirtualClock
from tpuops.providers.base import NodeProvider
from tpuops.providers.cloud_model import CloudModel
from tpuops.providers.simulated import Billed, SimulatedCloud
from tpuops.sim.agent import Fate, SimulatedAgent, surface
from tpuops.sim.model import AgentModel
from tpuops.store import Store


class Agents:
    """The workload of the simulated cloud: one ``SimulatedAgent`` per run, made when its first node boots.

    A trial's agent evaluates on the synthetic surface of its own hparams (from its ``spec.json``); a node labelled
    as a run the store does not know (an elastic run's probe, deleted once READY) evaluates nothing. ``fates``
    holds, by run id, what goes wrong in which attempt (the fault swarm's agent faults; empty: nothing).
    """

    def __init__(self, store: Store, model: AgentModel, seed: int) -> None:
        self.store = store
        self.model = model
        self.seed = seed
        self.by_run: dict[str, SimulatedAgent] = {}
        self.fates: dict[str, dict[int, Fate]] = {}
        self.late: Callable[[str, float], float] = lambda run_id, notice_at: 0.0
        """How late each run's agent hears a notice (``SimulatedAgent.late``; the fault swarm's late notices)."""

    def agent(self, run_id: str) -> SimulatedAgent:
        if run_id not in self.by_run:
            metrics = None
            if self.model.eval_every_steps and runs.run_exists(self.store, run_id):  # not an elastic run's probe node
                spec = runs.read_run_spec(self.store, run_id)
                metrics = surface(spec.get("hparams") or {}, self.model.total_steps, self.seed)
            agent = self.by_run[run_id] = SimulatedAgent(self.store, run_id, self.model, metrics, self.seed,
                                                         self.fates.get(run_id))
            agent.late = lambda notice_at: self.late(run_id, notice_at)
        return self.by_run[run_id]

    def finish_time(self, run_id: str, ready_at: float, accelerator: str = "") -> float | None:
        return self.agent(run_id).finish_time(ready_at, accelerator)

    def final_s(self, run_id: str) -> float:
        return self.agent(run_id).final_s

    def stops_at(self, run_id: str, notice_at: float) -> tuple[float, float] | None:
        return self.agent(run_id).stops_at(notice_at)

    def started(self, run_id: str, at: float, accelerator: str = "") -> None:
        self.agent(run_id).started(at, accelerator)

    def interrupted(self, run_id: str, notice_at: float, end_at: float) -> None:
        self.agent(run_id).interrupted(notice_at, end_at)

    def finished(self, run_id: str, at: float) -> None:
        self.agent(run_id).finished(at)

    def hung(self, run_id: str, at: float) -> None:
        self.agent(run_id).hung(at)

    def publish(self, at: float) -> None:
        for agent in self.by_run.values():
            if agent.running:
                agent.publish(at)


class SimWorld:
    """One simulated cloud with its agents on one virtual clock (see the module docstring)."""

    def __init__(self, project: str, cloud: CloudModel, agent: AgentModel, store: Store, *, start: float,
                 seed: int = 0) -> None:
        self.clock = VirtualClock(start)
        self.agents = Agents(store, agent, seed)
        self._cloud = SimulatedCloud(project, cloud, clock=self.clock, seed=seed, workload=self.agents)

    def hold_self_deletes(self, answers_at: Callable[[float], float]) -> None:
        """Let a node's self-delete (its VM's own DELETE call) go through only when the API answers: ``answers_at(t)``
        is when a call made at ``t`` first does (the fault swarm's outages)."""
        self._cloud.api_answers_at = answers_at

    def never_boots(self, decides: Callable[[str, str], bool]) -> None:
        """Let ``decides(zone, name)`` say whether a create now gets a worker that never boots (the fault swarm's)."""
        self._cloud.never_boots = decides

    def worker_dies(self, zone: str, name: str, worker: int) -> bool:
        """A worker's TPU runtime in the READY slice ``name`` dies now (``SimulatedCloud.worker_dies``)."""
        return self._cloud.worker_dies(zone, name, worker)

    def maintenance(self, zone: str, name: str, down_s: float) -> bool:
        """A host maintenance event on the READY node ``name`` now (``SimulatedCloud.maintenance``)."""
        return self._cloud.maintenance(zone, name, down_s)

    @property
    def provider(self) -> NodeProvider:
        """The world as the control plane sees it: a node provider like any other."""
        return self._cloud

    def advance_to(self, at: float) -> None:
        """Move the clock to ``at``, apply what the cloud did meanwhile (boots, notices, preemptions, jobs that
        ended), and let every running agent write its heartbeat."""
        self.clock.advance_to(at)
        self._cloud.catch_up()
        self.agents.publish(at)

    def next_event(self) -> float | None:
        """When the next thing happens on its own (READY, a notice's end, a job's end), or None."""
        return self._cloud.next_event()

    def notices_ahead(self) -> list[tuple[float, float]]:
        """(notice, end) of every preemption still to come."""
        return self._cloud.notices_ahead()

    def ready_nodes(self) -> int:
        """How many nodes are READY now."""
        return self._cloud.ready_nodes()

    @property
    def billing(self) -> list[Billed]:
        """The cloud's billing truth: every READY interval closed so far."""
        return self._cloud.billing

    def billed_intervals(self) -> list[Billed]:
        """Every READY interval that billed anything up to the clock's now, closed or still open."""
        self._cloud.catch_up()
        now = self.clock()
        return [b for b in (*self._cloud.billing, *self._cloud.open_intervals()) if b.billed_s(now) > 0]

    def ready_intervals(self) -> list[Billed]:
        """Every READY interval up to the clock's now, closed or open, billed or free (the fault swarm's truth)."""
        self._cloud.catch_up()
        return [*self._cloud.billing, *self._cloud.open_intervals()]

    def billed(self, price: Callable[[Billed], float]) -> dict[str | None, float]:
        """USD per run id of every READY interval up to the clock's now, by ``price`` (USD per hour of its node)."""
        return self._cloud.billed(price)

    @property
    def calls(self) -> Counter[int]:
        """API calls per virtual minute."""
        return self._cloud.calls

    @property
    def creates(self) -> Counter[int]:
        """CreateNode calls per virtual minute."""
        return self._cloud.creates
