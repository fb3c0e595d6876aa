"""Cloud Storage for emulated nodes (a ``gs://`` store): fake-gcs-server behind the fronts Google's names reach.

``storage`` runs fake-gcs-server and writes the nodes' hosts view; ``front`` is its HTTPS front (the
certificate ``tls`` issues for Google's storage hosts) and the control plane's plain one; ``uploads``
answers resumable-upload status queries as Cloud Storage does. Only a ``gs://`` store starts it, and only
it needs ``cryptography`` (``tls``): ``tpuops.emulator.control`` imports it lazily.

May import: ``tpuops.emulator.gcs``, ``tpuops.emulator.vm`` (the hosts view), the emulator's ground
(``faults``, ``fsutil``, ``stats``, ``background``); the standard library and ``cryptography``.
"""
