"""Shrink a failing scenario: drop its runs, commands and faults one at a time while the failure holds.

The failure that must hold is the first violated invariant's name (not its message: times and counts move as
parts go). Greedy, one pass after another until no single part can go: at most ``parts^2`` plays, each a
fraction of a second. What is left is the smallest scenario this search found that breaks the same invariant,
which a regression seed keeps in the tree (``tests/sim/swarm_seeds.toml``) beside the seed that found it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from tpuops.sim.swarm.draw import Scenario, draw
from tpuops.sim.swarm.runner import SeedResult, run_seed


def shrink(seed: int, *, guards_off: Iterable[str] = (), say: Callable[[str], None] = lambda _: None,
           ) -> tuple[Scenario, SeedResult] | None:
    """The smallest scenario of ``seed`` that still breaks its first invariant, and its result; None: it passes."""
    off = tuple(guards_off)
    scenario = draw(seed)
    result = run_seed(seed, scenario=scenario, guards_off=off)
    if result.ok:
        return None
    wanted = result.violations[0][0]
    say(f"seed {seed} breaks {wanted} with {scenario.parts()} parts")
    shrunk = True
    while shrunk:
        shrunk = False
        for index in range(scenario.parts()):
            smaller = scenario.without(index)
            attempt = run_seed(seed, scenario=smaller, guards_off=off)
            if any(name == wanted for name, _ in attempt.violations):
                scenario, result, shrunk = smaller, attempt, True
                say(f"  still breaks it with {scenario.parts()} parts")
                break
    return scenario, result
