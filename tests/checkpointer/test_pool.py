"""langgraph_deterministic.pool: psycopg_pool's pools, most recently returned connection
first, against real Postgres; and DeterministicSaver(dsn) builds its pools with them."""

from __future__ import annotations

import psycopg_pool

from langgraph_deterministic import DeterministicSaver
from langgraph_deterministic.pool import AsyncConnectionPool, ConnectionPool


def _pid(conn: object) -> int:
    return conn.info.backend_pid  # type: ignore[attr-defined,no-any-return]


def test_the_most_recently_returned_connection_is_handed_out_first(dsn: str) -> None:
    for cls, newest_first in ((ConnectionPool, True), (psycopg_pool.ConnectionPool, False)):
        with cls(dsn, min_size=3, max_size=3, open=False) as pool:
            pool.wait()
            held = [pool.getconn() for _ in range(3)]
            for conn in held:  # returned in order: held[2] is the most recent
                pool.putconn(conn)
            again = pool.getconn()
            assert again is (held[2] if newest_first else held[0]), cls
            pool.putconn(again)
            # One call at a time: ours stays on one backend, psycopg_pool's visits all.
            pids = set()
            for _ in range(6):
                with pool.connection() as conn:
                    pids.add(_pid(conn))
            assert len(pids) == (1 if newest_first else 3), (cls, pids)


async def test_the_async_pool_hands_out_its_most_recently_returned_connection(dsn: str) -> None:
    for cls, newest_first in (
        (AsyncConnectionPool, True),
        (psycopg_pool.AsyncConnectionPool, False),
    ):
        async with cls(dsn, min_size=3, max_size=3, open=False) as pool:
            await pool.wait()
            held = [await pool.getconn() for _ in range(3)]
            for conn in held:
                await pool.putconn(conn)
            again = await pool.getconn()
            assert again is (held[2] if newest_first else held[0]), cls
            await pool.putconn(again)
            pids = set()
            for _ in range(6):
                async with pool.connection() as conn:
                    pids.add(_pid(conn))
            assert len(pids) == (1 if newest_first else 3), (cls, pids)


def test_a_saver_given_a_dsn_builds_its_pools_newest_first(dsn: str) -> None:
    with DeterministicSaver(dsn, pool_min_size=2) as saver:
        assert isinstance(saver._sync_pool(), ConnectionPool)


async def test_a_saver_given_a_dsn_builds_its_async_pool_newest_first(dsn: str) -> None:
    async with DeterministicSaver(dsn, pool_min_size=2) as saver:
        assert isinstance(await saver._async_pool(), AsyncConnectionPool)
