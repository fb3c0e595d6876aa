"""``tpuops dashboard``: a local web app over the store, the ledger and the fleet (docs/dashboard.md).

It stands on top of the front door, beside the CLI: ``source`` binds ``tpuops.api`` calls to one
``Settings`` (what the app reads and acts through), and nothing below imports this package. ``svg``
draws a run's timeline (``tpuops.accounting.timeline``, pure); ``views`` shapes rows; ``app`` holds the
routes; ``guard`` and ``auth`` the token; ``optuna_mount`` optuna-dashboard over a sweep's study;
``serve`` runs uvicorn on 127.0.0.1 (``dashboard``: what ``tpuops dashboard`` starts).

May import: ``tpuops.api`` and the types its calls return (``tpuops.runs``, ``tpuops.accounting``,
``tpuops.sweeps``, ``tpuops.store``, ``tpuops.config``, ``tpuops.core``), the ``tpuops.session`` wiring (to
open the store once for all its calls), and the web stack (Starlette, uvicorn, optuna-dashboard). Nothing in
tpuops but the CLI imports it (``tests/house/test_wings.py``).
"""
