"""Planning a launch: from an experiment file to a declared run with its node request.

``experiment`` is the experiment spec, ``usercode`` checks the user's code before launch,
``bundle`` packs the code, ``render`` writes the startup script, ``provision`` is the one
node-request builder (accelerator and capacity resolved once; it owns ``UpPlan``), ``planning``
learns what a plan rests on (hazard, recovery, lost-work rate) from history, and ``jobs`` puts
them together (``plan_train``, ``plan_infer``) and declares the run.

May import: ``tpuops.core``, ``tpuops.config``, ``tpuops.billing``, ``tpuops.providers``,
``tpuops.store``, ``tpuops.data``, ``tpuops.runs``, and the agent's shared contract
(``tpuops.contract.runspec``, ``interval``); never the ``session`` wiring (what it needs opened, the
front door hands in), nor the ``fleet``, which makes its plans real (it takes any plan with a
request and zones). The controller, the sweeps and the front door stand above it.
"""
