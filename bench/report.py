"""docs/benchmarks.md, generated from the result files in ``bench/results/`` (``bench/result_file.py``).

    .venv/bin/python bench/report.py            # rewrite docs/benchmarks.md
    .venv/bin/python bench/report.py --check    # exit 1 when it is not what the result files give

The page holds no figure of its own: each section is a bench's explanation (``SECTIONS`` below:
what it measures and why, in words) followed by its result files, each with the command, date,
load and tree it was measured with, its tables and the notes written about that run. A result
carried over from the README of an earlier tree says so. ``tests/house/test_docs_truth.py`` runs
``--check``'s comparison, and fails on a result file no section names.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"


@dataclass(frozen=True)
class Section:
    bench: str
    title: str
    about: str
    """What the bench measures and why, in words: the figures come from the result files only."""
    parts: tuple[tuple[str, str], ...] = (("", ""),)
    """The result files shown, in this order, with their headings (part ``""``: the whole run, ``bench.json``)."""


SECTIONS = (
    Section("bench_nodes", "Node layer",
            "The commands a user waits on against the local emulator: `--help`, `status` over many nodes (one "
            "ListNodes per zone and page, against a GetNode per node), and concurrent creates and deletes."),
    Section("bench_data", "Data",
            "Writing TFRecords without TensorFlow against TF 2.9's own writer, a conversion end to end, and "
            "parallel, resumable uploads to fake-gcs-server against google-cloud-storage's transfer manager.",
            (("", ""), ("convert", "Conversion only"), ("upload", "Upload only"))),
    Section("bench_controller", "Controller and recovery",
            "Reconcile passes over many runs (calls grow with zones, not runs), a preemption to its replacement, "
            "steps lost per preemption, idle billed time and the cost ledger against the emulator's billing."),
    Section("bench_sweeps", "Sweeps",
            "A reconcile pass over one large sweep on the emulator, an Optuna trial's ask, report and tell on the "
            "store journal against PostgreSQL and Optuna's file journal, and many writers through one journal."),
    Section("bench_controller_scale", "Run model and controller scale",
            "Controller passes with thousands of runs in the store, this tree against the tree before the run "
            "module, on a local store and on fake-gcs-server: a steady pass must read nothing that has not changed.",
            (("", ""), ("gcs", "On fake-gcs-server only"), ("local", "On a local store only"))),
    Section("bench_provider_seam", "One seam to the cloud",
            "The package files that name each node provider, against the one adapter of the tree before the "
            "seam: what a new provider has to touch."),
    Section("bench_cli", "Command wall time",
            "Everyday commands as a user waits for them, each a fresh process, this tree and a baseline tree "
            "taking turns in every repetition so that the machine's load falls on both alike."),
    Section("bench_agent", "Your own code",
            "The agent's training loop, input pipeline and exact resume against `model.fit` and plain tf.data, on "
            "a CPU, with TF op determinism on and off: what running under tpuops costs a user's model.",
            (("", ""), ("determinism-on", "Op determinism on"), ("determinism-off", "Op determinism off"))),
    Section("bench_infer", "Inference, checkpoints, boot",
            "Batch prediction against `model.predict` and a plain `tf.function`, latency mode's time to result "
            "per batch, and what checkpoint saves block the step loop.",
            (("", ""), ("throughput", "Inference throughput"), ("latency", "Latency mode"),
             ("checkpoints", "Checkpoints and boot"))),
    Section("bench_goodput", "Goodput",
            "A long digits run on the emulator preempted 0, 1 and 3 times: where every billed second went, the "
            "recovery from PREEMPTED to the replacement's first completed step, and the ledger against billing."),
    Section("bench_faults", "When the run itself goes wrong",
            "What a user's deterministic mistake costs (nodes, boots, billed seconds), how long a finished node "
            "bills while the Cloud TPU API fails a share of requests, the ledger against billing on a simulated "
            "1,000-trial sweep and that simulation's CPU speed-up, and which commands still work with one damaged "
            "run among 200. One result file a part, each measured with 3 repetitions.",
            (("user-errors", "A user's mistake"), ("idle", "Idle after end under API errors"),
             ("ledger", "Ledger against billing, simulated fleet sweep"), ("damaged", "One damaged run among 200"))),
    Section("bench_gcs", "The agent on gs://",
            "TensorFlow 2.9's own Cloud Storage filesystem on an emulated node against the same work on the local "
            "store: the training input, checkpoint save and restore, recovery, and storage requests per step.",
            (("", ""), ("loaded", "An earlier run on a loaded machine"))),
    Section("bench_fuzz", "Bad input",
            "The CLI fuzzer over this tree and an older one, side by side in fresh processes: throughput, "
            "distinct failure signatures, the slowest refused case and the corpus files not refused."),
    Section("bench_plan", "Planning on a virtual-time Cloud TPU",
            "The simulator drives the real controller and sweep passes through the provider protocol; only time and "
            "the cloud are simulated. Capacity policies over many seeded 24-hour jobs, the deadline policy's "
            "hysteresis, and a fleet-scale sweep against its budget.",
            (("", ""), ("policy", "Policy study and the deadline policy's hysteresis"),
             ("hysteresis", "The deadline policy's hysteresis"), ("fleet", "A fleet-scale sweep"))),
    Section("bench_simulation", "Simulation speed",
            "What a seed of the fault swarm costs: a simulated 1,000-trial sweep (the real controller, sweep passes, "
            "Fleet, ledger and store over the simulated cloud, a pass every 5 minutes) in CPU time, simulated seconds "
            "per CPU second of the simulation loop, with Optuna's random sampler (goal >= 1,000x) and with TPE; the "
            "CPU time inside Optuna's ask is reported apart, per trial and as a share, since a real sweep pays it too. "
            "Each sampler 3 times with seeds 0-2, each in a fresh process."),
    Section("bench_swarm", "Fault swarm",
            "The fault swarm's reach (`make swarm`, `tpuops.sim.swarm`): seeds a minute on every core of this "
            "machine (goal: the default 2,000 seeds in under 30 minutes), CPU seconds a seed, the faults injected by "
            "kind, the invariant checks made and the violations found, over 10,000 seeds played in five parts of "
            "2,000 (the issue's done-when: five runs over disjoint seed ranges, zero violations, every kind injected "
            "at least 100 times)."),
    Section("bench_detection", "Detection latency",
            "How soon a preemption is noticed: cron, `watch` and the agent's wake-up marker, on the simulator at "
            "equal preemption counts and in real runs on the emulator.",
            (("", ""), ("simulator", "On the simulator"), ("emulator", "Real runs on the emulator"))),
    Section("bench_calibration", "Forecast calibration",
            "Real runs on the emulator under seeded preemptions against the simulator set to the same session's "
            "measured timings: how many runs fall inside the forecast's bands, against what an exact forecast "
            "would score."),
    Section("bench_dashboard", "Dashboard",
            "The dashboard's first paint with many runs, served from the run index against a page built from "
            "every run's files, how soon a status write reaches an open page, and its store calls.",
            (("", ""), ("local", "On a local store only"), ("gcs", "On fake-gcs-server only"))),
    Section("bench_conformance", "Emulator conformance",
            "`gcloud compute tpus` and the google-cloud-tpu client, run unmodified against the emulator and "
            "against the emulator before the conformance work."),
    Section("bench_doctor", "`tpuops doctor` wall time",
            "`tpuops doctor --json` in a fresh process against the emulator, and its checks in parallel against "
            "one after another."),
    Section("bench_slices", "A job on a pod slice",
            "The digits CNN on an emulated v2-32 (4 workers, worker 0's agent the single TensorFlow client of all "
            "of them) against a v3-8 at the same global batch: create to first step and where the time goes, "
            "recovery of a preemption, memory per worker and for the slice, steps/s (2 shared cores: no goal)."),
    Section("bench_profiles", "Profiles while nobody asks",
            "What the profile feature costs every run while no profile is asked for, against a run without the "
            "profiler server: the training loop's steps/s with the idle profiler (the request read in the "
            "background, the boundary checks), and with that plus a listening profiler server, against neither, "
            "three processes taking turns on the CPU under TF 2.9. Goal <= 1 % of step time."),
    Section("bench_accumulation", "Gradient accumulation",
            "What keeping an elastic run's global batch on a smaller slice costs: the digits CNN's steps/s on an "
            "emulated v2-8 (one replica accumulating 4 times the micro-batches) against an emulated v2-32 (4 "
            "workers), each run end to end with `tpuops train`, taking turns; and the agent's training step alone "
            "on one CPU replica, one global batch at once against in micro-batches (2 shared cores: no goal).",
            (("emulator", "v2-8 against v2-32 on the emulator"), ("step", "The agent's step on one CPU replica"))),
    Section("bench_elastic", "Elastic slices under a stockout",
            "A 10-hour v2-32 job launched while the v2-32's spot capacity is stocked out, on the simulator (the real "
            "controller, its probes and moves over the virtual-time Cloud TPU, a pass every 5 minutes): elastic "
            "(`accelerator: [v2-32, v2-8]`, 4x the step time on the v2-8), waiting for the v2-32, its on-demand, and "
            "the elastic run's deadline policy, 100 runs each per repetition on the same drawn stockout spells "
            "(log-normal lengths, stated in `bench/bench_elastic.py`). Goal: elastic sooner than waiting in >= 90 % "
            "of runs at <= 1.1x its cost."),
)

HEADER = """# Benchmarks

<!-- Generated by bench/report.py from bench/results/*.json: edit those (or the SECTIONS of bench/report.py), not
     this page. tests/house/test_docs_truth.py fails when the two disagree. -->

Every figure here comes from a result file a bench wrote (`bench/results/`, through `bench/result_file.py`): each
run says its command, when it ran, the load on the machine and the tree it measured. The machine is a
shared 2-core development VM, so read every figure against its load, and compare within a table rather
than across runs. A result marked *carried over* was measured on an earlier tree and copied from the
README of that time with the conditions it stated; the next run of its bench with `--result` replaces it.
To add or refresh a result: run the bench with `--result`, then `.venv/bin/python bench/report.py`.
"""


def load_results(folder: Path = RESULTS) -> dict[tuple[str, str], dict[str, Any]]:
    """Every result file, keyed by (bench, part); a file that is not one fails loudly, naming it."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(folder.glob("*.json")):
        result = json.loads(path.read_text(encoding="utf-8"))
        problem = check(result)
        if problem:
            raise SystemExit(f"{path}: {problem}")
        expected = f"{result['bench']}.{result['part']}.json" if result["part"] else f"{result['bench']}.json"
        if path.name != expected:
            raise SystemExit(f"{path}: holds {result['bench']!r} part {result['part']!r}: name it {expected}")
        found[(result["bench"], result["part"])] = result
    return found


def check(result: Any) -> str | None:
    """What makes ``result`` not a result file (None: it is one)."""
    if not isinstance(result, dict):
        return "not a JSON object"
    for key, kind in (("bench", str), ("part", str), ("command", str), ("carried_over", bool), ("tables", list),
                      ("notes", list)):
        if not isinstance(result.get(key), kind):
            return f"needs {key!r} ({kind.__name__})"
    for key in ("date", "load"):
        if not result.get(key):
            return f"needs {key!r}: a figure without its date and load cannot be read"
    for table in result["tables"]:
        columns = table.get("columns") if isinstance(table, dict) else None
        if not isinstance(columns, list) or not all(isinstance(row, list) and len(row) == len(columns)
                                                     for row in table.get("rows", [None])):
            return f"table {table.get('caption') if isinstance(table, dict) else table!r}: rows must match its columns"
    return None


def render(results: dict[tuple[str, str], dict[str, Any]]) -> str:
    """The whole page for these results; every result file must belong to a section."""
    shown = {(section.bench, part) for section in SECTIONS for part, _ in section.parts}
    unplaced = sorted(set(results) - shown)
    if unplaced:
        raise SystemExit("result files no section of bench/report.py shows (add the part to its Section): "
                         + ", ".join(f"{bench}.{part}.json" if part else f"{bench}.json" for bench, part in unplaced))
    out = [HEADER]
    for section in SECTIONS:
        out.append(f"## {section.title}\n\n{_wrap(f'{section.about} (`bench/{section.bench}.py`)')}\n")
        present = [(results[(section.bench, part)], title) for part, title in section.parts
                   if (section.bench, part) in results]
        if not present:
            out.append(f"No result yet: run `bench/{section.bench}.py --result`.\n")
        for result, title in present:
            out.append(_render_result(result, title))
    return "\n".join(out).rstrip("\n") + "\n"


def _render_result(result: dict[str, Any], title: str) -> str:
    lines = []
    if title:
        lines.append(f"### {title}\n")
    lines.append(_wrap(_conditions(result)) + "\n")
    for table in result["tables"]:
        if table.get("caption"):
            lines.append(table["caption"] + "\n")
        lines.append(_table(table["columns"], table["rows"]) + "\n")
    if not result["tables"]:
        scalars = _scalars(result.get("figures", {}))
        if scalars:
            lines.append(_table(["figure", "value"], scalars) + "\n")
    lines.extend(note.rstrip("\n") + "\n" for note in result["notes"])
    return "\n".join(lines)


def _conditions(result: dict[str, Any]) -> str:
    if result["carried_over"]:
        return (f"*Carried over* from {result.get('source', 'the README')} of an earlier tree, not re-run since: "
                f"{result['date']}; {result['load']}. Command: `{result['command']}`.")
    date, load = result["date"], result["load"]
    machine = result.get("machine", {})
    before = " / ".join(f"{value:g}" for value in load["before"])
    after = " / ".join(f"{value:g}" for value in load["after"])
    return (f"Measured {date['started']} - {date['ended']} on {machine.get('cpus', '?')} cores, load average "
            f"(1 / 5 / 15 min) {before} before, {after} after; tree `{result.get('commit') or '?'}`. "
            f"Command: `{result['command']}`.")


def _wrap(text: str) -> str:
    """A paragraph at the page's width (code spans may break at their spaces: Markdown joins them again)."""
    return textwrap.fill(text, width=110, break_long_words=False, break_on_hyphens=False)


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(columns: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(_cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _scalars(figures: Any, prefix: str = "") -> list[list[str]]:
    """A bench that gives no tables is shown by its scalar figures, one row each (lists are left to the file)."""
    if not isinstance(figures, dict):
        return []
    rows: list[list[str]] = []
    for key, value in figures.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            rows += _scalars(value, name + ".")
        elif isinstance(value, (int, float, str, bool)):
            rows.append([f"`{name}`", f"{value:.4g}" if isinstance(value, float) else str(value)])
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/benchmarks.md is not up to date")
    args = parser.parse_args()
    page = render(load_results())
    if args.check:
        if PAGE.read_text(encoding="utf-8") != page:
            print(f"{PAGE} is not what bench/results/ gives: run .venv/bin/python bench/report.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)} from {len(load_results())} result files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
