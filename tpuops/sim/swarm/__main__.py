"""``python -m tpuops.sim.swarm``: run seeds of the fault swarm, print a progress bar and a summary (or ``--json``).

    python -m tpuops.sim.swarm                      # seeds 0..1999 on every core (make swarm)
    python -m tpuops.sim.swarm --seeds 100 --first 5000
    python -m tpuops.sim.swarm --seed 17            # replay one seed exactly, with its violations
    python -m tpuops.sim.swarm --seed 17 --shrink   # and drop its parts while it still fails

Exit status: 0 when no invariant broke, 1 when one did, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from tpuops.core import guards
from tpuops.sim.swarm.invariants import AFTER_PASS, AT_END
from tpuops.sim.swarm.runner import KINDS, SeedResult, Summary, run_seed, sweep
from tpuops.sim.swarm.shrink import shrink

BAR = 40


def _bar(done: int, total: int, failed: int) -> None:
    filled = BAR * done // max(total, 1)
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (BAR - filled)}] {done}/{total} seeds, {failed} failing")
    sys.stderr.flush()


def _table(summary: Summary) -> str:
    data = summary.to_json()
    lines = [f"seeds: {summary.seeds}   wall: {data['wall_s']:.1f} s   seeds/minute: {data['seeds_per_minute']}   "
             f"CPU per seed: {data['cpu_s_per_seed']:.3f} s",
             f"failing seeds: {len(summary.failed)}   faults injected: {sum(summary.injected.values())}   "
             f"invariant checks: {sum(summary.checks.values())}   violations: {sum(summary.violations.values())}",
             "", f"{'fault kind':<28}{'injected':>10}"]
    lines += [f"{kind:<28}{summary.injected[kind]:>10}" for kind in KINDS]
    lines += ["", f"{'invariant':<36}{'checks':>10}{'violations':>12}"]
    lines += [f"{name:<36}{summary.checks[name]:>10}{summary.violations[name]:>12}"
              for name in dict.fromkeys((*AFTER_PASS, *AT_END))]  # one row for a checker at both moments
    for result in sorted(summary.failed, key=lambda r: r.seed)[:20]:
        lines.append(f"\nseed {result.seed}: {result.violations[0][0]}: {result.violations[0][1]}")
        lines.append(f"  replay: {result.replay()}")
    if len(summary.failed) > 20:
        lines.append(f"\n... and {len(summary.failed) - 20} more failing seeds (--json lists them all)")
    return "\n".join(lines)


def _one(result: SeedResult, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result.to_json(), indent=1))
        return
    print(f"seed {result.seed}: {result.passes} passes, {result.simulated_h:.1f} virtual hours, "
          f"injected {dict(result.injected)}")
    for name, line in result.violations:
        print(f"  {name}: {line}")
    print("  ok" if result.ok else f"  replay: {result.replay()}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpuops.sim.swarm", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, help="replay this one seed")
    parser.add_argument("--seeds", type=int, default=int(os.environ.get("SEEDS", "2000")),
                        help="how many seeds (default $SEEDS or 2000)")
    parser.add_argument("--first", type=int, default=0, help="the first seed of the range (default 0)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes (default: every core)")
    parser.add_argument("--guard-off", action="append", default=[], metavar="NAME",
                        help=f"turn a guard off (tests of the checks): {', '.join(guards.declared())}")
    parser.add_argument("--shrink", action="store_true", help="with --seed: drop parts while it still fails")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.guard_off) - set(guards.declared()))
    if unknown or args.seeds < 1 or args.workers < 1:
        what = f"no guard named {', '.join(unknown)}" if unknown else "--seeds and --workers must be >= 1"
        print(f"error: {what}", file=sys.stderr)
        return 2
    if args.seed is not None:
        if args.shrink:
            shrunk = shrink(args.seed, guards_off=args.guard_off, say=lambda text: print(text, file=sys.stderr))
            if shrunk is None:
                print(f"seed {args.seed} passes: nothing to shrink")
                return 0
            scenario, result = shrunk
            print(json.dumps({"scenario": scenario.to_json(), "result": result.to_json()}, indent=1))
            return 1
        result = run_seed(args.seed, guards_off=args.guard_off)
        _one(result, args.json)
        return 0 if result.ok else 1
    total = args.seeds
    seen = [0, 0]  # seeds done, seeds failing

    def progress(result: SeedResult) -> None:
        seen[0] += 1
        seen[1] += not result.ok
        if not args.json:
            _bar(seen[0], total, seen[1])

    summary = sweep(range(args.first, args.first + total), workers=args.workers, guards_off=args.guard_off,
                    on_result=progress)
    if not args.json:
        sys.stderr.write("\n")
    print(json.dumps(summary.to_json(), indent=1) if args.json else _table(summary))
    return 0 if not summary.failed else 1


if __name__ == "__main__":
    sys.exit(main())
