"""Accounting: a run's billed node time laid against what the run did with it.

``goodput`` splits the ledger's billed READY intervals of a run by the agent's attempt clocks and prices
them (``tpuops.runs.Goodput``: productive, boot, setup, recomputed, ..., what interruptions cost);
``timeline`` draws the same inputs as one picture (node incarnations, attempts, the controller's
events). Both are pure: the service layer (``tpuops.api.accounting``, ``tpuops.api.pages``), a sweep's
status and a driven run read the ledger and the store and hand them in.

This is the one room that joins a run with money, so that runs and billing stand side by side below it.

May import: ``tpuops.runs``, ``tpuops.billing`` (the ledger's histories, their intervals and prices),
the provider-neutral node vocabulary (``tpuops.providers``), ``tpuops.core`` and the agent's time
segments (``tpuops.contract.timing``). Never a store, the controller, a sweep or the front door.
"""
