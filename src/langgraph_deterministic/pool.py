"""psycopg_pool's pools, handing out the most recently returned connection first.

psycopg_pool hands out the connection that has been idle longest: even one graph run at
a time then visits every connection of the pool in turn, and each call finds its Postgres
backend's (and its psycopg connection's) caches cold. Handing out the most recently
returned one instead keeps a quiet workload on a few warm connections; under load every
connection is busy either way, and the ones left idle are the ones psycopg_pool's
``max_idle`` closes. PgBouncer reuses its server connections in this order by default.

Measured (``benchmarks/bench_graph.py --pool-order newest``), one graph run at a time
over a pool of 10: the server's CPU per run fell by 5-35% for DeterministicSaver and for
langgraph's PostgresSaver alike; wall time per run moved within the benchmark's noise in
one benchmark and fell 24% (ours) and 5% (the peer) in another.

``DeterministicSaver(dsn)`` builds its own pools with these classes. For a pool of your
own, use them in place of psycopg_pool's: same constructor, same behaviour otherwise::

    from langgraph_deterministic.pool import AsyncConnectionPool
    pool = AsyncConnectionPool(dsn, max_size=10, kwargs={"autocommit": True, ...})

The order is psycopg_pool's internal state (its deque of idle connections, taken from the
left): if a release of psycopg_pool changes that, these classes hand out connections in
psycopg_pool's own order, which is correct, only slower.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import psycopg_pool
from psycopg_pool.abc import ACT, CT

__all__ = ["AsyncConnectionPool", "ConnectionPool"]


def _newest_first(pool: Any) -> None:
    """Put the most recently returned idle connection where psycopg_pool takes from."""
    idle = getattr(pool, "_pool", None)
    if isinstance(idle, deque) and len(idle) > 1:
        idle.rotate(1)  # returned ones are appended on the right, taken from the left


class ConnectionPool(psycopg_pool.ConnectionPool[CT]):
    """psycopg_pool.ConnectionPool, handing out its most recently returned connection."""

    def _get_ready_connection(self, timeout: float | None) -> CT | None:
        _newest_first(self)  # under the pool's lock, as the take itself
        return super()._get_ready_connection(timeout)


class AsyncConnectionPool(psycopg_pool.AsyncConnectionPool[ACT]):
    """psycopg_pool.AsyncConnectionPool, handing out its most recently returned
    connection."""

    async def _get_ready_connection(self, timeout: float | None) -> ACT | None:
        _newest_first(self)
        return await super()._get_ready_connection(timeout)
