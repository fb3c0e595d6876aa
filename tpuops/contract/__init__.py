"""The contract between the agent and the control plane: what each side writes and the other reads.

The agent (``tpuops.agent``, on the TPU VM under TensorFlow 2.9 and Python 3.8) and the control plane
(Python >= 3.10) share no interpreter and talk only through the store (docs/design.md, "Two planes").
What they must agree on is defined here once, and both sides import it:

- ``runspec``: ``runs/<run>/spec.json``, the run spec the control plane writes and the agent obeys;
- ``status``: ``runs/<run>/status.json``, the document the agent rewrites and the control plane reads
  (``tpuops.runs.models.AgentStatus`` is the reader; tests/contract/test_contract.py checks it field by field);
- ``exits``: the exit codes and exit classes an agent process ends with (and the one enum base);
- ``timing``: where an attempt's seconds went (the ``attempts`` entries of ``status.json``);
- ``wake``: the wake marker ``wake/<run>`` a preempted agent leaves after its save, and the node
  metadata attribute naming the job to start;
- ``interval``: the checkpoint interval rule (Young/Daly) the agent applies and a plan forecasts;
- ``profiles``: a profile request (``runs/<run>/profile.json``) and the captures' folder, record and states.

Everything here runs on both sides, so it is Python 3.8 syntax (``ruff.toml`` lints it as 3.8), and it
touches no store: the agent reads and writes the documents with TensorFlow, the control plane through
``tpuops.store``; here is only what they hold. The agent's bundle ships this package beside ``tpuops/agent``
(``tpuops.core.resources.agent_sources``).

May import: the standard library and ``tpuops.contract`` itself; nothing else, from tpuops or beyond.
"""
