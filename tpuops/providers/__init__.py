"""Node providers: the seam between tpuops and whatever cloud runs its TPU nodes.

``nodes`` is the provider-neutral vocabulary of nodes (the domain imports it; no cloud's wire format),
``offers`` the neutral answer to what a node of an accelerator is (``AcceleratorShape``, ``Offers``: shape,
runtimes, prices, zones, billing rule), ``base`` the protocol and its contract (no catalog), ``registry`` the
one list of implementations, the providers' rules that ``config`` is handed and ``offers_of``, through which the
rest of tpuops asks the configured provider's offers. Implementations: ``cloud_tpu/`` (Cloud TPU and the
emulator, through the official client: the adapter with Cloud TPU's catalog, prices and billing rule; the only
holder of Cloud TPU's REST body and v2 states), ``memory`` (a cloud of one process) and ``simulated`` (Cloud TPU
on a clock), whose offers are Cloud TPU's, named explicitly. ``cloud_model`` holds the simulated cloud's
assumptions.

May import: ``tpuops.core`` and itself only.
"""
