"""The drop-in matrix: every way LangGraph users hand a saver its connections, with the row
factories and prepare thresholds they use, directly and through a real PgBouncer in
transaction pooling mode. Each cell runs setup, a graph run that stops at an interrupt, its
resume, the state history and list with filters (dropin.py).

{ConnectionPool, AsyncConnectionPool, Connection, AsyncConnection, DSN, from_conn_string}
(the last two through both APIs) x {tuple_row, dict_row} x {prepare_threshold 0, None}.
Through PgBouncer (1.18: no prepared statements in transaction mode) prepare_threshold is
None, as its docs and ours require. One database per module; the schema is migrated once
over a direct connection, so setup() through the bouncer finds it up to date.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest
from psycopg import AsyncConnection, Connection
from psycopg.rows import dict_row, tuple_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool
from tests.pgbouncer import PgBouncer

from langgraph_deterministic import DeterministicSaver

from .dropin import run_async, run_sync

SYNC_KINDS = ("ConnectionPool", "Connection", "DSN", "from_conn_string")
ASYNC_KINDS = ("AsyncConnectionPool", "AsyncConnection", "DSN-async", "from_conn_string-async")
ROWS: dict[str, Callable[..., Any]] = {"tuple_row": tuple_row, "dict_row": dict_row}
THRESHOLDS = {"prepare-0": 0, "prepare-None": None}


@pytest.fixture(scope="module")
def db(dsn: str) -> str:
    with DeterministicSaver(dsn) as saver:
        saver.setup()
    return dsn


@asynccontextmanager
async def open_saver(
    kind: str, dsn: str, rows: str, threshold: int | None
) -> AsyncIterator[DeterministicSaver]:
    """A saver over ``kind``, built the way a LangGraph user builds one."""
    kwargs: dict[str, Any] = {
        "autocommit": True,
        "prepare_threshold": threshold,
        "row_factory": ROWS[rows],
    }
    async with AsyncExitStack() as stack:
        if kind == "ConnectionPool":
            pool = stack.enter_context(ConnectionPool(dsn, min_size=1, max_size=4, kwargs=kwargs))
            yield DeterministicSaver(pool)
        elif kind == "AsyncConnectionPool":
            apool = AsyncConnectionPool(dsn, min_size=1, max_size=4, kwargs=kwargs)
            yield DeterministicSaver(await stack.enter_async_context(apool))
        elif kind == "Connection":
            yield DeterministicSaver(stack.enter_context(Connection.connect(dsn, **kwargs)))
        elif kind == "AsyncConnection":
            aconn = await AsyncConnection.connect(dsn, **kwargs)
            yield DeterministicSaver(await stack.enter_async_context(aconn))
        elif kind in ("DSN", "DSN-async"):
            saver = DeterministicSaver(
                dsn,
                prepare_threshold=threshold,
                pool_max_size=4,
                connect_kwargs={"row_factory": ROWS[rows]},
            )
            if kind == "DSN":
                yield stack.enter_context(saver)
            else:
                yield await stack.enter_async_context(saver)
        else:
            saver = DeterministicSaver.from_conn_string(
                dsn, prepare_threshold=threshold, connect_kwargs={"row_factory": ROWS[rows]}
            )
            if kind == "from_conn_string":
                yield stack.enter_context(saver)
            else:
                yield await stack.enter_async_context(saver)


async def _scenario(kind: str, dsn: str, rows: str, threshold: int | None, thread: str) -> None:
    async with open_saver(kind, dsn, rows, threshold) as saver:
        if kind in SYNC_KINDS:
            run_sync(saver, thread)
        else:
            await run_async(saver, thread)


@pytest.mark.parametrize("threshold", list(THRESHOLDS))
@pytest.mark.parametrize("rows", list(ROWS))
@pytest.mark.parametrize("kind", SYNC_KINDS + ASYNC_KINDS)
async def test_direct(db: str, kind: str, rows: str, threshold: str) -> None:
    await _scenario(kind, db, rows, THRESHOLDS[threshold], f"direct-{kind}-{rows}-{threshold}")


@pytest.mark.parametrize("rows", list(ROWS))
@pytest.mark.parametrize("kind", SYNC_KINDS + ASYNC_KINDS)
async def test_through_pgbouncer(db: str, pgbouncer: PgBouncer, kind: str, rows: str) -> None:
    await _scenario(kind, pgbouncer.dsn_for(db), rows, None, f"bouncer-{kind}-{rows}")
