"""``langgraph-deterministic uninstall``: remove what our migrations added, back to
PostgresSaver.

What goes is read from the catalog, not from a list kept by hand: every table, view,
function, sequence, type and trigger of ours (named ``lgd_*``) in the schema of the
checkpoint tables, our migrations' bookkeeping table, the indexes our migration files
create on the peer's tables that PostgresSaver's own migrations do not (the run id index on
``checkpoints``), and the lz4 compression our migrations set on the peer's columns.

What stays is what PostgresSaver needs, as it needs it: its four tables with every row
(threads written through our saver read and continue under PostgresSaver), its own indexes
and its ``checkpoint_migrations`` rows, which match its tables (so ``PostgresSaver.setup()``
then has nothing or only its own newer steps to do).

Online, as the migrations are (:mod:`~langgraph_deterministic._db.migrate`): the
same advisory lock (a ``migrate`` and an ``uninstall`` never run at once), every statement
under a short ``lock_timeout``, retried with backoff, then a
:class:`~langgraph_deterministic.errors.MigrationLockTimeoutError` naming the oldest open
transactions. The bookkeeping table goes first: an uninstall stopped halfway leaves a
database that ``migrate`` completes again and ``uninstall`` finishes removing.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Final

import psycopg
from psycopg import sql

from langgraph_deterministic._db import migrate as _migrate
from langgraph_deterministic._db.translate import sentence
from langgraph_deterministic._dsn import chained, scrub
from langgraph_deterministic.errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    DeterministicError,
    MigrationLockTimeoutError,
)
from langgraph_deterministic.ops import _connect

PREFIX: Final = "lgd_"

_INDEX = re.compile(
    r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+(?:CONCURRENTLY\s+)?(?:IF\s+NOT\s+EXISTS\s+)?(\w+)\s+ON\s+"
    r"(?:ONLY\s+)?(\w+)",
    re.IGNORECASE,
)
_TABLE = re.compile(r"CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.IGNORECASE)


class UninstallRefusedError(DeterministicError):
    """Uninstall would pull the tables from under live workers of ours (the fix is named)."""


@dataclass(frozen=True, slots=True)
class Step:
    """One statement of the uninstall; ``transactional=False`` runs outside a transaction
    (``DROP INDEX CONCURRENTLY`` refuses one)."""

    what: str
    sql: str
    transactional: bool = True


@dataclass(slots=True)
class UninstallReport:
    dry_run: bool
    steps: list[Step] = field(default_factory=list)
    attempts: list[int] = field(default_factory=list)
    seconds: float = 0.0
    live_leases: list[tuple[str, str]] = field(default_factory=list)  # (thread, run), forced


def _peer() -> tuple[set[str], set[str]]:
    """The tables and indexes PostgresSaver's own migrations create."""
    from langgraph.checkpoint.postgres.base import BasePostgresSaver

    text = "\n".join(BasePostgresSaver.MIGRATIONS)
    return {t.lower() for t in _TABLE.findall(text)}, {i.lower() for i, _ in _INDEX.findall(text)}


def our_peer_indexes() -> set[str]:
    """Indexes our migration files create on the peer's tables that the peer does not."""
    peer_tables, peer_indexes = _peer()
    return {
        index.lower()
        for m in _migrate.discover()
        for index, table in _INDEX.findall(m.sql)
        if table.lower() in peer_tables and index.lower() not in peer_indexes
    }


_SCHEMA_SQL = """
SELECT coalesce(
    (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = to_regclass(%s)),
    (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = to_regclass('checkpoints')),
    current_schema())
"""
_RELATIONS_SQL = """
SELECT c.relkind::text, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(ns)s AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
  AND (c.relname LIKE 'lgd\\_%%' OR c.relname = %(book)s)
ORDER BY c.relname
"""
_FUNCTIONS_SQL = """
SELECT p.prokind::text, p.proname, pg_get_function_identity_arguments(p.oid)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = %(ns)s AND p.proname LIKE 'lgd\\_%%'
ORDER BY p.proname, 3
"""
_TYPES_SQL = """
SELECT t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
WHERE n.nspname = %(ns)s AND t.typname LIKE 'lgd\\_%%' AND t.typelem = 0
  AND (t.typrelid = 0 OR (SELECT relkind FROM pg_class WHERE oid = t.typrelid) = 'c')
ORDER BY 1
"""
_TRIGGERS_SQL = """
SELECT c.relname, g.tgname FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(ns)s AND NOT g.tgisinternal AND g.tgname LIKE 'lgd\\_%%'
  AND c.relname = ANY(%(peer)s)
ORDER BY 1, 2
"""
_INDEXES_SQL = """
SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(ns)s AND c.relkind = 'i' AND c.relname = ANY(%(names)s)
ORDER BY 1
"""
_LZ4_SQL = """
SELECT c.relname, a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(ns)s AND c.relname = ANY(%(peer)s) AND a.attnum > 0
  AND NOT a.attisdropped AND a.attcompression::text = 'l'
ORDER BY 1, 2
"""
_LIVE_LEASES_SQL = sql.SQL(
    "SELECT thread_id, run_id FROM {} WHERE ended IS NULL AND expires_at > now() "
    "ORDER BY thread_id LIMIT 20"
)


def plan(conn: psycopg.Connection[Any]) -> list[Step]:
    """The statements that remove everything of ours from the database at ``conn``, in
    the order they run (read from the catalog; empty when nothing of ours is left)."""
    book = _migrate.VERSION_TABLE
    (ns,) = conn.execute(_SCHEMA_SQL, (book,)).fetchone() or ("public",)
    peer_tables = sorted(_peer()[0])
    args = {"ns": ns, "book": book, "peer": peer_tables}
    steps: list[Step] = []

    def name(*parts: str) -> str:
        return sql.Identifier(ns, *parts).as_string(conn)

    relations = conn.execute(_RELATIONS_SQL, args).fetchall()
    if any(r == book for _, r in relations):  # first: a half-done uninstall reads as such
        steps.append(Step("our migrations' bookkeeping", f"DROP TABLE IF EXISTS {name(book)}"))
    for (index,) in conn.execute(
        _INDEXES_SQL, {"ns": ns, "names": sorted(our_peer_indexes())}
    ).fetchall():
        steps.append(
            Step(f"our index {index} on the peer's table",
                 f"DROP INDEX CONCURRENTLY IF EXISTS {name(index)}", transactional=False)
        )  # fmt: skip
    for table, trigger in conn.execute(_TRIGGERS_SQL, args).fetchall():
        steps.append(Step(f"our trigger {trigger} on {table}",
                          f"DROP TRIGGER IF EXISTS {sql.Identifier(trigger).as_string(conn)} "
                          f"ON {name(table)}"))  # fmt: skip
    functions = conn.execute(_FUNCTIONS_SQL, args).fetchall()
    if functions:
        routines = ", ".join(f"{name(f)}({a})" for _, f, a in functions)
        steps.append(
            Step(f"our {len(functions)} function(s)", f"DROP ROUTINE IF EXISTS {routines}")
        )
    kinds = {"v": "VIEW", "m": "MATERIALIZED VIEW", "f": "FOREIGN TABLE"}
    for kind, keyword in kinds.items():
        found = [r for k, r in relations if k == kind]
        if found:
            steps.append(Step(f"our {keyword.lower()}(s)",
                              f"DROP {keyword} IF EXISTS {', '.join(name(r) for r in found)}"))  # fmt: skip
    tables = [r for k, r in relations if k in ("r", "p") and r != book]
    if tables:
        steps.append(Step(f"our {len(tables)} table(s) and their rows",
                          f"DROP TABLE IF EXISTS {', '.join(name(t) for t in tables)}"))  # fmt: skip
    sequences = [r for k, r in relations if k == "S"]
    if sequences:  # most go with the table that owns them: IF EXISTS
        steps.append(Step("our sequence(s)",
                          f"DROP SEQUENCE IF EXISTS {', '.join(name(s) for s in sequences)}"))  # fmt: skip
    types = [t for (t,) in conn.execute(_TYPES_SQL, args).fetchall()]
    if types:
        steps.append(
            Step("our type(s)", f"DROP TYPE IF EXISTS {', '.join(name(t) for t in types)}")
        )
    for table, column in conn.execute(_LZ4_SQL, args).fetchall():
        ident = sql.Identifier(column).as_string(conn)
        steps.append(
            Step(f"lz4 compression of {table}.{column} back to the server's default (values "
                 "stored meanwhile stay lz4 and readable; nothing is rewritten)",
                 f"ALTER TABLE {name(table)} ALTER COLUMN {ident} SET COMPRESSION default")
        )  # fmt: skip
    return steps


def uninstall(
    dsn: str,
    *,
    dry_run: bool = False,
    force: bool = False,
    lock_timeout: float = _migrate.DEFAULT_LOCK_TIMEOUT,
    lock_retries: int = _migrate.DEFAULT_LOCK_RETRIES,
    progress: Callable[[Step, int, float], None] | None = None,
) -> UninstallReport:
    """Remove every object our migrations added to the database at ``dsn`` (``dry_run``:
    only return the plan). Refuses while runs of ours hold live thread leases, unless
    ``force``: their workers would fail on their next write. ``progress(step, attempts,
    seconds)`` is called after each statement."""
    policy = _migrate.LockPolicy(timeout=lock_timeout, retries=lock_retries)
    report = UninstallReport(dry_run=dry_run)
    started = time.perf_counter()
    with _connect.connect(dsn, application_name="langgraph-deterministic uninstall") as conn:
        try:
            if dry_run:
                report.steps = plan(conn)
                report.live_leases = _live_leases(conn)
                return report
            _direct_only(conn)
            with _advisory_lock(conn, policy):
                report.live_leases = _live_leases(conn)
                if report.live_leases and not force:
                    shown = ", ".join(f"{t} (run {r})" for t, r in report.live_leases[:5])
                    raise UninstallRefusedError(
                        f"{len(report.live_leases)} thread(s) are leased by runs of ours "
                        f"still in progress: {shown}. Their workers use our tables and "
                        "functions on every write. Fix: stop those workers (or switch them "
                        "to PostgresSaver) and let their runs end or their leases expire, "
                        "then run uninstall again; --force removes everything now, and "
                        "those workers fail on their next write. Nothing was changed."
                    )
                report.steps = plan(conn)
                for step in report.steps:
                    t0 = time.perf_counter()
                    attempts = _run(conn, step, policy)
                    report.attempts.append(attempts)
                    if progress is not None:
                        progress(step, attempts, time.perf_counter() - t0)
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailableError(
                f"uninstall lost its connection: {sentence(scrub(str(exc), dsn))} Each statement ran in "
                "its own transaction: what ran stays removed. Fix: run uninstall again; it "
                "removes what is left."
            ) from chained(exc, dsn)
        except psycopg.errors.DependentObjectsStillExist as exc:
            raise UninstallRefusedError(
                f"an object of yours depends on one of ours: {sentence(str(exc))} Fix: drop "
                "or change that object (a view or foreign key on an lgd_ table), then run "
                "uninstall again; the statements before this one stay applied."
            ) from exc
        except psycopg.errors.InsufficientPrivilege as exc:
            raise ConfigurationError(
                f"uninstall is not permitted: {sentence(str(exc))} Fix: run it as the role "
                "that owns the tables (the one that ran the migrations)."
            ) from exc
    report.seconds = time.perf_counter() - started
    return report


def _live_leases(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    row = conn.execute("SELECT to_regclass('lgd_leases') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return []
    return [
        (str(t), str(r))
        for t, r in conn.execute(_LIVE_LEASES_SQL.format(sql.Identifier("lgd_leases")))
    ]


def _direct_only(conn: psycopg.Connection[Any]) -> None:
    row = conn.execute(_migrate.BACKEND_PID_SQL).fetchone()
    if not row or row[0] != conn.info.backend_pid:
        raise ConfigurationError(
            "uninstall cannot run through a connection pooler (PgBouncer, RDS Proxy, "
            "Supavisor...): it holds the migrations' session-level advisory lock, which "
            "transaction pooling would leave on a server connection other clients reuse. "
            "Fix: pass a direct DSN to Postgres. Nothing was changed."
        )


class _advisory_lock:
    """The migrations' advisory lock, polled as ``_migrate.locked`` polls it, with the
    session's lock_timeout set to the policy's; both put back on exit."""

    def __init__(self, conn: psycopg.Connection[Any], policy: _migrate.LockPolicy) -> None:
        self.conn, self.policy = conn, policy
        self.previous = "0"

    def __enter__(self) -> None:
        key = (_migrate.ADVISORY_LOCK_KEY,)
        row = self.conn.execute(_migrate.GET_LOCK_TIMEOUT_SQL).fetchone()
        self.previous = row[0] if row else "0"
        for _ in range(_migrate.LOCK_WAIT_POLLS):
            got = self.conn.execute(_migrate.TRY_LOCK_SQL, key).fetchone()
            if got and got[0]:
                break
            self.conn.execute(_migrate.LOCK_POLL_SQL)
        else:
            raise ConfigurationError(
                "another process has held the migrations' advisory lock for 5 minutes (a "
                "migrate, setup() or uninstall). Fix: wait for it, or look for a stuck one "
                "in pg_stat_activity, then run uninstall again. Nothing was changed."
            )
        self.conn.execute(_migrate.SET_LOCK_TIMEOUT_SQL, (self.policy.timeout_setting,))

    def __exit__(self, *exc: object) -> None:
        with suppress(psycopg.Error):  # if the session is gone, its lock went with it
            self.conn.execute(
                "SELECT set_config('lock_timeout', %s, false), pg_advisory_unlock(%s)",
                (self.previous, _migrate.ADVISORY_LOCK_KEY),
            )


def _run(conn: psycopg.Connection[Any], step: Step, policy: _migrate.LockPolicy) -> int:
    """Run ``step``; on a lock timeout pause and run it again, as migrations do."""
    for attempts, pause in enumerate([*policy.pauses(), None], 1):
        try:
            if step.transactional:
                with conn.transaction():
                    conn.execute(f"SET LOCAL lock_timeout = '{policy.timeout_setting}'")
                    conn.execute(step.sql)
            else:
                conn.execute(step.sql)
            return attempts
        except psycopg.errors.LockNotAvailable as exc:
            if pause is None:
                raise _gave_up(conn, step, policy, attempts) from exc
            time.sleep(pause)
    raise AssertionError("unreachable")  # pragma: no cover


def _gave_up(
    conn: psycopg.Connection[Any], step: Step, policy: _migrate.LockPolicy, attempts: int
) -> MigrationLockTimeoutError:
    rows = conn.execute(_migrate.BLOCKERS_SQL).fetchall()
    blockers = (
        "; ".join(
            f"pid {pid} ({state}, transaction open {age} s: {query or '-'})"
            for pid, state, age, query in rows
        )
        or "none now (they have ended since)"
    )
    return MigrationLockTimeoutError(
        f"uninstall could not get the lock it needs to remove {step.what} "
        f"(`{step.sql[:100]}`) within lock_timeout {policy.timeout_setting}, {attempts} "
        f"times: other sessions keep transactions open on the table. Oldest open "
        f"transactions: {blockers}. This statement was rolled back; the ones before it stay "
        "applied. Fix: end or wait out those transactions, then run uninstall again (it "
        "removes what is left); or allow longer waits with --lock-timeout / --lock-retries."
    )
