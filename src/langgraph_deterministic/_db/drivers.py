"""The two drivers: execute one :class:`~._batch.Batch` on a psycopg connection, sync or
async. They hold no logic of the saver's own; ``saver.py`` runs operations through them.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, nullcontext, suppress
from typing import Any, overload

import psycopg
from psycopg import AsyncConnection, Connection
from psycopg.rows import tuple_row

from langgraph_deterministic._db.batch import Batch, Results, Statement

# Every cursor is opened with our own row factory: the core reads rows as tuples whatever
# the connection's own factory is (LangGraph documents dict_row; namedtuple_row, class_row
# and the default must work the same).


def execute(conn: Connection[Any], batch: Batch) -> Results:
    statements = batch.statements
    if batch.wait is not None:
        for _ in conn.notifies(timeout=batch.wait[1], stop_after=1):
            pass
        return []
    if not batch.atomic and len(statements) == 1 and batch.pipeline:
        (st,) = statements
        with conn.cursor(binary=True, row_factory=tuple_row) as cur:
            cur.execute(sql_of(st), st.params, prepare=st.prepare)
            return [cur.fetchall() if st.fetch else None]
    if not batch.pipeline:
        # DDL and statements that must not run inside a pipeline (multi-statement
        # migration files, CREATE INDEX CONCURRENTLY). Text cursor: simple protocol.
        results: Results = []
        with (
            transaction(conn, batch) if batch.atomic else nullcontext(),
            conn.cursor(row_factory=tuple_row) as cur,
        ):
            for st in statements:
                cur.execute(st.sql, st.params, prepare=st.prepare)
                results.append(cur.fetchall() if st.fetch else None)
        return results
    # Statements up to a pipeline's one Sync form one implicit transaction: if any fails,
    # Postgres rolls them all back. That is the atomicity we need, in one round trip;
    # psycopg's transaction() inside a pipeline would add three more syncs (BEGIN, COMMIT,
    # exit). Only a batch that sets an isolation level needs an explicit transaction.
    in_callers_pipeline = batch.isolation is not None and in_pipeline(conn)
    try:
        return _pipelined(conn, batch, in_callers_pipeline)
    except psycopg.Error:
        if _may_be_desynced(conn):
            _resync_prepared(conn)
        raise


def _pipelined(conn: Connection[Any], batch: Batch, in_callers_pipeline: bool) -> Results:
    statements = batch.statements
    fetching: list[psycopg.Cursor[Any]] = []
    shared: psycopg.Cursor[Any] | None = None
    with conn.pipeline() as pipe:
        if in_callers_pipeline:
            pipe.sync()  # see in_pipeline
        with transaction(conn, batch) if batch.isolation else nullcontext():
            for st, params in _merged(statements):
                if st.fetch:
                    cur = conn.cursor(binary=True, row_factory=tuple_row)
                    fetching.append(cur)
                elif shared is None:
                    cur = shared = _writer(conn)
                else:
                    cur = shared
                if st.many:
                    cur.executemany(sql_of(st), params)
                else:
                    cur.execute(sql_of(st), st.params, prepare=st.prepare)
    rows = iter(fetching)
    return [next(rows).fetchall() if st.fetch else None for st in statements]


async def aexecute(conn: AsyncConnection[Any], batch: Batch) -> Results:
    statements = batch.statements
    if batch.wait is not None:
        async for _ in conn.notifies(timeout=batch.wait[1], stop_after=1):
            pass
        return []
    if not batch.atomic and len(statements) == 1 and batch.pipeline:
        (st,) = statements
        async with conn.cursor(binary=True, row_factory=tuple_row) as cur:
            await cur.execute(sql_of(st), st.params, prepare=st.prepare)
            return [await cur.fetchall() if st.fetch else None]
    if not batch.pipeline:
        results: Results = []
        async with (
            atransaction(conn, batch) if batch.atomic else nullcontext(),
            conn.cursor(row_factory=tuple_row) as cur,
        ):
            for st in statements:
                await cur.execute(st.sql, st.params, prepare=st.prepare)
                results.append(await cur.fetchall() if st.fetch else None)
        return results
    # One implicit transaction per pipeline sync; see execute.
    in_callers_pipeline = batch.isolation is not None and in_pipeline(conn)
    try:
        return await _apipelined(conn, batch, in_callers_pipeline)
    except psycopg.Error:
        if _may_be_desynced(conn):
            await _aresync_prepared(conn)
        raise


async def _apipelined(
    conn: AsyncConnection[Any], batch: Batch, in_callers_pipeline: bool
) -> Results:
    statements = batch.statements
    fetching: list[psycopg.AsyncCursor[Any]] = []
    shared: psycopg.AsyncCursor[Any] | None = None
    async with conn.pipeline() as pipe:
        if in_callers_pipeline:
            await pipe.sync()  # see in_pipeline
        async with atransaction(conn, batch) if batch.isolation else nullcontext():
            for st, params in _merged(statements):
                if st.fetch:
                    acur = conn.cursor(binary=True, row_factory=tuple_row)
                    fetching.append(acur)
                elif shared is None:
                    acur = shared = _writer(conn)
                else:
                    acur = shared
                if st.many:
                    await acur.executemany(sql_of(st), params)
                else:
                    await acur.execute(sql_of(st), st.params, prepare=st.prepare)
    rows = iter(fetching)
    return [await next(rows).fetchall() if st.fetch else None for st in statements]


# A failed pipeline and psycopg's prepared statements (psycopg 3.1 to 3.3 at least).
# psycopg prepares a statement server-side once it has run prepare_threshold times: in a
# pipeline it queues the Parse that creates the statement right before its execution,
# and records the name as prepared at once. Its check of that Parse's outcome runs only
# for a statement it had never seen before (prepare_threshold 0, or prepare=True); for
# one it had counted, the name is taken as prepared whatever happens. When an earlier
# statement of the same pipeline sync fails (a refusal of ours: LG409, LG410, LG413...),
# Postgres skips every later message up to the sync, that Parse included, so the server
# never has the statement while psycopg believes it does: every later execution of that
# statement on the connection fails with InvalidSqlStatementName ("prepared statement
# "_pg3_0" does not exist"), and the pool hands the broken connection on. Whether it
# happens depends on which execution a refusal lands on (the 4th of a statement with the
# threshold at 3, say), so one lost race could poison a process's connections.
#
# After a failed pipeline on a connection that is still usable, both sides forget their
# prepared statements: DEALLOCATE ALL on the server, and psycopg clears its cache when it
# sees that command complete (it does so for DEALLOCATE ALL / DISCARD ALL, as the
# server's statements are gone). psycopg checks the command tag only the first time it
# sees a query text, so the text differs each time (a comment). One round trip, on the
# error path only; statements are prepared again as they are used.

_RESYNC = itertools.count()


def _may_be_desynced(conn: Connection[Any] | AsyncConnection[Any]) -> bool:
    return (
        conn.prepare_threshold is not None
        and not conn.closed
        and conn.info.pipeline_status == psycopg.pq.PipelineStatus.OFF
        and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    )


def _resync_sql() -> bytes:
    return f"DEALLOCATE ALL -- lgd {next(_RESYNC)}".encode("ascii")


def _resync_prepared(conn: Connection[Any]) -> None:
    # A connection that cannot run it is broken anyway: the first error stands.
    with suppress(psycopg.Error):
        conn.execute(_resync_sql(), prepare=False)


async def _aresync_prepared(conn: AsyncConnection[Any]) -> None:
    with suppress(psycopg.Error):
        await conn.execute(_resync_sql(), prepare=False)


# Client CPU per batch (psycopg's Python is most of a write's cost on this side): the
# statements that fetch nothing share one cursor (its adapters and dumper cache), runs of
# executemany of the same SQL go out as one, and the SQL text is passed as bytes that
# keep their hash (psycopg encodes a str query, and hashes the result for its query
# cache and prepared statements, on every execute). None of it changes what is sent.


def _merged(statements: Sequence[Statement]) -> Iterator[tuple[Statement, Any]]:
    """``(statement, params)`` in order, adjacent ``many`` statements of the same SQL that
    fetch nothing joined into one (a fan-out's tasks' pending writes)."""
    i, n = 0, len(statements)
    while i < n:
        st = statements[i]
        i += 1
        if not st.many or st.fetch:
            yield st, st.params
            continue
        params: Any = st.params
        while i < n and statements[i].many and not statements[i].fetch:
            if statements[i].sql != st.sql:
                break
            if params is st.params:
                params = list(params)  # type: ignore[arg-type]
            params.extend(statements[i].params)
            i += 1
        yield st, params


# The cursor of a connection's statements that fetch nothing, kept on the connection (an
# attribute of ours: in a dict it would keep the connection alive, a cursor refers to its
# connection): a new cursor per batch copies the adapters map and looks every parameter's
# dumper up again. Between batches it holds only command statuses (fetching statements
# get cursors of their own, dropped with their rows); a connection runs one batch at a
# time (a pool's checkout, or the saver's lock on a shared connection). Connection and
# cursor refer to each other: a connection dropped without close() is freed by the
# garbage collector, not at once (close() closes its socket either way). Any cache of
# the cursor makes that cycle (the cursor refers to its connection); a new cursor per
# batch instead cost 0.8% more client instructions per graph run (54.55M vs 54.08M
# Ir/run, bench_saver's graph, async, under callgrind).
_WRITER = "_lgd_writer"


@overload
def _writer(conn: Connection[Any]) -> psycopg.Cursor[Any]: ...
@overload
def _writer(conn: AsyncConnection[Any]) -> psycopg.AsyncCursor[Any]: ...
def _writer(
    conn: Connection[Any] | AsyncConnection[Any],
) -> psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]:
    # opening a cursor does no I/O, on either kind of connection
    cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any] | None = getattr(conn, _WRITER, None)
    if cur is None or cur.closed:
        cur = conn.cursor(binary=True, row_factory=tuple_row)
        setattr(conn, _WRITER, cur)
    return cur


_SQL_BYTES: dict[str, bytes] = {}


def sql_of(st: Statement) -> Any:
    """The statement's SQL as bytes (ASCII text only: it encodes alike in every client
    encoding), one object per text so its hash is computed once."""
    sql = st.sql
    if (data := _SQL_BYTES.get(sql)) is None:
        if not sql.isascii() or len(_SQL_BYTES) > 1000:
            return sql
        data = _SQL_BYTES.setdefault(sql, sql.encode("ascii"))
    return data


def in_pipeline(conn: Connection[Any] | AsyncConnection[Any]) -> bool:
    """Whether the caller holds the connection in pipeline mode (PostgresSaver's
    ``pipe=`` setup). Its unsynced statements leave an implicit transaction open, after
    which ``SET TRANSACTION ISOLATION LEVEL`` fails: a batch that sets one syncs first."""
    return conn.info.pipeline_status != psycopg.pq.PipelineStatus.OFF


@contextmanager
def transaction(conn: Connection[Any], batch: Batch) -> Iterator[None]:
    with conn.transaction():
        if batch.isolation:
            conn.execute(f"SET TRANSACTION ISOLATION LEVEL {batch.isolation.upper()}")
        yield


@asynccontextmanager
async def atransaction(conn: AsyncConnection[Any], batch: Batch) -> AsyncIterator[None]:
    async with conn.transaction():
        if batch.isolation:
            await conn.execute(f"SET TRANSACTION ISOLATION LEVEL {batch.isolation.upper()}")
        yield
