"""What an emulated TPU VM worker runs on: its sandbox, its process groups, its metadata and its network.

``sandbox`` gives a node's worker a directory and process groups and is the one way they end; ``workers``
are a slice's hosts, each on its own loopback address, with ``tpu_runtime`` (and the ``bindaddr.c`` shim it
is built with, both read by path) as a ``-pod`` image's runtime; ``metadata`` is a worker's GCE-style
metadata server and ``metadoor`` the port-80 door that finds it for ``http://metadata``; ``netview`` is what
a worker's processes see of Google's host names. Nothing here knows the API or the node records.

May import: ``tpuops.emulator.vm``, the emulator's ground (``fsutil``, ``background``); the standard
library only.
"""
