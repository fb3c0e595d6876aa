"""The core: the vocabulary and the boundaries every other part of tpuops shares.

What lives here: the failure taxonomy (``errors``), the injectable clock (``clock``), plain enums and
what a capacity move chose (``kinds``), the one retry policy (``retry``), naming rules (``naming``), how
figures print (``formats``), the one loader of user files (``documents``), package data (``resources``), what a
create request did (``create_result``) and what a notification is made of (``notices``: kinds, targets,
notices and their deliveries, the ``[notify]`` settings), the deadline of an action under a lease (``acting``) and
the named safety guards only a test may turn off (``guards``).

May import: the standard library, pydantic and PyYAML, ``tpuops.core`` itself, and the agent's contract
(``tpuops.contract``, standard library only: the one enum base, ``exits.ValueEnum``, and the wake job's
metadata key, ``wake``, which ``naming.MetadataKey`` lists). Nothing here
knows a cloud, a store, a run or a price, so every other wing can stand on it.
"""
