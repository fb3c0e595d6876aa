"""Notifications: tell the user, by webhook or email, when a run or a sweep needs them, exactly once.

The job: the controller pass (``tpuops.controller.reconcile``) and the sweep pass (``tpuops.sweeps.advance``)
ask ``rules`` what the changes they just decided are worth telling (a pure function: memory and events in,
notices out, no I/O); the notices are written into the run's memory or the sweep's state together with the
decision (write-ahead), and ``outbox`` delivers them after the pass's own actions, each target with a short
timeout, then marks each delivery sent and writes the memory again.

Invariants:

- Exactly once. A notice exists only in a memory written by compare-and-swap under the run's (or sweep's)
  lease, so two controllers never both decide it, and only the lease holder delivers. A pass killed after the
  write-ahead and before sending leaves it pending: the next pass sends it. A pass killed between sending and
  marking may send it again: the one allowed duplicate, carrying the same idempotency key (the
  ``Idempotency-Key`` header and the body's ``idempotency_key`` field), so a receiver can drop it.
- The key is derived from what was decided (subject, kind, the event's time), never from the attempt.
- Delivery never blocks recovery or teardown: it runs after the run's actions, bounded per target
  (``NotifySettings.timeout_s``) and per pass (``deliver_budget_s``, whatever the receivers do), and a failure
  of any kind only schedules a retry on a later pass (backoff, then give-up after ``give_up_after_s``),
  recorded as an event: no notice, record or target ever raises into the pass (``outbox.ISOLATED_DELIVERY``).
- Secrets (webhook URLs, SMTP passwords) live only in ``Settings`` (``SecretStr``, private attributes); a notice,
  an event, a memory, a spec or a record holds target names, never a URL or a password.

May import: pydantic, the standard library (``urllib``, ``smtplib``, ``email``), and from tpuops only
``tpuops.core``, ``tpuops.runs`` (models), ``tpuops.config`` (the settings types) and ``tpuops.billing``
(the deadline rule's wording). What a notice is made
of (kinds, targets, notices, deliveries) is vocabulary in ``tpuops.core.notices``, so that ``tpuops.runs``,
``tpuops.config`` and the sweeps may hold notices and settings without importing this package.
"""
