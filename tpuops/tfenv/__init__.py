"""The local data-plane runtime: the TF 2.9 interpreter that plays a TPU VM's ``python3``.

With ``provider = "local"`` the emulator runs each node's startup script and job on this
machine, so it needs an interpreter that imports TensorFlow 2.9 (Python 3.8-3.10: TF 2.9
has no wheels for the control plane's 3.11+). It is looked for in this order
(``locate.find``), the first that exists wins:

1. the ``tf_python`` setting (``tpuops.toml`` or ``TPUOPS_TF_PYTHON``): an interpreter path;
   when set it must exist, nothing else is tried;
2. ``$TPUOPS_HOME/runtime/tf29``: the venv ``tpuops runtime install`` builds;
3. the checkout's ``.venv-tf29`` (``make setup``), when tpuops runs from a development checkout.

A built venv counts only once its stamp (``tpuops-runtime.json``) exists: ``build.install``
writes it last, after TensorFlow imported, so a half-built venv is never used and the next
install starts it over. ``pythons.find_python`` finds the interpreter to build it with.

May import: the standard library, ``tpuops.core`` (errors, the pin file), ``tpuops.config`` (the
``tf_python`` setting) and ``tpuops.providers`` (the runtime version a TPU VM image carries, which the local
runtime matches). Never the agent it runs: it builds and finds an interpreter, and only the emulator's nodes
start the agent in it.
"""
