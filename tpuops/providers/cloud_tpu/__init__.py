"""Cloud TPU: the adapter and everything tpuops knows of Google's TPU offers, in one folder.

``adapter`` is the provider registered as ``cloud-tpu`` (google-cloud-tpu, the only module that touches the
SDK); ``offers`` is its one answer to what a node *is* (``CLOUD_TPU``: shapes, runtimes, prices, zones, the
billing rule), built from ``catalog`` (``catalog.json``: zones, accelerator types, runtime versions),
``accelerators`` (types and the TF 2.9 runtime rules), ``billing_rules`` (the first-minute rule, which the
emulator applies too) and ``prices.toml``. The data files are package data of this folder.

Nothing outside ``tpuops.providers`` imports this package but the local emulator (which serves Cloud TPU and
reads its catalog and billing rule); the rest asks the registered provider (``tpuops.providers.registry.offers_of``;
``tests/providers/test_provider_seam.py`` holds every module to it). The in-process worlds (``memory``,
``simulated``) name it explicitly: Cloud TPU's offers are their model of Google's. This face imports nothing,
so that asking for ``billing_rules`` does not load the adapter.
"""
