"""Node providers: the seam between tpuops and whatever cloud runs its TPU nodes.

``nodes`` is the provider-neutral vocabulary (the domain imports it), ``base`` the protocol and its
contract, ``registry`` the one list of implementations: ``cloud_tpu`` (Cloud TPU and the
emulator, through the official client) and ``memory`` (a cloud of one process).
"""
