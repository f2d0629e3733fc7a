"""What the Postgres server did for a piece of work, in counts that do not move with load.

:func:`measure` brackets a callable with two readings of the server's own counters and
returns a :class:`ServerWork`: WAL bytes (the insert position's advance, server-wide, so the
server should be idle otherwise), rows inserted / updated / deleted and buffers touched
(``pg_stat_user_tables``, ``pg_statio_user_tables``: this database's tables and their
indexes and TOAST), and, when the server loads ``pg_stat_statements``, the statements it
ran and their shared buffers. None of this needs a server setting; the table counters need
PostgreSQL 15+ (``pg_stat_force_next_flush``), older servers give ``None`` for them.

Backends publish their table counters at most once a second unless told to: the work's
connections must call :func:`flush` (``pg_stat_force_next_flush()``) when they are done, as
the ``flush`` callable passed to :func:`measure` does. Used by the server-work tests and by
the benchmarks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

_TABLES = """
SELECT coalesce(sum(t.n_tup_ins), 0), coalesce(sum(t.n_tup_upd), 0),
       coalesce(sum(t.n_tup_del), 0),
       coalesce(sum(coalesce(s.heap_blks_hit, 0) + coalesce(s.heap_blks_read, 0)
                  + coalesce(s.idx_blks_hit, 0) + coalesce(s.idx_blks_read, 0)
                  + coalesce(s.toast_blks_hit, 0) + coalesce(s.toast_blks_read, 0)
                  + coalesce(s.tidx_blks_hit, 0) + coalesce(s.tidx_blks_read, 0)), 0)
FROM pg_stat_user_tables t JOIN pg_statio_user_tables s USING (relid)
"""
_STATEMENTS = """
SELECT coalesce(sum(calls), 0),
       coalesce(sum(shared_blks_hit + shared_blks_read + shared_blks_dirtied), 0)
FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database
                                      WHERE datname = current_database())
  AND query NOT LIKE '%pg_stat_%' AND query NOT LIKE '%pg_current_wal%'
"""


@dataclass(frozen=True)
class ServerWork:
    """The server's work between two readings (``None``: not measurable on this server)."""

    wal_bytes: int
    inserted: int | None = None
    updated: int | None = None
    deleted: int | None = None
    buffers: int | None = None  # heap + index + TOAST blocks hit or read
    statements: int | None = None  # pg_stat_statements calls (when loaded)
    statement_buffers: int | None = None  # their shared blocks hit + read + dirtied
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rows(self) -> int | None:
        if self.inserted is None or self.updated is None or self.deleted is None:
            return None
        return self.inserted + self.updated + self.deleted

    def per(self, n: float) -> dict[str, float | None]:
        """Each count divided by ``n`` (per run, per superstep)."""
        out: dict[str, float | None] = {}
        for name in ("wal_bytes", "inserted", "updated", "deleted", "rows", "buffers",
                     "statements", "statement_buffers"):  # fmt: skip
            value = getattr(self, name)
            out[name] = None if value is None else value / n
        return out


def has_table_counters(conn: psycopg.Connection[Any]) -> bool:
    return conn.info.server_version >= 150000


def has_statements(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'").fetchone()
    if row is None:
        return False
    try:
        conn.execute("SELECT 1 FROM pg_stat_statements LIMIT 1")
    except psycopg.Error:  # created but not in shared_preload_libraries
        conn.rollback()
        return False
    return True


def flush(conn: Any) -> Any:
    """Publish ``conn``'s backend table counters now (PostgreSQL 15+; a no-op before).
    Returns what ``execute`` returns, so an async connection's call can be awaited."""
    if conn.info.server_version < 150000:
        return conn.execute("SELECT 1")
    return conn.execute("SELECT pg_stat_force_next_flush()")


def _reading(conn: psycopg.Connection[Any], tables: bool, statements: bool) -> tuple[Any, ...]:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
    assert row is not None
    lsn = row[0]
    counts: tuple[Any, ...] = (None, None, None, None)
    if tables:
        counts = tuple(int(v) for v in conn.execute(_TABLES).fetchone() or ())
    stmts: tuple[Any, ...] = (None, None)
    if statements:
        stmts = tuple(int(v) for v in conn.execute(_STATEMENTS).fetchone() or ())
    return (lsn, *counts, *stmts)


def measure(dsn: str, work: Callable[[], Any]) -> ServerWork:
    """The server's work done by ``work()`` in ``dsn``'s database. ``work`` must leave its
    connections' counters published (:func:`flush`) before it returns."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = has_table_counters(conn)
        statements = has_statements(conn)
        before = _reading(conn, tables, statements)
        work()
        after = _reading(conn, tables, statements)
        (wal,) = conn.execute(
            "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)::bigint", (after[0], before[0])
        ).fetchone() or (0,)

    def delta(i: int) -> int | None:
        return None if after[i] is None else after[i] - before[i]

    return ServerWork(
        wal_bytes=int(wal),
        inserted=delta(1),
        updated=delta(2),
        deleted=delta(3),
        buffers=delta(4),
        statements=delta(5),
        statement_buffers=delta(6),
    )


__all__ = ["ServerWork", "flush", "has_statements", "has_table_counters", "measure"]
