"""Node providers: the seam between tpuops and whatever cloud runs its TPU nodes.

``nodes`` is the provider-neutral vocabulary (the domain imports it; no cloud's wire format), ``base`` the
protocol, its contract and the Cloud TPU catalog's rules, ``commands`` the ``RunsCommands`` capability (live
access to a node's workers, for ``exec``), ``registry`` the one list of implementations and the
providers' rules that ``config`` is handed: ``cloud_tpu`` (Cloud TPU and the emulator, through the official
client; the only holder of Cloud TPU's REST body and v2 states), ``memory`` (a cloud of one process) and
``simulated`` (Cloud TPU on a clock).

May import: the standard library, the official Cloud TPU client (google-cloud-tpu, imported when a provider
opens) and ``tpuops.core``; nothing else of tpuops. Everything that meets a cloud stands on this seam: the
Fleet, billing, runs, launch planning, the simulator and the emulator (which serves the catalog and the billing
rule from here) import it, never the other way round.
"""
