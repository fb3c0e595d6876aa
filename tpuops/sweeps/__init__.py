"""Hyperparameter sweeps: Optuna studies whose trials are tpuops runs, advanced by reconcile passes.

``spec`` validates ``sweeps/*.yaml``; ``start`` plans a sweep (``--dry-run``) and declares it
(data and bundle uploaded once, record, study, the active list); ``status`` reads what a sweep
looks like now (a row per trial, totals, the best), read-only, for ``sweep status`` and ``report``;
``template`` is the trial template frozen at ``sweep start``
(every trial's run comes from it, never from the config of the moment); ``models`` holds the typed
sweep record (``sweep.json``) and state (``state.json``), ``ops`` reads and writes them;
``journal`` keeps an Optuna journal in the store with compare-and-swap; ``studies`` opens a
sweep's study (store journal or an RDB URL) and builds its sampler and pruner; ``trials`` is what
a pass does to the study's trials, through Optuna's public API; ``decide`` is the pure rule book
of a pass (what to report, tell, stop and launch); ``advance`` is the pass itself (inside
``tpuops reconcile``); ``report`` renders tables, PNGs and one HTML page; ``hparams`` writes
each told trial as a TensorBoard HParams session under ``sweeps/<sweep>/tb``. The cron or systemd
timer that runs the passes is ``tpuops.schedule``: it schedules every reconcile pass, not only sweeps.

Sources of truth (docs/design.md): the store holds trial <-> run, run status, cost and retries;
Optuna holds params and values. A trial N of sweep S is the run ``S-tNNNN``.

May import: Optuna (and its storages), ``tpuops.core``, ``tpuops.config``, ``tpuops.store``, ``tpuops.runs``,
``tpuops.billing``, ``tpuops.accounting`` (a trial's goodput), ``tpuops.data`` (the TFRecord framing of the
HParams sessions), ``tpuops.launch`` (a trial is planned as a run is), ``tpuops.notify``, the ``tpuops.fleet``
(the endgame's deletes) and the agent's contract (``tpuops.contract``). Never the controller (it is handed the
sweeps' step and never imports them), the simulator, the ``session`` wiring or the front door.
"""
