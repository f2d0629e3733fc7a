"""Whatever row factory the user's connections or pools were opened with, the saver reads
its own rows as tuples: LangGraph documents ``row_factory=dict_row``; ``namedtuple_row``,
``class_row`` and the default must work the same. And a pool or connection that is not in
autocommit mode is refused up front, naming the fix."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection, Connection
from psycopg.rows import class_row, dict_row, namedtuple_row, tuple_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_deterministic import ConfigurationError, DeterministicSaver

from .dropin import run_async, run_sync


class AnyRow:
    """A class_row target accepting any columns (the user's own queries decide them)."""

    def __init__(self, **columns: Any) -> None:
        self.columns = columns


FACTORIES: dict[str, Callable[..., Any]] = {
    "default": tuple_row,
    "dict_row": dict_row,
    "namedtuple_row": namedtuple_row,
    "class_row": class_row(AnyRow),
}


def _kwargs(factory: str) -> dict[str, Any]:
    return {"autocommit": True, "prepare_threshold": 0, "row_factory": FACTORIES[factory]}


@pytest.mark.parametrize("factory", list(FACTORIES))
def test_sync_connection(dsn: str, factory: str) -> None:
    with Connection.connect(dsn, **_kwargs(factory)) as conn:
        run_sync(DeterministicSaver(conn), f"conn-{factory}")


@pytest.mark.parametrize("factory", list(FACTORIES))
def test_sync_pool(dsn: str, factory: str) -> None:
    with ConnectionPool(dsn, min_size=1, max_size=2, kwargs=_kwargs(factory)) as pool:
        run_sync(DeterministicSaver(pool), f"pool-{factory}")


@pytest.mark.parametrize("factory", list(FACTORIES))
async def test_async_connection(dsn: str, factory: str) -> None:
    async with await AsyncConnection.connect(dsn, **_kwargs(factory)) as conn:
        await run_async(DeterministicSaver(conn), f"aconn-{factory}")


@pytest.mark.parametrize("factory", list(FACTORIES))
async def test_async_pool(dsn: str, factory: str) -> None:
    async with AsyncConnectionPool(dsn, min_size=1, max_size=2, kwargs=_kwargs(factory)) as pool:
        await run_async(DeterministicSaver(pool), f"apool-{factory}")


# -- autocommit ------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [None, {}, {"autocommit": False, "row_factory": dict_row}])
def test_pool_without_autocommit_is_refused_up_front(dsn: str, kwargs: Any) -> None:
    pool: ConnectionPool[Any] = ConnectionPool(dsn, kwargs=kwargs, open=False)
    with pytest.raises(ConfigurationError, match=r'kwargs=\{"autocommit": True'):
        DeterministicSaver(pool)
    apool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, kwargs=kwargs, open=False)
    with pytest.raises(ConfigurationError, match=r'kwargs=\{"autocommit": True'):
        DeterministicSaver(apool)


def test_connection_without_autocommit_is_refused(dsn: str) -> None:
    with (
        Connection.connect(dsn) as conn,
        pytest.raises(ConfigurationError, match=r"autocommit=True"),
    ):
        DeterministicSaver(conn)


def test_pool_configured_by_a_callback_is_checked_per_connection(dsn: str) -> None:
    """kwargs cannot tell when a configure callback sets autocommit: the connections the
    pool hands out are checked instead (a local attribute, no round trip)."""

    def set_autocommit(conn: psycopg.Connection[Any]) -> None:
        conn.autocommit = True

    with ConnectionPool(dsn, min_size=1, max_size=1, configure=set_autocommit) as pool:
        saver = DeterministicSaver(pool)
        saver.setup()
        assert saver.get_tuple({"configurable": {"thread_id": "none"}}) is None

    def forgets(conn: psycopg.Connection[Any]) -> None:
        conn.read_only = False

    with ConnectionPool(dsn, min_size=1, max_size=1, configure=forgets) as pool:
        saver = DeterministicSaver(pool)
        with pytest.raises(ConfigurationError, match="configure"):
            saver.get_tuple({"configurable": {"thread_id": "none"}})
        # Nothing was left behind on the connection: it is idle, not in a transaction.
        with pool.connection() as conn:
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
