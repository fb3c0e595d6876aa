"""``tpuops dashboard``: a local web app over the store, the ledger and the fleet (docs/dashboard.md).

``source`` is what it reads and acts through (``tpuops.api`` calls bound to one ``Settings``: the app
never imports the front door); ``timeline`` and ``svg`` draw a run's life (pure); ``views`` shapes rows;
``app`` holds the routes; ``guard`` and ``auth`` the token; ``optuna_mount`` optuna-dashboard over a
sweep's study; ``serve`` runs uvicorn on 127.0.0.1.
"""
