"""The two drivers: execute one :class:`~._batch.Batch` on a psycopg connection, sync or
async. They hold no logic of the saver's own; ``saver.py`` runs operations through them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, nullcontext
from typing import Any

import psycopg
from psycopg import AsyncConnection, Connection
from psycopg.rows import tuple_row

from langgraph_deterministic.checkpointer._batch import Batch, Results

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
            cur.execute(st.sql, st.params, prepare=st.prepare)
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
    cursors = []
    # Statements up to a pipeline's one Sync form one implicit transaction: if any fails,
    # Postgres rolls them all back. That is the atomicity we need, in one round trip;
    # psycopg's transaction() inside a pipeline would add three more syncs (BEGIN, COMMIT,
    # exit). Only a batch that sets an isolation level needs an explicit transaction.
    in_callers_pipeline = in_pipeline(conn)
    with conn.pipeline() as pipe:
        if batch.isolation and in_callers_pipeline:
            pipe.sync()  # see in_pipeline
        with transaction(conn, batch) if batch.isolation else nullcontext():
            for st in statements:
                cur = conn.cursor(binary=True, row_factory=tuple_row)
                if st.many:
                    cur.executemany(st.sql, st.params)  # type: ignore[arg-type]
                else:
                    cur.execute(st.sql, st.params, prepare=st.prepare)
                cursors.append(cur)
    return [
        cur.fetchall() if st.fetch else None for cur, st in zip(cursors, statements, strict=True)
    ]


async def aexecute(conn: AsyncConnection[Any], batch: Batch) -> Results:
    statements = batch.statements
    if batch.wait is not None:
        async for _ in conn.notifies(timeout=batch.wait[1], stop_after=1):
            pass
        return []
    if not batch.atomic and len(statements) == 1 and batch.pipeline:
        (st,) = statements
        async with conn.cursor(binary=True, row_factory=tuple_row) as cur:
            await cur.execute(st.sql, st.params, prepare=st.prepare)
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
    cursors = []
    # One implicit transaction per pipeline sync; see execute.
    in_callers_pipeline = in_pipeline(conn)
    async with conn.pipeline() as pipe:
        if batch.isolation and in_callers_pipeline:
            await pipe.sync()  # see in_pipeline
        async with atransaction(conn, batch) if batch.isolation else nullcontext():
            for st in statements:
                cur = conn.cursor(binary=True, row_factory=tuple_row)
                if st.many:
                    await cur.executemany(st.sql, st.params)  # type: ignore[arg-type]
                else:
                    await cur.execute(st.sql, st.params, prepare=st.prepare)
                cursors.append(cur)
    return [
        await cur.fetchall() if st.fetch else None
        for cur, st in zip(cursors, statements, strict=True)
    ]


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
