"""The database layer: everything that talks to Postgres, and nothing of the contract.

- ``batch``: the sans-I/O protocol. An operation is a generator that yields
  :class:`~.batch.Batch` objects (one pipeline sync each, one transaction when it
  writes) and gets their rows back; ``run`` / ``arun`` drive one with a driver.
- ``drivers``: ``execute`` / ``aexecute``, one batch on a psycopg connection.
- ``queries``: the named statements of ``sql/queries.sql``, loaded once.
- ``sqlstate``: the SQLSTATEs our plpgsql raises (``LG409``-``LG414``).
- ``migrate``: the numbered migrations, applied once each, online.

The checkpointer, the runner and ops build on these modules; this package imports none
of theirs (only ``errors``). To run an operation on a saver's connections, the runner
calls ``DeterministicSaver.run_operation`` / ``arun_operation``.
"""
