"""The psycopg_pool private names ``_compat.psycopg_pool`` uses are where it reads them."""

from __future__ import annotations

import time

from psycopg_pool import ConnectionPool

from langgraph_deterministic._compat import psycopg_pool as compat


def test_the_usage_counter_is_the_one_get_stats_reports() -> None:
    assert compat.USAGE_MS == "usage_ms"
    pool = ConnectionPool("dbname=unused", open=False)
    compat.count_usage(pool, time.monotonic() - 0.25)
    assert 250 <= pool.get_stats()["usage_ms"] < 1250


def test_the_checkout_hook_and_the_idle_deque_are_where_the_newest_first_pools_read_them() -> (
    None
):
    import collections
    import inspect

    import psycopg_pool

    for cls in (psycopg_pool.ConnectionPool, psycopg_pool.AsyncConnectionPool):
        hook = cls.__dict__.get("_get_ready_connection")
        assert hook is not None, cls
        assert list(inspect.signature(hook).parameters) == ["self", "timeout"], cls
        # a checkout still takes its idle connection through it
        assert "self._get_ready_connection(" in inspect.getsource(cls), cls
    pool = ConnectionPool("dbname=unused", open=False)
    assert isinstance(pool._pool, collections.deque)
