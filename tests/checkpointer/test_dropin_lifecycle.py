"""Constructors and lifecycle of a saver that owns its pools (built from a DSN): the
options LangGraph users pass, closing every pool it created (also when the user never
closes it), refusing use once closed, and connection failures reported with the server's
own reason instead of a pool timeout."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from psycopg import AsyncConnection, Connection
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool
from tests.conftest import make_database
from tests.pgbouncer import _free_port

from devtools.postgres import database_name, drop_database
from langgraph_deterministic import (
    ConfigurationError,
    DatabaseAccessError,
    DatabaseUnavailableError,
    DeterministicSaver,
    SaverClosedError,
    is_retryable,
    run_config,
)
from langgraph_deterministic.checkpointer.saver import SyncCallOnLoopError

from .dropin import run_async, run_sync
from .graphs import build_graph, first_input

EMPTY = {"configurable": {"thread_id": "nobody"}}



def _backends(db: str, app: str) -> int:
    """Server sessions open under ``application_name`` ``app``."""
    with Connection.connect(db, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)
        ).fetchone()
    return int(row[0]) if row else -1


def _all_closed(db: str, app: str) -> bool:
    """Whether every session under ``app`` is gone. A server session outlives its client's
    close by a moment (the backend exits after it reads the Terminate), so poll briefly."""
    deadline = time.monotonic() + 10
    while (n := _backends(db, app)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return n == 0


def _named(db: str, **options: Any) -> tuple[DeterministicSaver, str]:
    app = f"lgd-{uuid.uuid4().hex[:10]}"
    return DeterministicSaver(db, connect_kwargs={"application_name": app}, **options), app


# -- a pool it was given -----------------------------------------------------------------


async def test_a_given_pools_usage_stats_count_the_savers_checkouts(pg_server_dsn: str) -> None:
    """The saver checks connections out with getconn/putconn (cheaper than connection()):
    the pool's get_stats()["usage_ms"] still counts them, as connection() would. setup()
    of an empty database is one checkout of many milliseconds (every migration)."""
    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    for kind in ("sync", "async"):
        fresh = make_database(pg_server_dsn, prefix="lgd_usage")
        try:
            if kind == "sync":
                with ConnectionPool(fresh, min_size=1, max_size=2, kwargs=kwargs) as pool:
                    t0 = time.monotonic()
                    await asyncio.to_thread(DeterministicSaver(pool).setup)
                    took = time.monotonic() - t0
                    used = pool.get_stats().get("usage_ms", 0)
            else:
                async with AsyncConnectionPool(
                    fresh, min_size=1, max_size=2, kwargs=kwargs
                ) as apool:
                    t0 = time.monotonic()
                    await DeterministicSaver(apool).asetup()
                    took = time.monotonic() - t0
                    used = apool.get_stats().get("usage_ms", 0)
        finally:
            drop_database(pg_server_dsn, database_name(fresh))
        assert 0 < used <= took * 1000 + 1, (kind, used, took)


# -- constructors ----------------------------------------------------------------------


def test_from_conn_string_with_options(db: str) -> None:
    serde = JsonPlusSerializer()
    app = f"lgd-{uuid.uuid4().hex[:10]}"
    with DeterministicSaver.from_conn_string(
        db,
        pipeline=True,  # the peer's keyword: accepted, we always pipeline
        serde=serde,
        pool_min_size=2,
        pool_max_size=3,
        prepare_threshold=None,
        connect_kwargs={"application_name": app, "row_factory": dict_row},
        multitask_strategy="enqueue",  # and the constructor's own options
        lease_ttl=12.0,
        enqueue_timeout=7.0,
        buffer_writes=0,
    ) as saver:
        assert saver.serde is serde
        assert (saver.multitask_strategy, saver.lease_ttl, saver.enqueue_timeout) == (
            "enqueue", 12.0, 7.0)  # fmt: skip
        assert saver._writes is None  # buffer_writes=0: every put_writes commits at once
        run_sync(saver, "fcs-options")
        assert 1 <= _backends(db, app) <= 3  # the pool's connections carry the keyword
    assert _all_closed(db, app)


async def test_from_conn_string_async_with(db: str) -> None:
    async with DeterministicSaver.from_conn_string(db, run_id_policy="require") as saver:
        await run_async(saver, "fcs-async")


def test_pool_options_need_a_dsn(db: str) -> None:
    with ConnectionPool(db, kwargs={"autocommit": True}, open=False) as pool:
        with pytest.raises(ConfigurationError, match="prepare_threshold"):
            DeterministicSaver(pool, prepare_threshold=None)
        with pytest.raises(ConfigurationError, match="pool_max_size"):
            DeterministicSaver(pool, pool_max_size=3)


@pytest.mark.parametrize(
    "options",
    [
        {"connect_kwargs": {"autocommit": False}},
        {"pool_min_size": 5, "pool_max_size": 2},
        {"prepare_threshold": 0, "connect_kwargs": {"prepare_threshold": None}},
    ],
)
def test_bad_pool_options_are_refused(db: str, options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        DeterministicSaver(db, **options)


@asynccontextmanager
async def _saver_over(source: str, dsn: str) -> AsyncIterator[DeterministicSaver]:
    """A saver over each connection form users pass, opened inside a coroutine."""
    if source == "dsn":
        async with DeterministicSaver(dsn) as saver:
            yield saver
    elif source == "connection":
        with Connection.connect(dsn, autocommit=True) as conn:
            yield DeterministicSaver(conn)
    elif source == "pool":
        with ConnectionPool(dsn, kwargs={"autocommit": True}) as pool:
            yield DeterministicSaver(pool)
    elif source == "async connection":
        async with await AsyncConnection.connect(dsn, autocommit=True) as aconn:
            yield DeterministicSaver(aconn)
    else:
        async with AsyncConnectionPool(dsn, kwargs={"autocommit": True}) as apool:
            yield DeterministicSaver(apool)


@pytest.mark.parametrize("source", ["dsn", "connection", "pool"])
async def test_sync_setup_on_the_event_loop_runs_awaited_or_not(
    pg_server_dsn: str, source: str
) -> None:
    """AsyncPostgresSaver's users write `await saver.setup()`, PostgresSaver's users call
    `saver.setup()` (also from a coroutine): over a connection with a sync side, both work."""
    from devtools.postgres import create_database, database_name, drop_database

    fresh = create_database(pg_server_dsn, prefix="lgd_awaited_setup")
    try:
        async with _saver_over(source, fresh) as saver:
            applied = await saver.setup()  # type: ignore[misc]
            assert applied
            assert len(saver.applied_migrations()) == len(applied)
            assert saver.setup() == []  # a plain call from a coroutine: nothing left to do
            assert await saver.asetup() == []
    finally:
        drop_database(pg_server_dsn, database_name(fresh))


@pytest.mark.parametrize("source", ["async connection", "async pool"])
async def test_sync_setup_of_an_async_saver_on_its_loop_is_refused_before_anything_runs(
    pg_server_dsn: str, source: str
) -> None:
    from devtools.postgres import create_database, database_name, drop_database

    fresh = create_database(pg_server_dsn, prefix="lgd_awaited_setup")
    try:
        async with _saver_over(source, fresh) as saver:
            with pytest.raises(SyncCallOnLoopError, match=r"await saver\.asetup\(\)"):
                await saver.setup()  # type: ignore[misc]
            with pytest.raises(SyncCallOnLoopError, match=r"await saver\.asetup\(\)"):
                saver.setup()
            assert await saver.aapplied_migrations() == set()  # nothing ran
            # From another thread while the loop runs, the sync method works.
            assert await asyncio.to_thread(saver.setup)
            assert await saver.asetup() == []
    finally:
        drop_database(pg_server_dsn, database_name(fresh))


# -- closing ---------------------------------------------------------------------------


def test_close_closes_both_pools_and_refuses_later_use(db: str) -> None:
    saver, app = _named(db)
    saver.get_tuple(EMPTY)  # the sync pool

    async def use_async() -> None:
        await saver.aget_tuple(EMPTY)  # the async pool, on this loop

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(use_async(), loop).result()
        assert _backends(db, app) >= 2
        saver.close()  # from another thread than the async pool's loop
        assert _all_closed(db, app)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
    with pytest.raises(SaverClosedError):
        saver.get_tuple(EMPTY)
    with pytest.raises(SaverClosedError), saver:
        pass


async def test_aclose_closes_both_pools(db: str) -> None:
    saver, app = _named(db)
    await asyncio.to_thread(saver.get_tuple, EMPTY)
    await saver.aget_tuple(EMPTY)
    assert _backends(db, app) >= 2
    await saver.aclose()
    assert _all_closed(db, app)
    with pytest.raises(SaverClosedError):
        await saver.aget_tuple(EMPTY)
    with pytest.raises(SaverClosedError):
        [t async for t in saver.alist(EMPTY)]


def test_async_with_block_closes_its_pools(db: str) -> None:
    saver, app = _named(db)

    async def main() -> None:
        async with saver:
            graph = build_graph().compile(checkpointer=saver)
            await graph.ainvoke(first_input(), run_config("async-with", "r1"))
            await asyncio.to_thread(saver.get_tuple, EMPTY)

    asyncio.run(main())
    assert _all_closed(db, app)
    with pytest.raises(SaverClosedError):
        saver.get_tuple(EMPTY)


def test_never_closed_async_pool_closes_with_its_loop(db: str) -> None:
    """The README's adoption pattern without `with`: asyncio.run() ends, and the async pool
    the saver created ends with its loop (no workers left, no connections); a later loop
    gets a new one; close() afterwards is harmless."""
    saver, app = _named(db, run_id_policy="warn")

    async def main(run: str) -> None:
        graph = build_graph().compile(checkpointer=saver)
        await graph.ainvoke(first_input(), run_config(f"unclosed-{run}", run))

    asyncio.run(main("a"))
    assert _all_closed(db, app)
    asyncio.run(main("b"))  # a new loop: a new pool
    assert _all_closed(db, app)
    saver.close()


def test_close_from_inside_the_async_pools_loop_names_aclose(db: str) -> None:
    saver, app = _named(db)

    async def main() -> None:
        await saver.aget_tuple(EMPTY)
        with pytest.raises(ConfigurationError, match=r"await saver\.aclose\(\)"):
            saver.close()
        await saver.aclose()

    asyncio.run(main())
    assert _all_closed(db, app)


def test_close_leaves_a_pool_it_was_given_open(db: str) -> None:
    with ConnectionPool(db, min_size=1, kwargs={"autocommit": True}) as pool:
        with DeterministicSaver(pool) as saver:
            saver.get_tuple(EMPTY)
        assert not pool.closed
        with pytest.raises(SaverClosedError):
            saver.get_tuple(EMPTY)
        with pool.connection() as conn:
            conn.execute("SELECT 1")


# -- connection failures without `with` ------------------------------------------------


def _unreachable() -> str:
    return f"postgresql://postgres@127.0.0.1:{_free_port()}/postgres?connect_timeout=3"


def test_unreachable_server_is_reported_at_first_use(db: str) -> None:
    saver = DeterministicSaver(_unreachable())
    with pytest.raises(DatabaseUnavailableError, match=r"[Cc]onnection refused"):
        saver.get_tuple(EMPTY)
    saver.close()


async def test_unreachable_server_is_reported_at_first_async_use(db: str) -> None:
    saver = DeterministicSaver(_unreachable())
    with pytest.raises(DatabaseUnavailableError, match=r"[Cc]onnection refused"):
        await saver.aget_tuple(EMPTY)
    await saver.aclose()


def test_wrong_database_is_reported_with_the_servers_reason(db: str) -> None:
    wrong = psycopg.conninfo.make_conninfo(db, dbname="lgd_no_such_database")
    saver = DeterministicSaver(wrong)
    with pytest.raises(DatabaseAccessError, match='database "lgd_no_such_database"') as caught:
        saver.setup()
    assert not is_retryable(caught.value)
    saver.close()
