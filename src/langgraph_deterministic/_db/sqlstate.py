"""The SQLSTATEs our SQL raises, defined once for Python. The plpgsql functions raise
them with ``ERRCODE``; ``checkpointer._sqlstate`` turns them into our errors."""

from __future__ import annotations

# Raised by the arbitration functions (migration 0016's _v6 and their predecessors).
#: The parent checkpoint's child slot is taken (another attempt continued it first).
SQLSTATE_CHILD_TAKEN = "LG409"
#: Pending writes to a checkpoint another attempt has moved past.
SQLSTATE_STALE_WRITE = "LG410"
#: A checkpoint id that sorts before its parent's (the writer's clock is behind).
SQLSTATE_CLOCK_BEHIND = "LG411"
#: A Command applied again to a checkpoint its run wrote after applying it.
SQLSTATE_COMMAND_REPLAY = "LG412"
#: Another run took the thread's lease over.
SQLSTATE_LEASED = "LG413"
#: The parent checkpoint is not in the database (lost in a failover; migration 0025).
SQLSTATE_PARENT_LOST = "LG414"
#: All of the above; tests/checkpointer/test_schema.py checks the SQL raises no other.
SQLSTATES: frozenset[str] = frozenset(
    {SQLSTATE_CHILD_TAKEN, SQLSTATE_STALE_WRITE, SQLSTATE_CLOCK_BEHIND,
     SQLSTATE_COMMAND_REPLAY, SQLSTATE_LEASED, SQLSTATE_PARENT_LOST}
)  # fmt: skip
