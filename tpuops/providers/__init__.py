"""Node providers: the seam between tpuops and whatever cloud runs its TPU nodes.

``nodes`` is the provider-neutral vocabulary of nodes (the domain imports it; no cloud's wire format),
``offers`` the neutral answer to what a node of an accelerator is (``AcceleratorShape``, ``Offers``: shape,
runtimes, prices, zones, billing rule), ``base`` the protocol and its contract (no catalog), ``commands`` the
``RunsCommands`` capability (live access to a node's workers, for ``exec``), ``registry`` the one list of
implementations, the providers' rules that ``config`` is handed and ``offers_of``, through which the rest of
tpuops asks the configured provider's offers. Implementations: ``cloud_tpu/`` (Cloud TPU and the emulator,
through the official client: the adapter with Cloud TPU's catalog, prices and billing rule; the only holder of
Cloud TPU's REST body and v2 states), ``memory`` (a cloud of one process) and ``simulated`` (Cloud TPU on a
clock), whose offers are Cloud TPU's, named explicitly. ``cloud_model`` holds the simulated cloud's assumptions.

May import: the standard library, the official Cloud TPU client (google-cloud-tpu, imported when a provider
opens) and ``tpuops.core``; nothing else of tpuops. Everything that meets a cloud stands on this seam: the
Fleet, billing, runs, launch planning, the simulator and the emulator (which serves the catalog and the billing
rule from here) import it, never the other way round.
"""
