"""Elastic slices under a stockout of the big size, on the virtual-time Cloud TPU: time to result and cost.

    .venv/bin/python bench/bench_elastic.py [--runs 100] [--repetitions 3] [--workers 2] [--json] [--result]

A 10-hour job on a spot v2-32 (36,000 steps at 1 step/s; a checkpoint every 10 minutes, 10-s saves, 2-min setup,
20-s restore) launched while the v2-32 is stocked out (the Monday morning of the issue). Each run is its own
simulated world (the real controller, store, ledger and Fleet over ``tpuops.sim``) with a pass every 5 minutes,
under three policies on the same drawn scenario (run ``i`` of a repetition has seed ``i`` under each):

- elastic: ``accelerator: [v2-32, v2-8]``, ``elastic: {wait: 0s, probe_every: 10m}``: the v2-8 at once (4
  micro-batches a step, so 4x the step time: the emulator's replicas are the TPU's here, one v2-8 against four),
  a probe of the v2-32 every 10 minutes, a move up through a checkpoint when a probe gets one;
- wait: the v2-32 on spot only: the controller retries its zone after every stockout backoff (5 minutes);
- on-demand: the v2-32 on on-demand (the stockout is of spot capacity only);
- deadline: elastic, due ``DEADLINE_H`` hours after its launch: its deadline policy (``tpuops.billing.elastic``)
  chooses among waiting, the v2-8 and on-demand of the v2-32 whenever the v2-32 is stocked out, on terms as the
  ledger would have learned them here (preemptions 0.1 / h a host, a recovery of 600 s, the spells' mean length);
  the policy models spells as exponential, the scenario draws them log-normal with that mean.

A probe's node is billed to the run it probes for (the simulated cloud labels it ``<run>-up``; its cost is added).

The scenario, drawn per seed (``draw_spells``): the v2-32's spot capacity in us-central1-a (the only zone that
offers it; the v2-8 is in us-central1-b and never stocked out) is out from the launch for a spell, then back for a
gap, then out again, and so on: spell lengths log-normal with a median of ``SPELL_MEDIAN_H`` hours and a log
spread of ``SPELL_SIGMA`` (about 80 % of spells between 1.2 and 13 hours), gaps exponential with a mean of
``GAP_MEAN_H`` hours. Spot preemptions: 0.1 per READY hour per host (a v2-32 is 4 hosts: 0.4), create -> READY
3 minutes for the v2-32, 1.5 for the v2-8 (``tpuops.billing.risk``'s assumptions). Prices: the catalog's
us-central1 (v2: $0.3375 a chip-hour on spot, $1.125 on-demand; a v2-32 is 16 chips, a v2-8 is 4).

Per repetition and policy: the share of runs whose result came sooner than under wait (same seed), the median
hours to result and cost, and cost relative to wait (ratio of the means over the same seeds). Goal of the issue:
elastic sooner than wait in >= 90 % of runs at <= 1.1x its cost. Also reported: the same shares for runs whose first
spell was under and over one hour (where elastic can and cannot win: its move up costs a probe, a boot and a save).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import result_file

from tpuops import runs
from tpuops.billing.pricing import Catalog
from tpuops.config import Settings, load_settings
from tpuops.controller.probes import probe_node_name
from tpuops.core.kinds import Capacity
from tpuops.launch.provision import plan_up
from tpuops.providers.cloud_model import CloudModel, Latency, ScriptedStockout
from tpuops.providers.simulated import Billed
from tpuops.runs import NodeSpec, RunKind, RunRecord
from tpuops.runs.models import Learned, PlanInputs, SizeInputs
from tpuops.sim.engine import START, Simulation
from tpuops.sim.model import AgentModel, Segments

BIG, SMALL = "v2-32", "v2-8"
BIG_ZONE, SMALL_ZONE = "us-central1-a", "us-central1-b"
JOB_H = 10.0
JOB = AgentModel(total_steps=int(JOB_H * 3600), steps_per_s=1.0,
                 segments=Segments(setup_s=120, checkpoint_every_s=600, save_s=10, restore_s=20),
                 slowdown={BIG: 1.0, SMALL: 4.0})
PER_HOST_HAZARD = 0.1
SPELL_MEDIAN_H = 4.0
SPELL_SIGMA = 1.0
GAP_MEAN_H = 24.0
HORIZON_H = 4 * 24.0
DEADLINE_H = 2.5 * JOB_H
POLICIES = ("elastic", "wait", "on-demand", "deadline")
SCRATCH = "/dev/shm" if Path("/dev/shm").is_dir() else None


def draw_spells(seed: int, horizon_h: float = HORIZON_H) -> tuple[ScriptedStockout, ...]:
    """The v2-32's spot stockout spells of one scenario (module docstring): the first from the launch."""
    rng = random.Random(f"elastic-spells/{seed}")
    spells, at = [], 0.0
    while at < horizon_h * 3600:
        length = SPELL_MEDIAN_H * 3600 * math.exp(rng.gauss(0.0, SPELL_SIGMA))
        spells.append(ScriptedStockout(BIG_ZONE, at, length, accelerator=BIG, capacity=Capacity.SPOT.value))
        at += length + rng.expovariate(1.0 / (GAP_MEAN_H * 3600))
    return tuple(spells)


def _settings(work: Path) -> Settings:
    work.mkdir(parents=True, exist_ok=True)
    (work / "tpuops.toml").write_text("")
    return load_settings(config_path=work / "tpuops.toml", environ={
        "TPUOPS_HOME": str(work / "home"), "TPUOPS_ZONES": f"{BIG_ZONE},{SMALL_ZONE}"})


def _record(settings: Settings, policy: str) -> RunRecord:
    """The run under ``policy``: its v2-32 (spot or on-demand), and for elastic its v2-8 too."""
    run_id = "elastic-0000"
    capacity = Capacity.ON_DEMAND if policy == "on-demand" else Capacity.SPOT

    def size(accelerator: str, zone: str) -> NodeSpec:
        up = plan_up(settings, run_id, accelerator=accelerator, capacity=capacity, zone=zone, run_id=run_id)
        return NodeSpec.of(up.request, [zone])

    smaller = [size(SMALL, SMALL_ZONE)] if policy in ("elastic", "deadline") else []
    rule = {"deadline_at": START + DEADLINE_H * 3600, "expected_s": JOB.length_s, "inputs": _inputs()} \
        if policy == "deadline" else {}
    return RunRecord(run_id=run_id, kind=RunKind.TRAIN, node=size(BIG, BIG_ZONE), smaller=smaller,
                     elastic_wait_s=0.0, probe_every_s=600.0, **rule)


def _inputs() -> PlanInputs:
    """The deadline run's terms, as the ledger would have learned them in this scenario (module docstring)."""
    def known(value: float) -> Learned:
        return Learned.of(value, True, "the scenario's")

    spell_s = SPELL_MEDIAN_H * 3600 * math.exp(SPELL_SIGMA ** 2 / 2)  # the log-normal's mean
    sizes = [SizeInputs(accelerator=accelerator, slowdown=JOB.slowdown[accelerator], spot_usd_per_hour=chips * 0.3375,
                        on_demand_usd_per_hour=chips * 1.125, hazard_per_hour=known(hosts * PER_HOST_HAZARD),
                        stockouts_per_hour=known(1 / GAP_MEAN_H if accelerator == BIG else 0.0),
                        spell_s=known(spell_s if accelerator == BIG else 0.0))
             for accelerator, chips, hosts in ((BIG, 16, 4), (SMALL, 4, 1))]
    return PlanInputs(hazard_per_hour=known(4 * PER_HOST_HAZARD), recovery_s=known(600.0),
                      lost_work_per_hour=known(0.0), sizes=sizes)


class Outcome(NamedTuple):
    seed: int
    policy: str
    hours: float | None
    usd: float
    first_spell_h: float
    preemptions: int
    moves: int
    wall_s: float
    on_demand: bool
    """The run took on-demand (the deadline policy's choice)."""


def _pricer(catalog: Catalog) -> Callable[[Billed], float]:
    """USD per hour of a billed interval's node, at ``catalog``'s prices."""
    def price(interval: Billed) -> float:
        return catalog.price_per_hour(interval.accelerator, interval.capacity, interval.zone)

    return price


def run_seeds(job: tuple[str, tuple[int, ...]]) -> list[Outcome]:
    """One policy over seeds, each its own world."""
    policy, seeds = job
    out = []
    for seed in seeds:
        spells = draw_spells(seed)
        cloud = CloudModel(ready_latency={BIG: Latency(180.0), SMALL: Latency(90.0)},
                           hazard_per_hour={(BIG_ZONE, "spot"): 4 * PER_HOST_HAZARD,
                                            (SMALL_ZONE, "spot"): PER_HOST_HAZARD},
                           spot_hazard_per_hour=PER_HOST_HAZARD, stockouts=spells)
        with tempfile.TemporaryDirectory(dir=SCRATCH) as scratch:
            work = Path(scratch)
            settings = _settings(work)
            sim = Simulation(settings, work / "world", cloud, JOB, seed=seed)
            record = _record(settings, policy)
            sim.declare([(record, {"run_id": record.run_id})])
            report = sim.run(max_hours=HORIZON_H)
            memory, _ = runs.load_memory(sim.store, record.run_id)
            billed = sim.world.billed(_pricer(sim.catalog))
        run = report.runs[0]
        usd = run.usd + billed.get(probe_node_name(record.node_name), 0.0)
        out.append(Outcome(seed, policy, run.hours_to_result, usd, spells[0].duration_s / 3600, run.preemptions,
                           memory.moves, report.wall_s, memory.capacity is Capacity.ON_DEMAND))
    return out


def repetition(runs_per: int, index: int, workers: int) -> dict[str, list[Outcome]]:
    """Every policy on seeds ``index * runs_per`` on, spread over ``workers`` processes."""
    seeds = tuple(range(index * runs_per, (index + 1) * runs_per))
    jobs = [(policy, seeds[start::workers]) for policy in POLICIES for start in range(workers)]
    found: dict[str, list[Outcome]] = {policy: [] for policy in POLICIES}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for (policy, _), rows in zip(jobs, pool.map(run_seeds, jobs), strict=True):
            found[policy].extend(rows)
    for rows in found.values():
        rows.sort(key=lambda o: o.seed)
    return found


def _sooner(mine: list[Outcome], theirs: list[Outcome], keep: Any = None) -> float | None:
    """The share of seeds (those ``keep`` keeps) whose result came sooner under ``mine`` than under ``theirs``."""
    pairs = [(a, b) for a, b in zip(mine, theirs, strict=True) if keep is None or keep(a)]
    if not pairs:
        return None
    late = HORIZON_H + 1
    return sum(1 for a, b in pairs if (a.hours or late) < (b.hours or late)) / len(pairs)


def summarise(found: dict[str, list[Outcome]]) -> list[dict[str, Any]]:
    """Per policy: sooner than wait, hours and cost, cost relative to wait."""
    wait = found["wait"]
    wait_usd = statistics.fmean(o.usd for o in wait)
    rows = []
    for policy in POLICIES:
        mine = found[policy]
        done = [o.hours for o in mine if o.hours is not None]
        rows.append({
            "policy": policy, "runs": len(mine), "finished": len(done),
            "sooner_than_wait": _sooner(mine, wait),
            "sooner_first_spell_under_1h": _sooner(mine, wait, lambda o: o.first_spell_h < 1.0),
            "sooner_first_spell_over_1h": _sooner(mine, wait, lambda o: o.first_spell_h >= 1.0),
            "hours_p50": statistics.median(done) if done else None,
            "hours_p90": sorted(done)[int(0.9 * (len(done) - 1))] if done else None,
            "usd_p50": statistics.median(o.usd for o in mine),
            "cost_vs_wait": statistics.fmean(o.usd for o in mine) / wait_usd,
            "usd_per_finished_run_vs_wait": (statistics.fmean(o.usd for o in mine) / max(1, len(done)) * len(mine))
            / (wait_usd / max(1, sum(1 for o in wait if o.hours is not None)) * len(wait)),
            "met_deadline": sum(1 for o in mine if o.hours is not None and o.hours <= DEADLINE_H) / len(mine),
            "took_on_demand": sum(1 for o in mine if o.on_demand) / len(mine),
            "preemptions_mean": statistics.fmean(o.preemptions for o in mine),
            "moves_mean": statistics.fmean(o.moves for o in mine),
            "first_spells_under_1h": sum(1 for o in mine if o.first_spell_h < 1.0),
            "wall_s_per_run": statistics.fmean(o.wall_s for o in mine),
        })
    return rows


def _spread(values: list[float | None], fmt: str) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    cells = [fmt.format(v) for v in known]
    return " / ".join(cells)


def tables(repetitions: list[list[dict[str, Any]]], runs_per: int) -> list[result_file.Table]:
    """One row a policy, the repetitions side by side in each cell (rep 1 / rep 2 / rep 3)."""
    columns = ["policy", "sooner than wait", "first spell < 1 h: sooner", "first spell >= 1 h: sooner",
               "hours to result p50", "hours p90", "$ p50", "cost vs wait", f"done within {DEADLINE_H:g} h",
               "took on-demand", "preemptions", "moves up", "finished"]
    rows = []
    for index, policy in enumerate(POLICIES):
        cells = [rep[index] for rep in repetitions]
        rows.append([policy, _spread([c["sooner_than_wait"] for c in cells], "{:.0%}"),
                     _spread([c["sooner_first_spell_under_1h"] for c in cells], "{:.0%}"),
                     _spread([c["sooner_first_spell_over_1h"] for c in cells], "{:.0%}"),
                     _spread([c["hours_p50"] for c in cells], "{:.1f}"), _spread([c["hours_p90"] for c in cells],
                                                                                 "{:.1f}"),
                     _spread([c["usd_p50"] for c in cells], "{:.0f}"), _spread([c["cost_vs_wait"] for c in cells],
                                                                               "{:.3f}"),
                     _spread([c["met_deadline"] for c in cells], "{:.0%}"),
                     _spread([c["took_on_demand"] for c in cells], "{:.0%}"),
                     _spread([c["preemptions_mean"] for c in cells], "{:.1f}"),
                     _spread([c["moves_mean"] for c in cells], "{:.2f}"),
                     _spread([float(c["finished"]) for c in cells], "{:.0f}")])
    under = _spread([float(rep[0]["first_spells_under_1h"]) for rep in repetitions], "{:.0f}")
    caption = (f"{runs_per} runs per policy and repetition, a 10-h v2-32 job launched in a v2-32 spot stockout "
               f"(spells log-normal, median {SPELL_MEDIAN_H:g} h, log spread {SPELL_SIGMA:g}; gaps exponential, mean "
               f"{GAP_MEAN_H:g} h; first spells under 1 h: {under}); each cell: repetition 1 / 2 / 3")
    return [result_file.Table(caption, columns, rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100, help="simulated runs per policy and repetition")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    result_file.add_argument(parser)
    args = parser.parse_args()
    if args.runs < 1 or args.repetitions < 1 or args.workers < 1:
        raise SystemExit("--runs, --repetitions and --workers must be at least 1")
    measuring = result_file.Run("bench_elastic")
    started = time.perf_counter()
    reps = [summarise(repetition(args.runs, index, args.workers)) for index in range(args.repetitions)]
    out = {"runs": args.runs, "repetitions": reps, "scenario": {
        "job_hours_on_v2_32": JOB_H, "spell_median_h": SPELL_MEDIAN_H, "spell_log_sigma": SPELL_SIGMA,
        "gap_mean_h": GAP_MEAN_H, "per_host_spot_preemptions_per_hour": PER_HOST_HAZARD, "v2_8_slowdown": 4.0,
        "deadline_h": DEADLINE_H},
        "bench_wall_s": round(time.perf_counter() - started, 1)}
    shown = tables(reps, args.runs)
    if args.result:
        measuring.write(json.loads(json.dumps(out)), shown)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    for found in shown:
        table = Table(title=found.caption)
        for column in found.columns:
            table.add_column(column)
        for row in found.rows:
            table.add_row(*row)
        Console(width=200).print(table)


if __name__ == "__main__":
    main()
