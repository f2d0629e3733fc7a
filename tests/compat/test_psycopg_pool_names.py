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
