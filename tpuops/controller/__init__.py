"""The reconcile controller (docs/design.md, "Control flow: declare, then reconcile").

``memory`` is what the controller remembers of each run (in the store, so any controller can
pick it up), ``decide`` turns one run's desired and observed state into actions without any
I/O, ``lease`` keeps two controllers off the same run, and ``reconcile`` runs a pass: read,
decide, apply. A pass may be killed at any line; the next one finishes the job.
"""
