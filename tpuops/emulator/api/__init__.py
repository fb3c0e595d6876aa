"""The emulator's HTTP surfaces: what a client finds on its one port.

``rest`` routes the Cloud TPU REST API (v2, v2alpha1, v1 catalogue) onto the emulated cloud; ``discovery``
serves Google's discovery documents for the clients that load them; ``services`` answers the project-level
calls ``tpuops doctor`` makes (Resource Manager, Service Usage, IAM); ``admin`` is ``/_admin`` (faults,
preemption, the billing truth); ``auth`` decides who may call any of them. Each turns a request into a call
on ``tpuops.emulator.cloud`` and its answer into JSON; none holds a node's state itself.

May import: ``tpuops.emulator.api``, ``tpuops.emulator.cloud``, the emulator's ground (``apierror``,
``faults``, ``stats``) and ``tpuops.providers.cloud_tpu.catalog``; the standard library only.
"""
