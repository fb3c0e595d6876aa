"""The periodic checkpoint interval of ``checkpoint: {every: auto}``: Young/Daly's first-order optimum.

A periodic save costs ``C`` seconds; work the notice save does not cover (a crash, a hang, a notice
save that did not fit) is lost at ``rate`` per second of running. Saving every ``T`` seconds costs
``C / T`` of the time and loses ``T / 2`` per loss, ``rate T / 2`` of the time: the sum is least at
``T = sqrt(2 C / rate)`` (Young 1974; Daly 2006 to first order). The agent measures ``C`` on every
save and recomputes ``T``; the control plane states ``rate`` (``tpuops.toml``'s ``lost_work_per_hour``).

Pure, and Python 3.8 (it runs in the agent, and the control plane shows what it chose).
"""

import math

FIRST_SAVE_S = 10.0
"""The save cost assumed until the agent has measured one (the interval an ``auto`` run starts with)."""
MIN_INTERVAL_S = 60.0
"""Never closer than a minute: a save cost measured near zero must not make the agent save all the time."""
MAX_INTERVAL_S = 24 * 3600.0
"""Never further than a day: with no loss measured, work is still saved now and then."""


def young_daly_s(save_s: float, rate_per_hour: float) -> float:
    """``sqrt(2 save_s / rate)`` seconds, within [``MIN_INTERVAL_S``, ``MAX_INTERVAL_S``]."""
    if rate_per_hour <= 0:
        return MAX_INTERVAL_S
    interval = math.sqrt(2.0 * max(0.0, save_s) / (rate_per_hour / 3600.0))
    return min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, interval))
