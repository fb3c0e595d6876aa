"""Money and risk: what nodes cost and how likely they are to be taken away.

``ledger`` keeps the observed node intervals (the local SQLite cost record), ``pricing`` the
price catalog, ``cost`` prices intervals per node, run, sweep and UTC day (pure), ``risk`` learns
preemption rates from the ledger (with ``poisson``'s exact interval), ``deadline`` moves a run
between spot and on-demand to meet its deadline (pure), and ``elastic`` weighs an elastic run's sizes and chooses
among waiting for its largest, its smaller size and on-demand while the largest is stocked out (pure).

May import: ``tpuops.core``, ``tpuops.config`` and the provider-neutral node vocabulary
(``tpuops.providers``). Never a run, a store, the controller or the front door: they read money
from here, never the other way round. Runs stand beside billing, not on it: what joins a run with its
price lives above both (``tpuops.accounting``), and what a capacity move chose (``Choice``) is in
``tpuops.core.kinds``, where a run's memory can record it.
"""
