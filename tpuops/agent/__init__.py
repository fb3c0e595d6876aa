"""The tpuops data plane: the agent that trains and predicts on a TPU VM.

It runs as ``python -m tpuops.agent {train,infer} SPEC`` under TensorFlow 2.9 on the image's
Python 3.8, so everything in this package is Python 3.8 and imports nothing beyond the standard
library, TensorFlow 2.9 and the numpy that comes with it; from ``tpuops``, only the contract it
shares with the control plane (``tpuops.contract``, standard library only, shipped in the same
bundle), never the control plane itself (it needs Python >= 3.10 and a protobuf TF 2.9 cannot load).

The agent talks to the control plane only through the store (docs/design.md, "The store is the
message bus"): it reads ``runs/<run>/spec.json`` (schema in ``tpuops.contract.runspec``) and writes
``status.json`` (``status``; schema in ``tpuops.contract.status``), ``logs/``, ``ckpt/``, ``tb/``, ``model/``
and, when asked through ``profile.json``, ``profiles/`` under ``runs/<run>/`` (layout in ``paths``; profiles in
``profiles``), and after the save on a preemption notice the
wake marker ``wake/<run>`` (``wake``). Exit codes and exit classes are ``tpuops.contract.exits``.

May import: the standard library, TensorFlow 2.9, numpy, orjson, ``tpuops.agent`` and ``tpuops.contract``.

``train`` runs the built-in loop (``train``: a plain or a compiled Keras model, fed by the
built-in parser or the user's ``input_fn``) or, in script mode, the user's own program
(``script``), which can use the helper module shipped in ``userlib`` (``tpuops_helper``).
"""
